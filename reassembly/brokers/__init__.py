"""Segments from a message broker or Kafka: the receivers that feed an assembler, and the drain to a landing table.

``receiver`` holds :class:`BrokerReceiver` (deliveries in, settled once their message or group
is decided); ``kafka`` holds :class:`KafkaReassembler` (records in, only safe offsets committed)
and ``kafka_source`` :class:`KafkaSource` (the drain's Kafka consumer; confluent-kafka imported
when one is created); ``drain`` lands a queue's or a topic's segments as Parquet files for the Spark job;
``share`` (:class:`ShareGroupReceiver`, Kafka share groups) and ``competing`` (:class:`CompetingReceiver`,
a queue without message groups) feed a shared segment store (:mod:`reassembly.segstore`) when the
segments of one message reach different processes.
"""

from reassembly.brokers.competing import CompetingReceiver
from reassembly.brokers.drain import BROKER_LANDING, KAFKA_LANDING, Drain, DrainStats, Landing, Rolling, remove_orphans
from reassembly.brokers.kafka import CommitFailed, KafkaReassembler, KafkaSource, KafkaStats, Replay
from reassembly.brokers.receiver import BrokerReceiver, ReceiverStats
from reassembly.brokers.share import ShareGroupReceiver

__all__ = [
    "BROKER_LANDING",
    "KAFKA_LANDING",
    "BrokerReceiver",
    "CommitFailed",
    "CompetingReceiver",
    "Drain",
    "DrainStats",
    "KafkaReassembler",
    "KafkaSource",
    "KafkaStats",
    "Landing",
    "ReceiverStats",
    "Replay",
    "Rolling",
    "ShareGroupReceiver",
    "remove_orphans",
]
