"""The segment header as data: every field and every validation rule, in one table.

Every decoder is rendered from this table (:mod:`segmenter.header_render`), so a change to the
format is made here and nowhere else: the Python decoder (``segmenter/_decoder.py``), the Spark
SQL (built at run time by ``reassembly/spark``), the JVM's ``HeaderTable.java`` and the compiled
decoder's ``segmenter/_fastwire_table.h``. The committed renderings are written by
``python tools/render.py``, and tests fail when one is not what this table renders.

A rule is a predicate (a small expression tree over field names, derived
names, parameters and named constants of :mod:`segmenter.model` /
:mod:`segmenter.flags`) that a valid segment satisfies, with the reason code
and error raised when it does not. Rules run in table order: the first one
that fails names the reason.

This module imports nothing of ours: it is data and the small types that spell it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class Field:
    """One header field: ``width`` bytes at ``offset``, big-endian (``kind`` "int" or "bytes")."""

    name: str
    offset: int
    width: int
    kind: str = "int"
    signed: bool = False


FIELDS: tuple[Field, ...] = (
    Field("magic", 0, 4, "bytes"),
    Field("version", 4, 1),
    Field("algorithm", 5, 1),
    Field("codec", 6, 1),
    Field("header_flags", 7, 1),
    Field("header_length", 8, 2),
    Field("reserved", 10, 2),
    Field("msg_flags", 12, 4),
    Field("group_id", 16, 24, "bytes"),
    Field("msg_seq_number", 40, 4),
    Field("data_length", 44, 4),
    Field("offset", 48, 8),
    Field("original_length", 56, 8),
    Field("stored_length", 64, 8),
    Field("data_checksum", 72, 4),
    Field("message_checksum", 76, 4),
)
FIELD = {f.name: f for f in FIELDS}
# The header checksum closes the header: its offset counts back from header_length. Between the
# fixed fields and it lie ``header_length - HEADER_LENGTH`` extension bytes (none in a plain v1 header).
CHECKSUM_FIELD = Field("header_checksum", -4, 4)
FIXED_LENGTH = FIELDS[-1].offset + FIELDS[-1].width  # 80
HEADER_LENGTH = FIXED_LENGTH + CHECKSUM_FIELD.width  # 84
PREFIX_FIELDS = tuple(f for f in FIELDS if f.offset <= FIELD["header_length"].offset)  # enough to frame a header
PREFIX_LENGTH = FIELD["header_length"].offset + FIELD["header_length"].width  # 10


def struct_format(fields: Iterable[Field]) -> str:
    """The :mod:`struct` format of consecutive fields (big-endian)."""
    codes = {1: "b", 2: "h", 4: "i", 8: "q"}
    out = ">"
    for f in fields:
        out += f"{f.width}s" if f.kind == "bytes" else codes[f.width] if f.signed else codes[f.width].upper()
    return out


# ----------------------------------------------------------------- expression trees
@dataclass(frozen=True)
class Name:
    """A field, a derived value, a parameter, or a fact of the buffer (``length``, ``header_crc``)."""

    name: str


@dataclass(frozen=True)
class Const:
    """A named constant of segmenter.model / segmenter.flags (``"MsgFlags.SEGMENT"``, an enum for ``in``)."""

    name: str


@dataclass(frozen=True)
class Op:
    """An operator over expressions (``eq``, ``and``, ``band``, ``in``, ...): each renderer spells each one."""

    op: str
    args: tuple[Expr, ...]


Expr = Union[Name, Const, Op]  # noqa: UP007 (a runtime alias)


def n(name: str) -> Name:
    """A name (short, so that a rule reads like its predicate)."""
    return Name(name)


def k(name: str) -> Const:
    """A named constant (short, like :func:`n`)."""
    return Const(name)


def _op(op: str) -> Callable[..., Op]:
    """The builder of one operator: ``eq(a, b)`` is ``Op("eq", (a, b))``."""
    return lambda *args: Op(op, tuple(args))


eq, ne, le, lt, ge, gt = (_op(o) for o in ("eq", "ne", "le", "lt", "ge", "gt"))
and_, or_, not_, add, sub, band, bor, bnot, isin, length_of = (
    _op(o) for o in ("and", "or", "not", "add", "sub", "band", "bor", "bnot", "in", "len")
)


def unknown(e: Expr) -> Op:
    """``e`` is the UNKNOWN_LENGTH marker: a length not known when the segment was cut."""
    return eq(e, k("UNKNOWN_LENGTH"))


def known(e: Expr) -> Op:
    """``e`` is a length, not the UNKNOWN_LENGTH marker."""
    return ne(e, k("UNKNOWN_LENGTH"))


# Values computed from fields. ``has_message_checksum`` and ``length_deferred`` come from the
# header flags when decoding bytes; a SegmentHeader carries them directly.
FROM_HEADER_FLAGS: dict[str, Expr] = {
    "has_message_checksum": ne(band(n("header_flags"), k("HAS_MESSAGE_CHECKSUM")), 0),
    "length_deferred": ne(band(n("header_flags"), k("LENGTH_DEFERRED")), 0),
}
DERIVED: dict[str, Expr] = {
    "end": add(n("offset"), n("data_length")),
    "segmented": ne(band(n("msg_flags"), bor(k("MsgFlags.SEGMENT"), k("MsgFlags.LAST_SEGMENT"))), 0),
    "last": or_(
        ne(band(n("msg_flags"), k("MsgFlags.LAST_SEGMENT")), 0), eq(band(n("msg_flags"), k("MsgFlags.SEGMENT")), 0)
    ),
    "in_group": ne(band(n("msg_flags"), bor(k("MsgFlags.MSG_IN_GROUP"), k("MsgFlags.LAST_MSG_IN_GROUP"))), 0),
}


@dataclass(frozen=True)
class Rule:
    """A predicate every valid segment satisfies, and what is raised when it does not.

    ``stage`` says what the rule needs (and where the decoders check it): ``segment`` the
    buffer's length only (checked first), ``frame`` / ``prefix`` / ``header`` / ``checksum``
    the framing (a row passing these is *routable*: its GroupId can be trusted),
    ``raw`` and ``fields`` the decoded fields, ``data`` the data length present.
    ``message`` is an f-string over the same names; ``details`` map keyword to expression.
    """

    name: str
    stage: str
    predicate: Expr
    reason: str
    error: str
    message: str
    details: tuple[tuple[str, str], ...] = ()


def _too_big(field: str) -> Rule:
    """The size limit rule of a declared length (OriginalLength and StoredLength are limited alike)."""
    return Rule(
        f"{field}_limit",
        "fields",
        or_(unknown(n(field)), le(n(field), n("max_message_size"))),
        "MSG_TOO_BIG",
        "MessageTooBigError",
        f"declared {field} {{{field}}} exceeds the limit {{max_message_size}}",
        (("declared", field), ("limit", "max_message_size"), ("field", f'"{field}"')),
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "segment_size",
        "segment",
        le(n("length"), n("max_segment_size")),
        "MSG_TOO_BIG_FOR_CHANNEL",
        "MessageTooBigError",
        "segment of {length} bytes exceeds the limit {max_segment_size}",
        (("length", "length"), ("limit", "max_segment_size")),
    ),
    Rule(
        "prefix_present",
        "frame",
        ge(n("length"), k("PREFIX_LENGTH")),
        "TRUNCATED",
        "HeaderError",
        "{length} bytes cannot hold a segment header",
        (("length", "length"),),
    ),
    Rule("magic", "prefix", eq(n("magic"), k("MAGIC")), "BAD_MAGIC", "HeaderError", "bad magic {bytes(magic)!r}"),
    Rule(
        "version",
        "prefix",
        eq(n("version"), k("VERSION")),
        "UNSUPPORTED_VERSION",
        "HeaderError",
        "unsupported version {version}",
        (("version", "version"),),
    ),
    Rule(
        "header_length",
        "prefix",
        and_(ge(n("header_length"), k("HEADER_LENGTH")), le(n("header_length"), n("max_header_length"))),
        "HEADER_LENGTH_ERROR",
        "HeaderError",
        "header length {header_length} outside {HEADER_LENGTH}..{max_header_length}",
        (("header_length", "header_length"),),
    ),
    Rule(
        "header_present",
        "header",
        ge(n("length"), n("header_length")),
        "TRUNCATED",
        "HeaderError",
        "{length} bytes, header declares {header_length}",
        (("length", "length"), ("header_length", "header_length")),
    ),
    Rule(
        "header_checksum",
        "checksum",
        eq(n("header_checksum"), n("header_crc")),
        "HEADER_CHECKSUM_ERROR",
        "ChecksumError",
        "header checksum mismatch",
        (("expected", "header_checksum"), ("actual", "header_crc")),
    ),
    Rule(
        "reserved",
        "raw",
        and_(eq(n("reserved"), 0), eq(band(n("header_flags"), bnot(k("KNOWN_HEADER_FLAGS"))), 0)),
        "RESERVED_FIELD_ERROR",
        "HeaderError",
        "reserved header bits are set",
    ),
    Rule(
        "algorithm",
        "raw",
        isin(n("algorithm"), k("ChecksumAlgorithm")),
        "UNKNOWN_CHECKSUM",
        "HeaderError",
        "unknown checksum algorithm {algorithm}",
    ),
    Rule("codec", "raw", isin(n("codec"), k("Codec")), "UNKNOWN_CODEC", "HeaderError", "unknown codec {codec}"),
    Rule(
        "group_id",
        "fields",
        eq(length_of(n("group_id")), k("GROUP_ID_LENGTH")),
        "GROUP_ID_ERROR",
        "HeaderError",
        "GroupId must be 24 bytes",
        (("length", "len(group_id)"),),
    ),
    Rule(
        "msg_seq_number",
        "fields",
        and_(ge(n("msg_seq_number"), 1), le(n("msg_seq_number"), k("MAX_SEQ_NUMBER"))),
        "MSG_SEQ_NUMBER_ERROR",
        "SequenceError",
        "MsgSeqNumber {msg_seq_number} outside 1..{MAX_SEQ_NUMBER}",
        (("msg_seq_number", "msg_seq_number"),),
    ),
    Rule(
        "msg_flags",
        "fields",
        eq(band(n("msg_flags"), bnot(k("KNOWN_FLAGS"))), 0),
        "MSG_FLAGS_ERROR",
        "FlagsError",
        "unknown MsgFlags bits 0x{msg_flags & ~KNOWN_FLAGS:x}",
        (("msg_flags", "msg_flags"),),
    ),
    _too_big("original_length"),
    _too_big("stored_length"),
    Rule(  # a segment whose length was deferred declares no size: its end is what it claims
        "end_limit",
        "fields",
        le(n("end"), n("max_message_size")),
        "MSG_TOO_BIG",
        "MessageTooBigError",
        "segment [{offset}, {end}) ends past the largest message allowed, {max_message_size}",
        (("offset", "offset"), ("end", "end"), ("limit", "max_message_size")),
    ),
    Rule(
        "offset_range",
        "fields",
        and_(le(n("offset"), k("MAX_LENGTH")), le(n("end"), k("MAX_LENGTH"))),
        "OFFSET_ERROR",
        "OffsetError",
        "offset {offset} out of range",
        (("offset", "offset"),),
    ),
    Rule(
        "unsegmented_offset",
        "fields",
        or_(n("segmented"), eq(n("offset"), 0)),
        "OFFSET_ERROR",
        "OffsetError",
        "an unsegmented message must have offset 0",
        (("offset", "offset"),),
    ),
    Rule(
        "empty_segment",
        "fields",
        or_(ne(n("data_length"), 0), n("last")),
        "SEGMENT_LENGTH_ZERO",
        "SegmentLengthZeroError",
        "only the last segment of a message may be empty",
        (("offset", "offset"), ("msg_seq_number", "msg_seq_number")),
    ),
    Rule(
        "end_within_stored",
        "fields",
        or_(unknown(n("stored_length")), le(n("end"), n("stored_length"))),
        "OFFSET_ERROR",
        "OffsetError",
        "segment [{offset}, {end}) runs past the stored length {stored_length}",
        (("offset", "offset"), ("end", "end"), ("stored_length", "stored_length")),
    ),
    Rule(
        "last_ends_message",
        "fields",
        or_(unknown(n("stored_length")), not_(n("last")), eq(n("end"), n("stored_length"))),
        "ORIGINAL_LENGTH_ERROR",
        "OriginalLengthError",
        "last segment ends at {end}, stored length is {stored_length}",
        (("end", "end"), ("stored_length", "stored_length")),
    ),
    Rule(
        "last_has_stored_length",
        "fields",
        or_(known(n("stored_length")), not_(n("last"))),
        "ORIGINAL_LENGTH_ERROR",
        "OriginalLengthError",
        "the last segment must carry the stored length",
        (("offset", "offset"),),
    ),
    Rule(
        "original_length_declared",
        "fields",
        or_(known(n("original_length")), n("length_deferred")),
        "ORIGINAL_LENGTH_ERROR",
        "OriginalLengthError",
        "OriginalLength must be declared in every segment unless the LENGTH_DEFERRED header flag is set",
        (("offset", "offset"), ("msg_seq_number", "msg_seq_number")),
    ),
    Rule(
        "last_has_totals",
        "fields",
        or_(not_(n("last")), and_(known(n("original_length")), n("has_message_checksum"))),
        "ORIGINAL_LENGTH_ERROR",
        "OriginalLengthError",
        "the last segment must carry the original length and the message checksum",
        (("offset", "offset"),),
    ),
    Rule(
        "uncompressed_lengths",
        "fields",
        or_(
            ne(n("codec"), k("Codec.NONE")),
            unknown(n("original_length")),
            unknown(n("stored_length")),
            eq(n("original_length"), n("stored_length")),
        ),
        "ORIGINAL_LENGTH_ERROR",
        "OriginalLengthError",
        "uncompressed message: original length {original_length} != stored length {stored_length}",
        (("original_length", "original_length"), ("stored_length", "stored_length")),
    ),
    Rule(
        "data_present",
        "data",
        ge(sub(n("length"), n("header_length")), n("data_length")),
        "TRUNCATED",
        "HeaderError",
        "header declares {data_length} data bytes, {length - header_length} present",
        (("declared", "data_length"), ("present", "length - header_length")),
    ),
    Rule(
        "data_ends",
        "data",
        le(sub(n("length"), n("header_length")), n("data_length")),
        "TRAILING_BYTES",
        "HeaderError",
        "{length - header_length - data_length} bytes after the {data_length} data bytes the header declares",
        (("declared", "data_length"), ("present", "length - header_length")),
    ),
)
ROUTING_STAGES = ("frame", "prefix", "header", "checksum")  # a row passing these has a trustworthy GroupId


def rules(*stages: str) -> tuple[Rule, ...]:
    """The rules of ``stages``, in table order (the order the decoders check them in)."""
    return tuple(r for r in RULES if r.stage in stages)


def names_in(e: Expr) -> set[str]:
    """The names an expression reads (derived names expanded)."""
    if isinstance(e, Name):
        inner = DERIVED.get(e.name) or FROM_HEADER_FLAGS.get(e.name)
        return {e.name} | (names_in(inner) if inner is not None else set())
    if isinstance(e, Op):
        return set().union(*(names_in(a) for a in e.args)) if e.args else set()
    return set()
