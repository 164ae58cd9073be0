"""A whole reference message: MQRMH (with the optional integrity block) plus bulk data.

A message either carries the bytes it describes (bulk data of exactly
DataLogicalLength bytes after the header, like IBM's sending exit produces)
or none at all (header-only: the receiver fetches the range from shared
storage).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from segmenter.checksum import checksum
from segmenter.errors import ChecksumError, Reason

from .errors import RmhError
from .header import CCSID_UTF8, RMH, DecodedRMH, decode_rmh
from .integrity import Integrity, find_block, read_block, seal

Buffer = bytes | bytearray | memoryview


class ReferenceMessage(NamedTuple):
    """One reference message."""

    header: RMH
    """The MQRMH: what the chunk is and where it goes in the object."""
    data: Buffer = b""
    """The chunk's bytes; empty for a header-only message, which names a range without carrying it."""
    integrity: Integrity | None = None
    """The checksums the message carries; None when it carries none."""

    @property
    def header_only(self) -> bool:
        """True when the message names a range but does not carry it."""
        return len(self.data) == 0 and self.header.data_logical_length > 0

    @property
    def offset(self) -> int:
        return self.header.data_logical_offset

    @property
    def length(self) -> int:
        return self.header.data_logical_length

    @property
    def is_last(self) -> bool:
        return self.header.is_last

    def pack_header(
        self,
        *,
        header_encoding: int | None = None,
        header_ccsid: int = CCSID_UTF8,
        string_offsets: Mapping[str, int] | None = None,
        struc_length: int | None = None,
    ) -> bytes:
        """The MQRMH bytes, integrity block (if any) sealed at its end.

        ``header_encoding``: the byte order of the header's integers (None: its Encoding field's). ``header_ccsid``: the
        character set of its strings. ``string_offsets``: where each string goes, by field name (None: after the fixed
        part, in field order). ``struc_length``: the header's length, padded with NULs (None: rounded up to a multiple
        of 4).
        """
        if self.integrity is None:
            return self.header.pack(
                header_encoding=header_encoding,
                header_ccsid=header_ccsid,
                string_offsets=string_offsets,
                struc_length=struc_length,
            )
        packed = self.header.pack(
            header_encoding=header_encoding,
            header_ccsid=header_ccsid,
            string_offsets=string_offsets,
            struc_length=struc_length,
            trailer=self.integrity.block(),
        )
        return seal(packed)

    def encode(
        self,
        *,
        header_encoding: int | None = None,
        header_ccsid: int = CCSID_UTF8,
        string_offsets: Mapping[str, int] | None = None,
        struc_length: int | None = None,
    ) -> bytes:
        """Header and bulk data as one ``bytes``: the message body to put with MQMD Format "MQHREF  ".

        ``header_encoding``, ``header_ccsid``, ``string_offsets``, ``struc_length``: as for :meth:`pack_header`.
        """
        if self.data and len(self.data) != self.header.data_logical_length:
            raise RmhError(
                f"{len(self.data)} bytes of data, DataLogicalLength {self.header.data_logical_length}",
                length=len(self.data),
                data_logical_length=self.header.data_logical_length,
            )
        head = self.pack_header(
            header_encoding=header_encoding,
            header_ccsid=header_ccsid,
            string_offsets=string_offsets,
            struc_length=struc_length,
        )
        return head + bytes(self.data)


class DecodedMessage(NamedTuple):
    """A decoded message and its header layout."""

    message: ReferenceMessage
    """The decoded reference message."""
    layout: DecodedRMH
    """The decoded header and its layout (StrucLength, byte order, character set, where the strings are)."""


def decode_message(
    buf: Buffer, *, encoding: int | None = None, ccsid: int = CCSID_UTF8, require_integrity: bool = False
) -> DecodedMessage:
    """Parse, validate and (when the block is present) verify a reference message.

    ``encoding``/``ccsid`` are the header's own, from the MQMD (see
    :func:`~refmsg.header.decode_rmh`). The header checksum is checked whenever
    the integrity block is present, and the chunk checksum whenever bulk data
    is present; with ``require_integrity`` a message without the block is
    refused. As in MQ, only the first DataLogicalLength bytes of the bulk data
    are relevant (normally all of it); less data than that is refused.

    ``buf``: the message body, from the MQRMH's first byte.
    """
    view = memoryview(buf)
    layout = decode_rmh(view, encoding=encoding, ccsid=ccsid)
    rmh, struc_length = layout.header, layout.struc_length
    start = find_block(view, struc_length, tuple(layout.spans))
    integrity = None if start is None else read_block(view, struc_length, start, tuple(layout.spans))
    if integrity is None and require_integrity:
        raise ChecksumError(
            "the MQRMH carries no integrity block", reason=Reason.HEADER_CHECKSUM_ERROR, struc_length=struc_length
        )
    data = view[struc_length:]
    if len(data) and len(data) < rmh.data_logical_length:
        raise RmhError(
            f"{len(data)} bytes of bulk data, DataLogicalLength {rmh.data_logical_length}",
            length=len(data),
            data_logical_length=rmh.data_logical_length,
        )
    if len(data):
        data = data[: rmh.data_logical_length]
    if integrity is not None and len(data):
        actual = checksum(integrity.algorithm, data)
        if actual != integrity.chunk_checksum:
            raise ChecksumError(
                f"chunk at {rmh.data_logical_offset}: checksum 0x{actual:08x}, "
                f"expected 0x{integrity.chunk_checksum:08x}",
                reason=Reason.DATA_CHECKSUM_ERROR,
                offset=rmh.data_logical_offset,
                stored=integrity.chunk_checksum,
                computed=actual,
            )
    if integrity is not None and integrity.has_object and rmh.end > (integrity.object_length or 0):
        raise RmhError(
            f"chunk ends at {rmh.end}, past the object length {integrity.object_length}",
            reason=Reason.OFFSET_ERROR,
            end=rmh.end,
            object_length=integrity.object_length,
        )
    return DecodedMessage(ReferenceMessage(rmh, data, integrity), layout)
