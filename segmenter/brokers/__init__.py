"""Segments through a message broker: AMQP 1.0 (Qpid Proton) and STOMP (our own client), one interface.

Each segment travels as its own broker message whose body is the encoded segment, header and
data exactly as :meth:`Segment.encode` gives them: the body is self-describing and verified by
its own checksums, so nothing the broker adds or drops can corrupt a message unnoticed, and a
drain can land bodies in the Parquet table ``reassemble run`` reads without decoding them.
Broker fields carry only what the broker itself must act on:

* **group**: AMQP ``properties.group-id`` / STOMP ``JMSXGroupID`` = the segment's GroupId in hex.
  Every segment of a message, and every message of an MQ group, shares it, so ActiveMQ's message
  groups route the whole unit to one consumer at a time (and move it if that consumer dies).
* **no sequence**: AMQP ``group-sequence`` / STOMP ``JMSXGroupSeq`` is deliberately left unset.
  ActiveMQ gives it a meaning: a message with sequence 1 *reassigns* its group to whichever
  consumer it is dispatched to, and a negative one closes the group. Mapping MsgSeqNumber there
  would spread every unsegmented-group message's segments (all MsgSeqNumber 1) over all
  consumers; mapping the segment's send order (1, 2, ...) splits a group after a consumer dies
  (measured): its redelivered first segment (sequence 1) goes to one survivor, which becomes the
  owner, while new segments have already been given to another. Without a sequence the group is
  assigned once, to the consumer that receives its first message, and after that consumer dies,
  to the one that receives the group's next message (redelivered or new), which then gets all the
  rest. The body carries MsgSeqNumber and Offset; order within a group does not matter to the
  assembler.
* **durable** (AMQP ``header.durable`` / STOMP ``persistent:true``): ActiveMQ's dead-letter strategy
  ignores non-persistent messages, so a rejected segment would otherwise vanish.

The modules: :mod:`.base` (:class:`Sender`, :class:`Consumer`, :class:`Delivery`, :func:`body_view`,
the size limits), :mod:`.connect` (:func:`open_sender`, :func:`open_consumer`: a URL to its
transport), :mod:`.amqp` (python-qpid-proton, imported only when an ``amqp://`` URL is opened:
``pip install segment-reassembly[broker]``, so importing this package never needs it), :mod:`.stomp` (the
standard library only) over :mod:`.stomp_client` (a sans-I/O STOMP 1.2 frame parser and one
connection), :mod:`.recycle` (the pool of reused receive buffers STOMP bodies land in), and
:mod:`.kafka` (:class:`KafkaSegmentProducer`: payloads segmented into the records of a Kafka topic,
one key per message, through confluent-kafka, imported only when a producer is created:
``pip install segment-reassembly[kafka]``) with :mod:`.kafka_record` (a record's key, headers and
size) and :mod:`.kafka_send` (:class:`KafkaSend`, a sent message's deliveries).
This package is the transport only (connect, send with broker confirmation, fetch and settle
deliveries); what a receiver does with a delivery is :mod:`reassembly.brokers.receiver`.
"""

from .amqp import AMQP_FRAME_SIZE
from .base import ENVELOPE_RESERVE, BrokerError, Consumer, Delivery, Sender, body_view, segment_size_for
from .connect import open_consumer, open_sender
from .kafka import (
    DEFAULT_MAX_RECORD_BYTES,
    DeliveredSegment,
    FailedSegment,
    KafkaSegmentProducer,
    KafkaSend,
    group_id_for,
    kafka_segment_size_for,
)

__all__ = [
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
]
