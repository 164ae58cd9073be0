"""KafkaSegmentProducer (segmenter/brokers/kafka.py) against librdkafka's mock cluster.

One 3-broker mock cluster for the module (tests/support/kafka_cluster.py), a topic per test.
Records are read back with a plain confluent-kafka Consumer (assigned, no group) and decoded with
the wire decoder; the reassembly is the in-process Assembler's.
"""

from __future__ import annotations

import io
import logging
import os
import random
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly import Assembler, Duplicate, GroupComplete, MessageComplete
from segmenter import Codec, Reason, SegmentationError, Segmenter, decode_segment
from segmenter.brokers import (
    DEFAULT_MAX_RECORD_BYTES,
    BrokerError,
    KafkaSegmentProducer,
    group_id_for,
    kafka_segment_size_for,
)
from segmenter.brokers.kafka import HEADER_OVERHEAD, RECORD_BATCH_OVERHEAD, RECORD_OVERHEAD
from segmenter.digest import DigestPolicy
from tests.support.kafka_cluster import MockCluster, available, kafka_cluster_fixture, mock_cluster  # noqa: F401

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))
ROOT = Path(__file__).resolve().parents[2]
LIMIT = 256 * 1024  # the topics' record limit in these tests: a 5 MB payload is 20 segments


def _topic(cluster: MockCluster, request: pytest.FixtureRequest, partitions: int = 3) -> str:
    name = "t." + "".join(c if c.isalnum() else "." for c in request.node.name)[:200]
    return cluster.create_topic(name, partitions)


def _producer(cluster: MockCluster, topic: str, **kwargs: Any) -> KafkaSegmentProducer:
    kwargs.setdefault("max_record_bytes", LIMIT)
    return KafkaSegmentProducer(topic, {"bootstrap.servers": cluster.bootstrap, "linger.ms": 2}, **kwargs)


def _read(
    cluster: MockCluster, topics: str | list[str], count: int, timeout: float = 20.0, *, exact: bool = True
) -> list[Any]:
    """``count`` records of ``topics``, every partition from its start (fails if fewer or more arrive)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    names = [topics] if isinstance(topics, str) else topics
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "reader", "fetch.wait.max.ms": 20})
    try:
        metadata = c.list_topics(timeout=10).topics
        c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in names for p in metadata[t].partitions])
        got: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            for m in c.consume(1000, 0.2):
                assert m.error() is None, m.error()
                got.append(m)
        assert len(got) == count, f"{len(got)} records of {count}"
        if exact:
            assert not [m for m in c.consume(1000, 0.2) if m.error() is None], "more records than sent"
        return got
    finally:
        c.close()


def _by_message(records: list[Any]) -> dict[bytes, list[Any]]:
    """Records by key, each list in partition order (key order of arrival within one partition)."""
    out: dict[bytes, list[Any]] = defaultdict(list)
    for m in sorted(records, key=lambda m: (m.partition(), m.offset())):
        out[m.key()].append(m)
    return out


def _reassembled(values: list[bytes]) -> list[bytes]:
    asm = Assembler()
    events = [ev for v in values for ev in asm.receive(v)] + asm.close()
    out: list[bytes] = []
    for ev in events:
        if isinstance(ev, MessageComplete):
            out.append(bytes(ev.payload))
        elif isinstance(ev, GroupComplete):
            out += [bytes(m.payload) for m in ev.messages]
        else:
            assert isinstance(ev, Duplicate), ev
    return out


# ------------------------------------------------------------------ what travels
def test_every_message_arrives_as_its_exact_segments_on_one_partition(
    kafka_cluster: MockCluster, request: pytest.FixtureRequest
) -> None:
    """1 KB .. 5 MB, plain, zstd, SHA-256 digests and an MQ group: every record's value is the
    segment the Segmenter cuts (same bytes), a message's records share the key and one partition
    in order, and they reassemble to the payload."""
    base = _topic(kafka_cluster, request)
    topics: list[str] = []
    rng = random.Random(7)
    sizes = [1_000, 65_537, 1_000_000, 5_000_000]
    sent: list[tuple[Any, Segmenter, list[bytes], bool]] = []
    for options in ({}, {"codec": Codec.ZSTD}, {"digest": DigestPolicy(sha256=True)}):
        for size in [*sizes, 0]:  # a topic per message: a mock partition keeps only its last 5 MiB
            topics.append(kafka_cluster.create_topic(f"{base}.{len(topics)}", 3))
            with _producer(kafka_cluster, topics[-1], **options) as p:
                cut = Segmenter(max_segment_size=p.segment_size(), **options)
                if size:
                    payload = rng.randbytes(size // 2) + bytes(size - size // 2)  # half compressible
                    sent.append((p.send(payload, msg_id=f"{options}-{size}"), cut, [payload], False))
                else:
                    group = [rng.randbytes(n) for n in (10, 300_000, 20)]
                    sent.append((p.send_group(group, msg_id=f"{options}-group"), cut, group, True))
    total = sum(h.segments for h, *_ in sent)
    by_key = _by_message(_read(kafka_cluster, topics, total))
    assert len(by_key) == len(sent)
    for handle, cut, payloads, is_group in sent:
        assert handle.ok and handle.done()
        records = by_key[handle.key]
        assert handle.key == handle.group_id.hex().encode()
        assert len({m.partition() for m in records}) == 1 and handle.partitions == {records[0].partition()}
        assert sorted((r.partition, r.kafka_offset) for r in handle.records) == [
            (m.partition(), m.offset()) for m in records
        ]
        if is_group:
            expected = [s.encode() for s in cut.segment_group(payloads, group_id=handle.group_id)]
        else:
            expected = [s.encode() for s in cut.segment(payloads[0], group_id=handle.group_id)]
        assert [m.value() for m in records] == expected
        assert all(len(m.value()) <= cut.max_segment_size for m in records)
        assert all(decode_segment(m.value()).header.group_id == handle.group_id for m in records)
        assert _reassembled([m.value() for m in records]) == payloads


def test_a_path_a_stream_and_bytes_give_the_same_records(
    kafka_cluster: MockCluster, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    topic = _topic(kafka_cluster, request, partitions=1)
    payload = os.urandom(700_000)
    path = tmp_path / "payload.bin"
    path.write_bytes(payload)
    with _producer(kafka_cluster, topic) as p:
        handles = [p.send(src, msg_id="one id") for src in (payload, path, io.BytesIO(payload))]
        with pytest.raises(SegmentationError, match=r"pathlib\.Path") as err:
            p.send(str(path))  # type: ignore[arg-type]
        assert err.value.reason == Reason.ARGUMENT_ERROR
    assert len({h.group_id for h in handles}) == 1 and handles[0].group_id == group_id_for("one id")
    records = _read(kafka_cluster, topic, sum(h.segments for h in handles))
    n = handles[0].segments
    values = [m.value() for m in records]
    assert values[:n] == values[n : 2 * n] == values[2 * n :]


def test_headers_carry_the_mq_fields_and_every_record_fits_the_limit(
    kafka_cluster: MockCluster, request: pytest.FixtureRequest
) -> None:
    topic = _topic(kafka_cluster, request, partitions=2)
    payload = os.urandom(600_000)
    with _producer(kafka_cluster, topic, headers=True, codec=Codec.ZSTD) as p:
        h = p.send(payload, key="customer-42", headers=[("content-type", "application/pdf")])
    records = _read(kafka_cluster, topic, h.segments)
    for m in records:
        seg = decode_segment(m.value())
        fields = dict(m.headers())
        assert m.key() == b"customer-42"
        assert fields["content-type"] == b"application/pdf"
        assert fields["GroupId"] == seg.header.group_id.hex().encode()
        assert fields["MsgSeqNumber"] == b"1"
        assert fields["Offset"] == str(seg.header.offset).encode()
        assert fields["MsgFlags"] == str(seg.header.msg_flags).encode()
        assert fields["OriginalLength"] == str(len(payload)).encode()
        size = RECORD_BATCH_OVERHEAD + RECORD_OVERHEAD + len(m.key()) + len(m.value())
        size += sum(HEADER_OVERHEAD + len(k) + len(v) for k, v in m.headers())
        assert size <= LIMIT
    assert _reassembled([m.value() for m in records]) == [payload]


def test_a_message_sent_again_after_a_crash_is_delivered_once(
    kafka_cluster: MockCluster, request: pytest.FixtureRequest
) -> None:
    """The first half of a message from a producer that then died, the whole message from its
    restart under the same ``msg_id``: the same segments, so the assembler completes it once and
    counts the first copies as duplicates."""
    topic = _topic(kafka_cluster, request, partitions=1)
    payload = os.urandom(2_000_000)
    with _producer(kafka_cluster, topic) as first:
        cut = Segmenter(max_segment_size=first.segment_size())
        segments = list(cut.segment(payload, group_id=group_id_for("invoice-7")))
        first.send_segments(segments[: len(segments) // 2])
    with _producer(kafka_cluster, topic) as restarted:
        again = restarted.send(payload, msg_id="invoice-7")
    records = _read(kafka_cluster, topic, len(segments) // 2 + again.segments)
    assert {m.key() for m in records} == {group_id_for("invoice-7").hex().encode()}
    assert _reassembled([m.value() for m in records]) == [payload]


# ------------------------------------------------------------------ limits
def test_a_segment_too_big_for_the_topic_is_refused_before_it_is_produced(
    kafka_cluster: MockCluster, request: pytest.FixtureRequest
) -> None:
    topic = _topic(kafka_cluster, request, partitions=1)
    with _producer(kafka_cluster, topic) as p:
        too_big = Segmenter(max_segment_size=p.segment_size() + 1).segment(os.urandom(3 * LIMIT))
        with pytest.raises(SegmentationError) as err:
            p.send_segments(too_big)
        assert err.value.reason == Reason.MSG_TOO_BIG_FOR_CHANNEL
        assert "record limit" in str(err.value) and err.value.details["send"].segments == 0
        fits = Segmenter(max_segment_size=p.segment_size()).segment(os.urandom(3 * LIMIT))
        ok = p.send_segments(fits)
    assert ok.ok and len(_read(kafka_cluster, topic, ok.segments)) == ok.segments  # nothing of the refused one
    with pytest.raises(SegmentationError) as err:
        _producer(kafka_cluster, topic, max_segment_size=LIMIT)
    assert err.value.reason == Reason.MSG_TOO_BIG_FOR_CHANNEL
    with pytest.raises(SegmentationError) as err:
        kafka_segment_size_for(1100)
    assert err.value.reason == Reason.MSG_TOO_BIG_FOR_CHANNEL
    assert kafka_segment_size_for(DEFAULT_MAX_RECORD_BYTES) == 1_048_443


def test_the_limit_falls_back_to_kafkas_default_where_the_cluster_does_not_say(
    kafka_cluster: MockCluster, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """The mock cluster does not answer describe_configs: the default, with a warning."""
    topic = _topic(kafka_cluster, request, partitions=1)
    with caplog.at_level(logging.WARNING, logger="segmenter.brokers.kafka"):
        p = KafkaSegmentProducer(topic, bootstrap_servers=kafka_cluster.bootstrap, describe_timeout=0.5)
    assert (p.max_record_bytes, p.limit_source) == (DEFAULT_MAX_RECORD_BYTES, "default")
    assert "max.message.bytes not readable" in caplog.text and "max_record_bytes" in caplog.text
    assert p.config["batch.size"] == 1_000_000 and p.config["message.max.bytes"] >= DEFAULT_MAX_RECORD_BYTES
    assert p.config["enable.idempotence"] is True


# ------------------------------------------------------------------ failures
def test_a_failed_segment_fails_its_message_by_name(kafka_cluster: MockCluster, request: pytest.FixtureRequest) -> None:
    """The cluster refuses the produce requests (MESSAGE_TOO_LARGE, not retriable: a topic whose
    limit is below the one the producer was given): ``wait`` raises our error naming the message
    and librdkafka's error, once; the producer goes on sending."""
    topic = _topic(kafka_cluster, request, partitions=1)
    with _producer(kafka_cluster, topic) as p:
        p.send(b"warm-up").wait(10)  # connected, producer id assigned
        kafka_cluster.fail_produce(10, count=50)  # MESSAGE_TOO_LARGE
        h = p.send(os.urandom(600_000), msg_id="doomed")
        with pytest.raises(BrokerError) as err:
            h.wait(20)
        text = str(err.value)
        assert group_id_for("doomed").hex() in text and "MSG_SIZE_TOO_LARGE" in text
        assert err.value.reason == Reason.MSG_TOO_BIG_FOR_CHANNEL
        assert err.value.details["group_id"] == h.message_id and h.failed and not h.ok
        kafka_cluster.clear_produce_errors()
        p.flush(10)  # reported once: flush does not raise it again
        after = p.send(b"after")
        after.wait(10)
        assert after.ok


def test_a_stopped_cluster_fails_the_message_at_flush(request: pytest.FixtureRequest) -> None:
    with mock_cluster(1) as cluster:
        topic = cluster.create_topic("t", 1)
        p = KafkaSegmentProducer(
            topic,
            {"bootstrap.servers": cluster.bootstrap, "message.timeout.ms": 1500},
            max_record_bytes=LIMIT,
        )
        p.send(b"x" * 1000).wait(10)
        cluster.stop()
        h = p.send(os.urandom(500_000), msg_id="lost")
    with pytest.raises(BrokerError) as err:
        p.flush(15)
    assert h.message_id in str(err.value) and "MSG_TIMED_OUT" in str(err.value)
    assert len(h.failed) == h.segments > 1


# ------------------------------------------------------------------ configuration
@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"enable.idempotence": False}, "idempotence"),
        ({"enable.idempotence": "false"}, "idempotence"),
        ({"acks": 1}, "acks=all"),
        ({"bootstrap.servers": "a:1"}, "differ"),
    ],
)
def test_a_configuration_without_the_idempotent_producer_is_refused(config: dict[str, Any], words: str) -> None:
    with pytest.raises(SegmentationError, match=words) as err:
        KafkaSegmentProducer("t", config, bootstrap_servers="127.0.0.1:1", max_record_bytes=LIMIT)
    assert err.value.reason == Reason.ARGUMENT_ERROR


def test_without_confluent_kafka_the_package_imports_and_the_producer_says_what_to_install() -> None:
    code = (
        "import sys\nsys.modules['confluent_kafka'] = None\n"
        "import segmenter.brokers\n"
        "from segmenter.brokers import BrokerError, KafkaSegmentProducer\n"
        "from segmenter.errors import Reason\n"
        "try:\n"
        "    KafkaSegmentProducer('t', bootstrap_servers='127.0.0.1:1', max_record_bytes=1 << 20)\n"
        "except BrokerError as exc:\n"
        "    assert 'pip install \"confluent-kafka>=2.4\"' in str(exc), exc\n"
        "    assert exc.reason == Reason.ENVIRONMENT_ERROR, exc.reason\n"
        "else:\n"
        "    raise AssertionError('a producer without confluent-kafka')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ------------------------------------------------------------------ property
@settings(max_examples=8, deadline=None)
@given(
    size=st.integers(0, 300_000),
    limit=st.integers(2_000, 120_000),
    key=st.one_of(st.none(), st.binary(min_size=1, max_size=300)),
    headers=st.booleans(),
    zstd=st.booleans(),
    digest=st.booleans(),
)
def test_every_record_fits_the_limit_and_the_records_reassemble(
    kafka_cluster: MockCluster, size: int, limit: int, key: bytes | None, headers: bool, zstd: bool, digest: bool
) -> None:
    topic = kafka_cluster.create_topic(f"prop-{time.monotonic_ns()}", 1)
    payload = random.Random(size).randbytes(size)
    options: dict[str, Any] = {"codec": Codec.ZSTD} if zstd else {}
    if digest:
        options["digest"] = DigestPolicy(sha256=True)
    with _producer(kafka_cluster, topic, max_record_bytes=limit, headers=headers, **options) as p:
        h = p.send(payload, key=key)
    records = _read(kafka_cluster, topic, h.segments, timeout=10, exact=False)
    for m in records:
        size_on_wire = RECORD_BATCH_OVERHEAD + RECORD_OVERHEAD + len(m.key()) + len(m.value())
        size_on_wire += sum(HEADER_OVERHEAD + len(k) + len(v) for k, v in m.headers() or ())
        assert size_on_wire <= limit
    assert _reassembled([m.value() for m in records]) == [payload]
