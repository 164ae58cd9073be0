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

Record limit: a Kafka broker refuses a record *batch* larger than the topic's
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

The record's layout and size (:mod:`.kafka_record`) and the handle of a message sent
(:mod:`.kafka_send`) are modules of their own; their names are importable from here too.

confluent-kafka is the optional extra ``segment-reassembly[kafka]``: it is imported when a
producer is created, never when this module is, so ``import segmenter.brokers`` works without it.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, BinaryIO

from ..checksum import DEFAULT_ALGORITHM, ChecksumAlgorithm
from ..digest import NO_POLICY, DigestPolicy
from ..errors import Reason, SegmentationError
from ..flags import Codec, MsgFlags
from ..producer import Payload, Segmenter, _checked_group_id
from ..sources import argument_error
from ..wire import GROUP_ID_LENGTH, Segment
from .base import BrokerError
from .kafka_record import DEFAULT_MAX_RECORD_BYTES as DEFAULT_MAX_RECORD_BYTES
from .kafka_record import HEADER_OVERHEAD as HEADER_OVERHEAD
from .kafka_record import KEY_LENGTH as KEY_LENGTH
from .kafka_record import MQ_HEADER_BYTES as MQ_HEADER_BYTES
from .kafka_record import MQ_HEADERS as MQ_HEADERS
from .kafka_record import RECORD_BATCH_OVERHEAD as RECORD_BATCH_OVERHEAD
from .kafka_record import RECORD_OVERHEAD as RECORD_OVERHEAD
from .kafka_record import Headers as Headers
from .kafka_record import _as_key, _encoded_headers, _mq_headers
from .kafka_record import group_id_for as group_id_for
from .kafka_record import kafka_segment_size_for as kafka_segment_size_for
from .kafka_send import DeliveredSegment as DeliveredSegment
from .kafka_send import FailedSegment as FailedSegment
from .kafka_send import KafkaSend as KafkaSend

if TYPE_CHECKING:
    from confluent_kafka import Producer

log = logging.getLogger(__name__)

_CLIENT_MAX_MSG_BYTES = 1_000_000  # librdkafka's message.max.bytes and batch.size defaults
_FALSE = {"false", "0", "no", "off"}
_SEGMENT = MsgFlags.SEGMENT.value  # set on every segment but the last of a message
# Delivery reports are served (poll(0)) after every this many records, not after each: a poll that
# finds reports waiting costs a GIL round trip and a queue lock whatever their number, and a
# message's wait() or flush() serves the rest.
_POLL_EVERY = 16

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

    ``topic``: the topic every record goes to. ``max_segment_size``: None cuts segments at the size the record limit
    allows. ``headers``: True adds the MQ fields as record headers. ``describe_timeout``: seconds.
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
        these extra headers is cut at.

        ``key``: the record key (None: the default, the GroupId in hex). ``headers``: the extra record headers, (name,
        value) pairs.
        """
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

        ``payload``: the message.
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
        is read lazily, each like :meth:`send`'s payload.

        ``msg_id``, ``group_id``, ``key``, ``headers``, ``partition``: as for :meth:`send`, once for the whole group.
        """
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
        ``details["send"]``).

        ``segments``: the segments, produced in the order given. ``key``: the record key (None: the first segment's
        GroupId in hex). ``headers``: added to every record. ``partition``: the partition (None: the key's).
        """
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
        """Serve delivery reports (librdkafka calls the callbacks inside this call); the number served.

        ``timeout``: the longest wait for a report, in seconds (0: serve what is there and return).
        """
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
        """Flush (raising for what failed); the client is released with this object.

        ``timeout``: the longest wait for the outstanding records to be acknowledged, in seconds.
        """
        self.flush(timeout)

    def __enter__(self) -> KafkaSegmentProducer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.flush()
        else:  # an error is on its way out: wait for what is in flight, do not replace the error
            self._client.flush(10.0)


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
