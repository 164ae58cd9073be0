"""Segments through Kafka: :class:`KafkaSegmentProducer` over confluent-kafka's ``Producer`` (librdkafka).

A payload is cut by :class:`segmenter.Segmenter`, the one segmentation rule of the library, into
segments that each fit the topic's record limit, and every segment travels as one Kafka record:

* **value**: the encoded segment, header and data exactly as :meth:`Segment.encode` gives them
  (self-describing and verified by its own checksums, as through the AMQP and STOMP brokers);
* **key**: the same for every segment of a message (by default the message's GroupId in hex, 48
  ASCII bytes; every message of an MQ group shares it), so the default partitioner puts them all
  on one partition and a consumer sees a message's segments in order, from one partition;
* **headers** (``headers=True``, off by default): the MQ fields ``GroupId`` (hex),
  ``MsgSeqNumber``, ``Offset``, ``MsgFlags`` and ``OriginalLength`` (omitted while unknown) as
  ASCII text, for routing and inspection in tools that read headers; the value stays the
  authority and a consumer needs no header.

The client is the idempotent producer (``enable.idempotence=True``, forced; a configuration that
turns it off is refused): librdkafka retries a produce request that timed out or failed
transiently, and only the idempotent producer keeps such a retry from writing a segment twice or
out of order. It cannot remove the duplicates of an application that sends a message again after
a crash: give the message a deterministic id (``msg_id=``/``group_id=``) and send the whole of it
again; the consumer's assembler drops the segments it already has.

A message counts as sent only when the delivery callback of every one of its segments reported
success: :meth:`KafkaSegmentProducer.send` returns a :class:`KafkaSend` whose :meth:`~KafkaSend.wait`
(or the producer's :meth:`~KafkaSegmentProducer.flush`) raises :class:`~segmenter.brokers.BrokerError`
naming the message (GroupId, key) and each failed segment with librdkafka's error.

DeliveredSegment limit: a Kafka broker refuses a record *batch* larger than the topic's
``max.message.bytes`` (default 1,048,588: 1 MiB and the 12-byte log overhead). One segment in a
batch of its own must fit it: :func:`kafka_segment_size_for` subtracts the batch header (61
bytes), the record's framing (36 bytes at most: seven varints and the attributes byte), the key and
the headers, and the rest is the segment's ``max_segment_size``. The client's ``batch.size`` is
capped at the limit so that librdkafka never batches several segments past it, and its
``message.max.bytes`` (a client-side check, default 1,000,000) is raised to the limit when
unset. Producer-side compression (``compression.type``) never makes a batch larger: librdkafka
sends a batch uncompressed when compressing does not shrink it. A segment that does not fit (a
pre-cut one given to :meth:`~KafkaSegmentProducer.send_segments`, or an explicit
``max_segment_size`` too large) is refused here (2218 MSG_TOO_BIG_FOR_CHANNEL) before it is
produced, never left to the broker's MSG_SIZE_TOO_LARGE.

confluent-kafka is the optional extra ``segment-reassembly[kafka]``: it is imported when a
producer is created, never when this module is, so ``import segmenter.brokers`` works without it.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

from ..checksum import DEFAULT_ALGORITHM, ChecksumAlgorithm
from ..digest import NO_POLICY, DigestPolicy
from ..errors import Reason, SegmentationError
from ..flags import Codec, MsgFlags
from ..producer import Payload, Segmenter, _checked_group_id
from ..sources import argument_error
from ..wire import GROUP_ID_LENGTH, UNKNOWN_LENGTH, Segment
from .base import BrokerError

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message, Producer

log = logging.getLogger(__name__)

# A topic's max.message.bytes when neither the caller nor the cluster says otherwise: Kafka's
# default (broker message.max.bytes = 1 MiB + 12, the log overhead of offset and length).
DEFAULT_MAX_RECORD_BYTES = 1_048_588
# DeliveredSegment batch v2 header: base offset 8, length 4, leader epoch 4, magic 1, CRC 4, attributes 2,
# last offset delta 4, first and max timestamps 8 + 8, producer id 8, epoch 2, base sequence 4, count 4.
RECORD_BATCH_OVERHEAD = 61
# One record's framing at its largest: length, timestamp delta (a 64-bit zigzag varint: 10 bytes),
# offset delta, key length, value length and header count as varints (5 bytes each), attributes 1.
RECORD_OVERHEAD = 5 + 1 + 10 + 5 + 5 + 5 + 5
HEADER_OVERHEAD = 10  # per record header: its key length and value length varints
KEY_LENGTH = 2 * GROUP_ID_LENGTH  # the default key: the GroupId in hex
# The MQ fields carried as headers (headers=True) and the longest text each value can be.
MQ_HEADERS = (
    ("GroupId", 2 * GROUP_ID_LENGTH),
    ("MsgSeqNumber", 9),
    ("Offset", 20),
    ("MsgFlags", 10),
    ("OriginalLength", 20),
)
MQ_HEADER_BYTES = sum(HEADER_OVERHEAD + len(name) + size for name, size in MQ_HEADERS)
_MIN_SEGMENT = 1024  # the smallest max_segment_size worth sending (segment_size_for's floor too)
_CLIENT_MAX_MSG_BYTES = 1_000_000  # librdkafka's message.max.bytes and batch.size defaults
_FALSE = {"false", "0", "no", "off"}
_SEGMENT = MsgFlags.SEGMENT.value  # set on every segment but the last of a message
# Delivery reports are served (poll(0)) after every this many records, not after each: a poll that
# finds reports waiting costs a GIL round trip and a queue lock whatever their number, and a
# message's wait() or flush() serves the rest.
_POLL_EVERY = 16

Headers = Sequence[tuple[str, bytes | str]]


def kafka_segment_size_for(max_record_bytes: int, *, key_length: int = KEY_LENGTH, header_bytes: int = 0) -> int:
    """The ``max_segment_size`` (encoded segment, header included) whose record fits ``max_record_bytes``.

    ``max_record_bytes`` is the topic's ``max.message.bytes`` (the largest record batch the broker
    takes); ``key_length`` the record key's length; ``header_bytes`` the record headers' keys and
    values together plus :data:`HEADER_OVERHEAD` each (:data:`MQ_HEADER_BYTES` for ``headers=True``).
    The default topic limit, 1,048,588, gives 1,048,443 with the default key and no headers.
    """
    size = max_record_bytes - RECORD_BATCH_OVERHEAD - RECORD_OVERHEAD - key_length - header_bytes
    if size < _MIN_SEGMENT:
        raise SegmentationError(
            "Kafka record limit too small for segments",
            reason=Reason.MSG_TOO_BIG_FOR_CHANNEL,
            limit=max_record_bytes,
            reserve=max_record_bytes - size,
        )
    return size


class FailedSegment(NamedTuple):
    """A segment whose delivery failed: its place in the message and librdkafka's error."""

    msg_seq_number: int
    offset: int  # the segment's Offset in its message
    code: str  # librdkafka's error name, e.g. MSG_TIMED_OUT, TOPIC_AUTHORIZATION_FAILED
    error: str  # librdkafka's error text


class DeliveredSegment(NamedTuple):
    """Where an acknowledged segment was written."""

    msg_seq_number: int
    offset: int  # the segment's Offset in its message
    partition: int
    kafka_offset: int


class KafkaSend:
    """One message (or MQ group) handed to the producer: done when every segment's delivery is reported.

    ``segments`` counts the records produced; ``records`` (acknowledged, in delivery order) and
    ``failed`` fill in as librdkafka reports deliveries, which happens inside the producer's calls
    (:meth:`KafkaSegmentProducer.poll`, :meth:`wait`, ``flush``).
    """

    def __init__(self, owner: KafkaSegmentProducer, topic: str, key: bytes, group_id: bytes) -> None:
        self._owner = owner
        self.topic = topic
        self.key = key
        self.group_id = group_id
        self.segments = 0
        self.records: list[DeliveredSegment] = []
        self.failed: list[FailedSegment] = []
        self.sealed = False  # every segment produced (no more to come)
        self.reported = False  # its failure was raised once (by wait or flush)

    @property
    def message_id(self) -> str:
        return self.group_id.hex()

    def done(self) -> bool:
        """Every segment produced and its delivery reported (success or failure)."""
        return self.sealed and len(self.records) + len(self.failed) == self.segments

    @property
    def ok(self) -> bool:
        """Done, and every segment acknowledged by the cluster."""
        return self.done() and not self.failed

    @property
    def partitions(self) -> set[int]:
        """The partitions its acknowledged segments were written to: one, unless partitions were added mid-send."""
        return {r.partition for r in self.records}

    def wait(self, timeout: float | None = None) -> None:
        """Serve delivery reports until this message is done; raise :class:`BrokerError` if a segment
        failed, or if it is not done within ``timeout`` seconds (None: librdkafka's own
        ``message.timeout.ms`` bounds it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                waiting = self.segments - len(self.records) - len(self.failed)
                raise BrokerError(
                    f"message {self.message_id} (key {self.key!r}): {waiting} of {self.segments} segments not"
                    f" acknowledged within {timeout} s",
                    group_id=self.message_id,
                    topic=self.topic,
                )
            self._owner.poll(left)
        if self.failed:
            self.reported = True
            raise self.error()

    def error(self) -> BrokerError:
        """The error naming this message and its failed segments (librdkafka's words)."""
        shown = "; ".join(
            f"MsgSeqNumber {f.msg_seq_number} Offset {f.offset}: {f.error} ({f.code})" for f in self.failed[:5]
        )
        more = f"; and {len(self.failed) - 5} more" if len(self.failed) > 5 else ""
        too_big = any(f.code == "MSG_SIZE_TOO_LARGE" for f in self.failed)
        return BrokerError(
            f"message {self.message_id} (key {self.key!r}) not sent to {self.topic}: {len(self.failed)} of"
            f" {self.segments} segments failed: {shown}{more}",
            reason=Reason.MSG_TOO_BIG_FOR_CHANNEL if too_big else Reason.CONNECTION_BROKEN,
            group_id=self.message_id,
            topic=self.topic,
            failed=[f._asdict() for f in self.failed],
        )

    def _delivered(self, seq: int, offset: int, err: KafkaError | None, msg: Message[Any, Any]) -> None:
        if err is None:
            self.records.append(DeliveredSegment(seq, offset, msg.partition() or 0, msg.offset() or 0))
        else:
            self.failed.append(FailedSegment(seq, offset, err.name(), err.str()))
        if self.done():
            self._owner._finished(self)

    def __repr__(self) -> str:
        state = "ok" if self.ok else "failed" if self.done() else "pending"
        return f"KafkaSend({self.message_id}, {self.topic}, {len(self.records)}/{self.segments} acknowledged, {state})"


INSTALL = 'pip install "confluent-kafka>=2.4" (the extra kafka: pip install -e ".[kafka]" in the source)'


def confluent() -> Any:
    """The ``confluent_kafka`` module, or a one-line :class:`BrokerError` (9060 ENVIRONMENT_ERROR) naming
    the extra to install: the producer, the consumer loop and the drain all ask here."""
    try:
        import confluent_kafka
    except ImportError:
        raise BrokerError(
            f"Kafka needs the confluent-kafka client: {INSTALL}", reason=Reason.ENVIRONMENT_ERROR
        ) from None
    return confluent_kafka


def _is_false(value: object) -> bool:
    return value is False or (isinstance(value, (str, int)) and str(value).strip().lower() in _FALSE)


def _checked_config(config: Mapping[str, Any], bootstrap_servers: str | None) -> dict[str, Any]:
    """The client configuration with the idempotent producer on; one that turns it off is refused."""
    conf = dict(config)
    if bootstrap_servers is not None:
        if conf.get("bootstrap.servers", bootstrap_servers) != bootstrap_servers:
            raise argument_error("bootstrap_servers and config['bootstrap.servers'] differ")
        conf["bootstrap.servers"] = bootstrap_servers
    if "enable.idempotence" in conf and _is_false(conf["enable.idempotence"]):
        raise argument_error(
            "enable.idempotence cannot be turned off: without it a produce retry can write a segment twice"
            " or out of order (the producer forces it on)",
            enable_idempotence=repr(conf["enable.idempotence"])[:40],
        )
    acks = conf.get("acks", conf.get("request.required.acks", "all"))
    if str(acks).strip().lower() not in ("all", "-1"):
        raise argument_error(
            f"acks={acks!r}: the idempotent producer needs acks=all (a segment counts as sent once every in-sync"
            " replica has it)",
            acks=repr(acks)[:40],
        )
    conf["enable.idempotence"] = True
    return conf


def _client_int(conf: Mapping[str, Any], name: str) -> int | None:
    if name not in conf:
        return None
    try:
        return int(conf[name])
    except (TypeError, ValueError):
        raise argument_error(f"{name} must be a whole number of bytes, not {conf[name]!r}") from None


def _as_key(key: bytes | str | None, group_id: bytes) -> bytes:
    if key is None:
        return group_id.hex().encode("ascii")
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise argument_error(f"a record key must be bytes or str, not {type(key).__name__}")


def group_id_for(msg_id: bytes | str) -> bytes:
    """The 24-byte GroupId of a caller's message id: the first 24 bytes of its SHA-256 (of the
    UTF-8 text for a ``str``). Deterministic, so a producer restarted after a crash that sends the
    message again under the same id sends the same segments, which the consumer's assembler
    recognises as duplicates."""
    import hashlib

    if isinstance(msg_id, str):
        raw = msg_id.encode("utf-8")
    elif isinstance(msg_id, (bytes, bytearray, memoryview)):
        raw = bytes(msg_id)
    else:
        raise argument_error(f"msg_id must be bytes or str, not {type(msg_id).__name__}")
    if not raw:
        raise argument_error("msg_id must not be empty")
    return hashlib.sha256(raw).digest()[:GROUP_ID_LENGTH]


@dataclass(frozen=True)
class _Limits:
    record: int  # the largest record batch the topic takes (max.message.bytes)
    source: str  # where the figure came from: "given", "topic", "default"


class KafkaSegmentProducer:
    """Segments payloads into records of one topic, with the idempotent producer.

    ``config`` is confluent-kafka's configuration dict (``bootstrap.servers``, security, ``linger.ms``,
    ...); ``bootstrap_servers`` is the short form. ``max_record_bytes`` is the topic's
    ``max.message.bytes``; when it is None the producer asks the cluster (``describe_configs``,
    waiting up to ``describe_timeout`` seconds) and, where the cluster does not answer (no
    DescribeConfigs permission, librdkafka's mock cluster), uses Kafka's default 1,048,588 and logs
    a warning saying so. ``max_segment_size`` (optional) asks for smaller segments than the limit
    allows; one larger than it is refused. ``codec``, ``level``, ``algorithm`` and ``digest`` are
    :class:`~segmenter.Segmenter`'s; ``headers=True`` adds the MQ fields as record headers.
    """

    def __init__(
        self,
        topic: str,
        config: Mapping[str, Any] | None = None,
        *,
        bootstrap_servers: str | None = None,
        max_record_bytes: int | None = None,
        max_segment_size: int | None = None,
        codec: Codec = Codec.NONE,
        level: int = 3,
        algorithm: ChecksumAlgorithm = DEFAULT_ALGORITHM,
        digest: DigestPolicy = NO_POLICY,
        headers: bool = False,
        describe_timeout: float = 10.0,
    ) -> None:
        if not isinstance(topic, str) or not topic:
            raise argument_error(f"topic must be a non-empty str, not {topic!r}"[:120])
        if not isinstance(headers, bool):
            raise argument_error("headers must be True or False")
        ck = confluent()
        conf = _checked_config(config or {}, bootstrap_servers)
        if max_record_bytes is not None and (
            not isinstance(max_record_bytes, int) or isinstance(max_record_bytes, bool) or max_record_bytes <= 0
        ):
            raise argument_error(f"max_record_bytes must be a positive whole number, not {max_record_bytes!r}")
        client_max = _client_int(conf, "message.max.bytes")
        batch_size = _client_int(conf, "batch.size")
        self.topic = topic
        self.headers = headers
        # Checked now, with the largest segment possible; the size is set per message (key, headers).
        self._segmenter = Segmenter(codec=codec, level=level, algorithm=algorithm, digest=digest)
        if max_record_bytes is not None:
            limits = _Limits(max_record_bytes, "given")
        elif (found := self._describe_limit(ck, conf, describe_timeout)) is not None:
            limits = _Limits(found, "topic")
        else:
            limits = _Limits(DEFAULT_MAX_RECORD_BYTES, "default")
        # The client's own size check (message.max.bytes, on key + value + headers + framing) must
        # not be the tighter one unless the caller made it so.
        if client_max is None:
            conf["message.max.bytes"] = max(_CLIENT_MAX_MSG_BYTES, limits.record + 4096)
        record = limits.record if client_max is None else min(limits.record, client_max)
        self.max_record_bytes = record
        self.limit_source = limits.source
        # librdkafka fills a batch up to batch.size: above the topic's limit, a batch of several
        # segments would be refused by the broker though each fits.
        if batch_size is None or batch_size > record:
            if batch_size is not None:
                log.info("batch.size %d capped at the topic's record limit %d", batch_size, record)
            conf["batch.size"] = min(_CLIENT_MAX_MSG_BYTES, record) if batch_size is None else record
        self.config = conf
        self._max_segment_size = max_segment_size
        if max_segment_size is not None:
            if not isinstance(max_segment_size, int) or isinstance(max_segment_size, bool):
                raise argument_error(f"max_segment_size must be a whole number, not {max_segment_size!r}"[:120])
            self._segment_size(KEY_LENGTH, ())  # refuse a size that cannot fit now, not at the first send
        self._kafka_exception: type[Exception] = ck.KafkaException
        self._client: Producer = ck.Producer(conf)
        self._pending: set[KafkaSend] = set()
        self._failed: list[KafkaSend] = []
        self.sent_messages = 0
        self.sent_segments = 0
        self.sent_bytes = 0

    # ---------------------------------------------------------------- limits
    def _describe_limit(self, ck: Any, conf: Mapping[str, Any], timeout: float) -> int | None:
        """The topic's max.message.bytes from the cluster, or None (logged) where it does not answer."""
        from confluent_kafka import admin as kafka_admin

        admin_conf = {
            k: v
            for k, v in conf.items()
            if k == "bootstrap.servers" or k.startswith(("security.", "sasl.", "ssl.", "client.", "socket."))
        }
        try:
            admin = kafka_admin.AdminClient(admin_conf)
            resource = kafka_admin.ConfigResource("topic", self.topic)  # type: ignore[attr-defined]
            futures = admin.describe_configs([resource], request_timeout=timeout)
            entries = futures[resource].result(timeout)
            value = int(entries["max.message.bytes"].value)
        except (ck.KafkaException, KeyError, ValueError, TypeError, concurrent.futures.TimeoutError) as exc:
            log.warning(
                "topic %s: max.message.bytes not readable from the cluster (%s); using Kafka's default %d:"
                " pass max_record_bytes if the topic's limit differs",
                self.topic,
                str(exc)[:200] or type(exc).__name__,
                DEFAULT_MAX_RECORD_BYTES,
            )
            return None
        log.info("topic %s: max.message.bytes %d (from the cluster)", self.topic, value)
        return value

    def _segment_size(self, key_length: int, extra: Headers) -> int:
        header_bytes = sum(HEADER_OVERHEAD + len(k.encode()) + len(v) for k, v in _encoded_headers(extra))
        if self.headers:
            header_bytes += MQ_HEADER_BYTES
        fits = kafka_segment_size_for(self.max_record_bytes, key_length=key_length, header_bytes=header_bytes)
        wanted = self._max_segment_size
        if wanted is None:
            return fits
        if wanted > fits:
            raise SegmentationError(
                f"max_segment_size {wanted} does not fit the topic's record limit {self.max_record_bytes}"
                f" ({fits} with a {key_length}-byte key and {header_bytes} bytes of headers)",
                reason=Reason.MSG_TOO_BIG_FOR_CHANNEL,
                size=wanted,
                limit=self.max_record_bytes,
                fits=fits,
            )
        return wanted

    def segment_size(self, key: bytes | str | None = None, headers: Headers = ()) -> int:
        """The ``max_segment_size`` a message with this key (default: the 48-byte GroupId key) and
        these extra headers is cut at."""
        return self._segment_size(len(_as_key(key, bytes(GROUP_ID_LENGTH))), headers)

    # ---------------------------------------------------------------- sending
    def send(
        self,
        payload: Payload | os.PathLike[str],
        *,
        msg_id: bytes | str | None = None,
        group_id: bytes | None = None,
        key: bytes | str | None = None,
        headers: Headers = (),
        partition: int | None = None,
    ) -> KafkaSend:
        """Segment and produce one message: bytes-like, a binary file object (read in segment-sized
        pieces, never whole) or a path (``pathlib.Path``; a ``str`` is refused, it could be text).

        ``msg_id`` (any bytes or text, e.g. an order number) makes the GroupId deterministic
        (:func:`group_id_for`); ``group_id`` gives the 24-byte GroupId itself; neither: a random one.
        ``key`` replaces the record key (default: the GroupId in hex); ``headers`` are added to every
        record; ``partition`` pins the partition (default: the key's). Returns once every segment is
        handed to librdkafka (produce() copies it); the message is sent when the returned
        :class:`KafkaSend` is done and ok. A segment refused on the spot raises here.
        """
        gid = self._group_id(msg_id, group_id)
        with _Opened() as opened:
            source = opened.open(payload)
            return self._send(gid, key, headers, partition, lambda s: s.segment(source, group_id=gid))

    def send_group(
        self,
        payloads: Iterable[Payload | os.PathLike[str]],
        *,
        msg_id: bytes | str | None = None,
        group_id: bytes | None = None,
        key: bytes | str | None = None,
        headers: Headers = (),
        partition: int | None = None,
    ) -> KafkaSend:
        """Segment and produce several messages as one MQ logical group (MsgSeqNumber 1..n, one
        GroupId, one key: one partition); one :class:`KafkaSend` for the whole group. ``payloads``
        is read lazily, each like :meth:`send`'s payload."""
        gid = self._group_id(msg_id, group_id)
        with _Opened() as opened:
            # Segmenter.segment_group takes the next payload before cutting the current one: a file
            # stays open until the one after the next is opened.
            sources = map(opened.open, payloads)
            return self._send(gid, key, headers, partition, lambda s: s.segment_group(sources, group_id=gid))

    def send_segments(
        self,
        segments: Iterable[Segment],
        *,
        key: bytes | str | None = None,
        headers: Headers = (),
        partition: int | None = None,
    ) -> KafkaSend:
        """Produce segments cut elsewhere (relayed from MQ, read from a file of segments), as they
        are. They should be one message or group: the key and the handle's GroupId are the first
        segment's. A segment whose record would not fit the topic's limit is refused (2218) before
        it is produced; the ones before it are produced already (the handle is in the error's
        ``details["send"]``)."""
        it = iter(segments)
        try:
            first = next(it)
        except StopIteration:
            raise argument_error("no segments to send") from None
        gid = first.header.group_id

        def chain() -> Iterator[Segment]:
            yield first
            yield from it

        return self._send(gid, key, headers, partition, lambda s: chain(), precut=True)

    def _group_id(self, msg_id: bytes | str | None, group_id: bytes | None) -> bytes:
        if msg_id is not None and group_id is not None:
            raise argument_error("give msg_id or group_id, not both")
        if msg_id is not None:
            return group_id_for(msg_id)
        return _checked_group_id(group_id)

    def _send(
        self,
        gid: bytes,
        key_arg: bytes | str | None,
        extra: Headers,
        partition: int | None,
        cut: Callable[[Segmenter], Iterable[Segment]],
        *,
        precut: bool = False,
    ) -> KafkaSend:
        key = _as_key(key_arg, gid)
        extra_headers = _encoded_headers(extra)
        size = self._segment_size(len(key), extra)
        limit = size if precut else None
        segmenter = replace(self._segmenter, max_segment_size=size)
        handle = KafkaSend(self, self.topic, key, gid)
        self._pending.add(handle)
        # The arguments every record of the message shares, built once: at 64 KiB segments the
        # per-record Python work, not the copy, is what the segmented send adds to a plain produce.
        common: dict[str, Any] = {"key": key}
        if partition is not None:
            common["partition"] = partition
        if extra_headers and not self.headers:
            common["headers"] = extra_headers
        try:
            for seg in cut(segmenter):
                self._produce(handle, seg, common, extra_headers, limit, size)
        except BaseException as exc:
            handle.sealed = True
            if handle.done():
                self._finished(handle, quiet=True)
            if isinstance(exc, SegmentationError):
                exc.details.setdefault("send", handle)
                exc.name_group(gid)
            raise
        handle.sealed = True
        if handle.done():
            self._finished(handle)
        return handle

    def _produce(
        self,
        handle: KafkaSend,
        seg: Segment,
        common: dict[str, Any],
        extra: list[tuple[str, bytes]],
        limit: int | None,
        size: int,
    ) -> None:
        h = seg.header
        value = seg.encode()
        n = len(value)
        if n > size:
            raise SegmentationError(
                f"segment of {len(value)} bytes (MsgSeqNumber {h.msg_seq_number}, Offset {h.offset}) does not fit the"
                f" topic's record limit {self.max_record_bytes}: at most {size} with this key and headers",
                reason=Reason.MSG_TOO_BIG_FOR_CHANNEL,
                size=len(value),
                limit=self.max_record_bytes,
                fits=size,
            )
        kwargs = dict(common)
        kwargs["on_delivery"] = functools.partial(handle._delivered, h.msg_seq_number, h.offset)
        if self.headers:
            kwargs["headers"] = extra + _mq_headers(seg)
        client = self._client
        handle.segments += 1
        while True:
            try:
                client.produce(self.topic, value, **kwargs)
                break
            except BufferError:  # librdkafka's queue is full: serve deliveries until it has room
                client.poll(0.05)
            except self._kafka_exception as exc:  # refused before it was queued (no callback will come)
                err: Any = exc.args[0] if exc.args else None
                name = err.name() if hasattr(err, "name") else type(exc).__name__
                text = err.str() if hasattr(err, "str") else str(exc)
                handle.failed.append(FailedSegment(h.msg_seq_number, h.offset, name, text))
                handle.reported = True
                raise handle.error() from exc
        self.sent_segments += 1
        self.sent_bytes += n
        if not self.sent_segments % _POLL_EVERY:
            client.poll(0)
        if not h.msg_flags & _SEGMENT:  # the last (or only) segment of a message
            self.sent_messages += 1

    # ---------------------------------------------------------------- deliveries
    def _finished(self, handle: KafkaSend, quiet: bool = False) -> None:
        self._pending.discard(handle)
        if handle.failed and not quiet:
            self._failed.append(handle)

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery reports (librdkafka calls the callbacks inside this call); the number served."""
        return self._client.poll(timeout)

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every record produced so far is acknowledged or failed; raise :class:`BrokerError`
        naming every message with a failed segment (each is raised once: by its ``wait`` or here),
        or the messages still unacknowledged after ``timeout`` seconds."""
        left = self._client.flush(timeout)
        failed = [h for h in self._failed if not h.reported]
        self._failed = []
        if failed:
            for h in failed:
                h.reported = True
            first = failed[0].error()
            if len(failed) == 1:
                raise first
            names = ", ".join(h.message_id for h in failed[:10])
            raise BrokerError(
                f"{len(failed)} messages not sent to {self.topic} ({names}{', ...' if len(failed) > 10 else ''});"
                f" the first: {first.args[0]}",
                reason=first.reason,
                topic=self.topic,
                group_ids=[h.message_id for h in failed],
                sends=failed,
            )
        if left:
            waiting = sorted(h.message_id for h in self._pending)
            raise BrokerError(
                f"{left} records not acknowledged within {timeout} s; messages waiting: {', '.join(waiting[:10])}",
                topic=self.topic,
                group_ids=waiting,
            )

    @property
    def client(self) -> Producer:
        """The confluent-kafka ``Producer`` underneath (metadata, your own records on the same connection)."""
        return self._client

    def close(self, timeout: float = 60.0) -> None:
        """Flush (raising for what failed); the client is released with this object."""
        self.flush(timeout)

    def __enter__(self) -> KafkaSegmentProducer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.flush()
        else:  # an error is on its way out: wait for what is in flight, do not replace the error
            self._client.flush(10.0)


def _encoded_headers(headers: Headers) -> list[tuple[str, bytes]]:
    out = []
    for item in headers:
        try:
            name, value = item
        except (TypeError, ValueError):
            raise argument_error(f"a record header is a (name, value) pair, not {item!r}"[:120]) from None
        if not isinstance(name, str):
            raise argument_error(f"a record header name is a str, not {type(name).__name__}")
        if isinstance(value, str):
            value = value.encode("utf-8")
        elif not isinstance(value, bytes):
            raise argument_error(f"a record header value is bytes or str, not {type(value).__name__}")
        out.append((name, value))
    return out


def _mq_headers(seg: Segment) -> list[tuple[str, bytes]]:
    h = seg.header
    out = [
        ("GroupId", h.group_id.hex().encode()),
        ("MsgSeqNumber", str(h.msg_seq_number).encode()),
        ("Offset", str(h.offset).encode()),
        ("MsgFlags", str(int(h.msg_flags)).encode()),
    ]
    if h.original_length != UNKNOWN_LENGTH:
        out.append(("OriginalLength", str(h.original_length).encode()))
    return out


class _Opened:
    """Payloads as the segmenter takes them: a path opened (all closed on exit), anything else as is."""

    def __init__(self) -> None:
        self.files: list[BinaryIO] = []

    def open(self, payload: Payload | os.PathLike[str]) -> Payload:
        if isinstance(payload, str):
            raise argument_error(
                "a str payload is ambiguous: pass pathlib.Path(...) for a file, or bytes (text.encode()) for content"
            )
        if not isinstance(payload, os.PathLike):
            return payload
        while len(self.files) > 1:  # the segmenter is done with all but the newest file
            self.files.pop(0).close()
        path = os.fspath(payload)
        try:
            f = open(path, "rb")  # noqa: SIM115  (closed in __exit__ or above)
        except OSError as exc:
            raise argument_error(f"cannot open {path!r}: {exc.strerror}", path=path) from None
        self.files.append(f)
        return f

    def __enter__(self) -> _Opened:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in self.files:
            f.close()
