"""The broker package (segmenter/brokers/) without its optional extra: python-qpid-proton is the
``segmenter[broker]`` extra and only an ``amqp://`` URL needs it, so the package imports, and
speaks STOMP, where it is not installed. Run in a fresh interpreter in which ``import proton`` fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import segmenter.brokers

ROOT = Path(__file__).resolve().parents[2]
WITHOUT_PROTON = "import sys\nsys.modules['proton'] = None  # `import proton` now raises ImportError\n"


def test_the_package_imports_without_proton() -> None:
    code = WITHOUT_PROTON + (
        "import segmenter.brokers\n"
        "from segmenter.brokers import amqp, base, connect, recycle, stomp, stomp_client\n"
        "assert not [m for m, mod in sys.modules.items() if m.startswith('proton') and mod is not None]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_an_amqp_url_without_proton_says_what_is_missing() -> None:
    code = WITHOUT_PROTON + (
        "from segmenter.brokers import open_consumer\n"
        "try:\n"
        "    open_consumer('amqp://127.0.0.1:1', 'q')\n"
        "except ImportError as exc:\n"
        "    assert 'proton' in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('opened an AMQP consumer without proton')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_package_offers_the_names_its_callers_import() -> None:
    assert set(segmenter.brokers.__all__) == {
        "AMQP_FRAME_SIZE",
        "DEFAULT_MAX_RECORD_BYTES",
        "ENVELOPE_RESERVE",
        "BrokerError",
        "Consumer",
        "DeliveredSegment",
        "Delivery",
        "FailedSegment",
        "KafkaSegmentProducer",
        "KafkaSend",
        "Sender",
        "body_view",
        "group_id_for",
        "kafka_segment_size_for",
        "open_consumer",
        "open_sender",
        "segment_size_for",
    }
    assert all(hasattr(segmenter.brokers, name) for name in segmenter.brokers.__all__)
