"""Segments from a message broker: the receiver that feeds an assembler, and the drain to a landing table.

``receiver`` holds :class:`BrokerReceiver` (deliveries in, settled once their message or group
is decided); ``drain`` lands a queue's segments as Parquet files for the Spark job.
"""

from reassembly.brokers.drain import Drain, DrainStats, Rolling, remove_orphans
from reassembly.brokers.receiver import BrokerReceiver, ReceiverStats

__all__ = ["BrokerReceiver", "Drain", "DrainStats", "ReceiverStats", "Rolling", "remove_orphans"]
