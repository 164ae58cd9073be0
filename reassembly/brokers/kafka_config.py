"""What both Kafka consumers give librdkafka: the brokers of a ``kafka://`` URL, and the settings
with automatic commits off.

The reassembling loop (:mod:`reassembly.brokers.kafka`) and the drain's source
(:mod:`reassembly.brokers.kafka_source`) commit offsets themselves, each by its own rule; the
settings that make that so, and the ``(topic, partition)`` key both use, are written here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from segmenter.brokers import BrokerError
from segmenter.errors import Reason, SegmentationError

TP = tuple[str, int]  # (topic, partition): the assembler's partition key


def bootstrap_servers(url: str) -> str:
    """``kafka://HOST:PORT[,HOST:PORT...]`` to librdkafka's ``bootstrap.servers``.

    ``url``: the ``kafka://`` URL.
    """
    parts = urlsplit(url)
    hosts = [h.strip() for h in parts.netloc.split(",")]
    if parts.scheme != "kafka" or not hosts or not all(h.rpartition(":")[2].isdigit() for h in hosts):
        raise BrokerError(f"not a Kafka URL (kafka://HOST:PORT[,HOST:PORT]): {url!r}", url=url)
    if parts.path not in ("", "/") or parts.query:
        raise BrokerError(f"a Kafka URL names only brokers (kafka://HOST:PORT[,HOST:PORT]): {url!r}", url=url)
    return ",".join(hosts)


def _consumer_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The user's librdkafka settings with automatic commits off (refused if asked for): an automatic
    commit is the position of the last record *read*, past every message still incomplete."""
    conf = dict(config)
    for key in ("enable.auto.commit", "enable.auto.offset.store"):
        if str(conf.get(key, "false")).lower() in ("true", "1"):
            raise SegmentationError(
                f"{key}=true would commit offsets past incomplete messages: the loop commits safe offsets itself",
                reason=Reason.ARGUMENT_ERROR,
            )
    conf["enable.auto.commit"] = False
    conf["enable.auto.offset.store"] = False
    conf.setdefault("auto.offset.reset", "earliest")
    return conf
