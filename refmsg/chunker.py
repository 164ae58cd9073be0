"""Sender side: cut an object into reference messages, like MQ's sending message exit.

``max_length`` bounds the bulk data of each message by default, so IBM's worked
example holds as stated: a 70,000-byte object over a 40,000-byte channel goes
as 40,000 bytes at offset 0, then 30,000 bytes at offset 40,000 with
MQRMHF_LAST. With ``limit_includes_header=True`` the bound is on the whole
message (MQRMH included) instead, which is what a channel's MAXMSGL enforces.

Files are streamed in chunk-sized reads, one chunk held back so the last can
be flagged; the whole-object checksum (and, with a ``digest`` policy, the
SHA-256 / HMAC-SHA-256) is accumulated on the way and travels in the
integrity block of the LAST message (with the object length).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from segmenter.checksum import DEFAULT_ALGORITHM, ChecksumAlgorithm, checksum
from segmenter.digest import NO_POLICY, DigestPolicy
from segmenter.errors import SegmentationError
from segmenter.sources import argument_error, read_full

from .header import (
    CCSID_UTF8,
    DEFAULT_OBJECT_TYPE,
    ENCODING_NATIVE,
    FORMAT_NONE,
    MAX_MQLONG,
    OBJECT_INSTANCE_ID_LENGTH,
    RMH,
    RmhFlags,
)
from .integrity import BLOCK_LENGTH, Integrity
from .message import ReferenceMessage

DEFAULT_MAX_LENGTH = 4 * 1024 * 1024  # IBM MQ's default MAXMSGL
Source = str | os.PathLike[str] | BinaryIO


def new_instance_id() -> bytes:
    """A random 24-byte ObjectInstanceId: the identity of one transfer of one object."""
    return os.urandom(OBJECT_INSTANCE_ID_LENGTH)


@dataclass(frozen=True)
class Chunker:
    """Configured sender.

    ``integrity=False`` sends plain MQRMHs (no block, no checksums) for peers
    that must see nothing but IBM's layout. ``digest`` adds a whole-object
    SHA-256 (``DigestPolicy(sha256=True)``) and/or an HMAC-SHA-256 under the
    keyring's current key to the LAST message's block.
    """

    max_length: int = DEFAULT_MAX_LENGTH
    """Bytes of bulk data per message (default 4 MiB, IBM MQ's default MAXMSGL)."""
    limit_includes_header: bool = False
    """True: ``max_length`` bounds the whole message, MQRMH included (what a channel's MAXMSGL
    enforces); False: the bulk data alone (IBM's worked example)."""
    algorithm: ChecksumAlgorithm = DEFAULT_ALGORITHM
    """The checksum of the integrity block's per-block and whole-object checksums."""
    header_encoding: int = ENCODING_NATIVE
    """The MQRMH's Encoding: the byte order its integers are written in (546: little-endian)."""
    ccsid: int = CCSID_UTF8
    """The MQRMH's CodedCharSetId: the character set of its names (1208: UTF-8)."""
    object_type: str = DEFAULT_OBJECT_TYPE
    """The MQRMH's ObjectType, up to 8 characters, for the receiving exit to recognise the object."""
    data_format: str = FORMAT_NONE
    """The MQRMH's Format: the MQ format name of the bulk data (MQFMT_NONE: plain bytes)."""
    integrity: bool = True
    """True: each message carries the integrity block (checksums, the object's length); False:
    plain MQRMHs for peers that must see nothing but IBM's layout."""
    digest: DigestPolicy = NO_POLICY
    """Adds a whole-object SHA-256 and/or an HMAC-SHA-256 to the LAST message's block (needs ``integrity``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "algorithm", ChecksumAlgorithm.parse(self.algorithm))
        if not isinstance(self.max_length, int) or isinstance(self.max_length, bool) or self.max_length <= 0:
            raise argument_error("max_length must be a positive whole number", max_length=repr(self.max_length)[:40])
        if self.digest.extension_size() and not self.integrity:
            raise SegmentationError("digests travel in the integrity block: integrity=False cannot carry them")

    def _template(self, name: str, src_name: str, src_env: str, dest_env: str, instance_id: bytes) -> RMH:
        return RMH(
            object_type=self.object_type,
            object_instance_id=instance_id,
            src_env=src_env,
            src_name=src_name,
            dest_env=dest_env,
            dest_name=name,
            format=self.data_format,
            encoding=self.header_encoding,
            ccsid=self.ccsid,
        )

    def chunk_size(self, template: RMH) -> int:
        """Bulk bytes per message for this header.

        ``template``: the reference message header the chunks are sent with (its strings' lengths count).
        """
        size = self.max_length
        if self.limit_includes_header:
            trailer = BLOCK_LENGTH + self.digest.extension_size() if self.integrity else 0
            size -= len(template.pack(trailer=bytes(trailer)))  # exact, padding included
        size = min(size, MAX_MQLONG)
        if size <= 0:
            raise SegmentationError(
                f"max_length {self.max_length} leaves no room for data after the header", max_length=self.max_length
            )
        return size

    def messages(
        self,
        source: Source,
        dest_name: str,
        *,
        src_name: str = "",
        src_env: str = "",
        dest_env: str = "",
        instance_id: bytes | None = None,
        header_only: bool = False,
    ) -> Iterator[ReferenceMessage]:
        """Reference messages for ``source`` in offset order, the last flagged MQRMHF_LAST.

        ``header_only`` sends the headers (with their checksums) but not the
        bytes: the receiver fetches each range from shared storage.

        ``source``: the object, a path or a binary file object read from its start. ``dest_name``: the object's name at
        the receiver (MQRMH DestName). ``src_name``: its name at the sender (SrcName; "": the path of a path source).
        ``src_env``, ``dest_env``: the source and destination environments (SrcEnv, DestEnv). ``instance_id``: the
        24-byte ObjectInstanceId of this transfer (None: a random one).
        """
        if isinstance(source, (str, os.PathLike)):
            with open(source, "rb") as f:
                yield from self.messages(
                    f,
                    dest_name,
                    src_name=src_name or os.fspath(source),
                    src_env=src_env,
                    dest_env=dest_env,
                    instance_id=instance_id,
                    header_only=header_only,
                )
            return
        template = self._template(dest_name, src_name, src_env, dest_env, instance_id or new_instance_id())
        size = self.chunk_size(template)
        offset = 0
        object_crc = 0
        hasher = self.digest.signer()
        pending = read_full(source, size)  # a short read is not the end: only b"" is
        while True:
            following = read_full(source, size) if len(pending) == size else b""
            last = not following
            chunk_crc = checksum(self.algorithm, pending)
            object_crc = checksum(self.algorithm, pending, object_crc)
            hasher.update(pending)
            integrity = None
            if self.integrity:
                integrity = (
                    Integrity(self.algorithm, chunk_crc, offset + len(pending), object_crc, hasher.digests())
                    if last
                    else Integrity(self.algorithm, chunk_crc)
                )
            header = template.with_(
                flags=RmhFlags.LAST if last else RmhFlags.NOT_LAST,
                data_logical_offset=offset,
                data_logical_length=len(pending),
            )
            yield ReferenceMessage(header, b"" if header_only else pending, integrity)
            if last:
                return
            offset += len(pending)
            pending = following

    def encode(self, source: Source, dest_name: str, **options: object) -> Iterator[bytes]:
        """Encoded message bodies (put each with MQMD Format "MQHREF  ").

        ``source``, ``dest_name``: as for :meth:`messages`; ``**options``: its keyword arguments.
        """
        for message in self.messages(source, dest_name, **options):  # type: ignore[arg-type]
            yield message.encode(header_encoding=self.header_encoding)


def chunk(source: Source, dest_name: str, *, max_length: int = DEFAULT_MAX_LENGTH, **options: object) -> list[bytes]:
    """One-shot: every encoded message for ``source`` (small objects; use :class:`Chunker` to stream).

    ``source``: the object, a path or a binary file object. ``dest_name``: its name at the receiver. ``max_length``: the
    largest message, MQRMH included, in bytes. ``**options``: the keyword arguments of :meth:`Chunker.messages`.
    """
    return list(Chunker(max_length=max_length).encode(source, dest_name, **options))
