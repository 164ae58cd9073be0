"""The segment header as data: every field and every validation rule, in one table.

Every decoder is *generated* from this table, so a change to the format is
made here and nowhere else:

* :func:`python_source` renders the Python decoder and validator
  (``check_prefix``, ``decode_header``, ``decode_segment``,
  ``_check_header_fields``); :mod:`segmenter.wire` compiles it once at import.
* :func:`sql_fields`, :func:`sql_derived` and :func:`sql_rules` render the same
  fields and rules as Spark SQL (used by ``reassembly/spark``).
* :func:`java_source` renders them as Java, ``HeaderTable.java`` of the bundled
  jar (its ``Decode``, the Spark fast path's decoder); ``tools/build_jar.py``
  writes it and CI checks the committed file is what the table renders.
* :func:`c_source` renders them as C, ``segmenter/_fastwire_table.h`` of the
  optional compiled ``decode_segment`` (``segmenter/_fastwire.c``);
  ``tools/render_c_table.py`` writes it and a test checks the committed file.

A rule is a predicate (a small expression tree over field names, derived
names, parameters and named constants of :mod:`segmenter.wire` /
:mod:`segmenter.flags`) that a valid segment satisfies, with the reason code
and error raised when it does not. Rules run in table order: the first one
that fails names the reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Union


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
    """A named constant of segmenter.wire / segmenter.flags (``"MsgFlags.SEGMENT"``, an enum for ``in``)."""

    name: str


@dataclass(frozen=True)
class Op:
    op: str
    args: tuple[Expr, ...]


Expr = Union[Name, Const, Op]  # noqa: UP007 (a runtime alias)


def n(name: str) -> Name:
    return Name(name)


def k(name: str) -> Const:
    return Const(name)


def _op(op: str) -> Callable[..., Op]:
    return lambda *args: Op(op, tuple(args))


eq, ne, le, lt, ge, gt = (_op(o) for o in ("eq", "ne", "le", "lt", "ge", "gt"))
and_, or_, not_, add, sub, band, bor, bnot, isin, length_of = (
    _op(o) for o in ("and", "or", "not", "add", "sub", "band", "bor", "bnot", "in", "len")
)


def unknown(e: Expr) -> Op:
    return eq(e, k("UNKNOWN_LENGTH"))


def known(e: Expr) -> Op:
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
    return Rule(
        f"{field}_limit",
        "fields",
        or_(unknown(n(field)), le(n(field), n("max_message_size"))),
        "MSG_TOO_BIG",
        "MessageTooBigError",
        f"declared {field} {{{field}}} exceeds the limit {{max_message_size}}",
        (("declared", field), ("limit", "max_message_size"), ("field", repr(field))),
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
        eq(sub(n("length"), n("header_length")), n("data_length")),
        "TRUNCATED",
        "HeaderError",
        "header declares {data_length} data bytes, {length - header_length} present",
        (("declared", "data_length"), ("present", "length - header_length")),
    ),
)
ROUTING_STAGES = ("frame", "prefix", "header", "checksum")  # a row passing these has a trustworthy GroupId


def rules(*stages: str) -> tuple[Rule, ...]:
    return tuple(r for r in RULES if r.stage in stages)


def names_in(e: Expr) -> set[str]:
    """The names an expression reads (derived names expanded)."""
    if isinstance(e, Name):
        inner = DERIVED.get(e.name) or FROM_HEADER_FLAGS.get(e.name)
        return {e.name} | (names_in(inner) if inner is not None else set())
    if isinstance(e, Op):
        return set().union(*(names_in(a) for a in e.args)) if e.args else set()
    return set()


# ----------------------------------------------------------------- rendering
def constant(name: str, env: Mapping[str, Any]) -> Any:
    """Resolve ``name`` (``"MsgFlags.SEGMENT"`` too) in ``env``."""
    head, *rest = name.split(".")
    value = env[head]
    for part in rest:
        value = getattr(value, part)
    return value


_BINARY = {"eq": "==", "ne": "!=", "le": "<=", "lt": "<", "ge": ">=", "gt": ">", "add": "+", "sub": "-"}
_BITS = {"band": "&", "bor": "|"}


def _render(e: Expr | int, env: Mapping[str, Any], names: Mapping[str, str], sql: bool) -> str:
    def r(x: Expr | int) -> str:
        return _render(x, env, names, sql)

    if isinstance(e, int):
        return str(e)
    if isinstance(e, Name):
        return names.get(e.name, f"`{e.name}`" if sql else e.name)
    if isinstance(e, Const):
        value = constant(e.name, env)
        if isinstance(value, bytes):
            return f"X'{value.hex().upper()}'" if sql else repr(value)
        return str(int(value))
    op, args = e.op, e.args
    if op in ("and", "or"):
        return "(" + f" {op.upper() if sql else op} ".join(r(a) for a in args) + ")"
    if op == "not":
        return f"(NOT {r(args[0])})" if sql else f"(not {r(args[0])})"
    if op == "bnot":
        return f"(~{r(args[0])})"
    if op == "len":
        return f"length({r(args[0])})" if sql else f"len({r(args[0])})"
    if op == "in":
        assert isinstance(args[1], Const)
        enum = constant(args[1].name, env)
        values = ", ".join(str(int(m.value)) for m in enum) if isinstance(enum, type) and issubclass(enum, Enum) else ""
        return f"({r(args[0])} IN ({values}))" if sql else f"({r(args[0])} in ({values},))"
    symbol = _BINARY.get(op) or _BITS[op]
    if sql and op == "eq":
        symbol = "="
    return f"({r(args[0])} {symbol} {r(args[1])})"


def python_expr(e: Expr, env: Mapping[str, Any], names: Mapping[str, str] | None = None) -> str:
    return _render(e, env, names or {}, sql=False)


def sql_expr(e: Expr, env: Mapping[str, Any], names: Mapping[str, str] | None = None) -> str:
    return _render(e, env, names or {}, sql=True)


# ----------------------------------------------------------------- the Python decoder
def _raise(rule: Rule, env: Mapping[str, Any], indent: str) -> str:
    details = "".join(f", {key}={value}" for key, value in rule.details)
    return (
        f"{indent}if not {python_expr(rule.predicate, env)}:\n"
        f"{indent}    raise {rule.error}(f{rule.message!r}, reason=Reason.{rule.reason}{details})\n"
    )


def _derive(
    needed: Iterable[Rule], table: Mapping[str, Expr], env: Mapping[str, Any], indent: str, always: Iterable[str] = ()
) -> str:
    """Assignments of the derived names the rules (or ``always``) use, in table order."""
    used = set(always)
    for r in needed:
        used |= names_in(r.predicate) | set(re.findall(r"\w+", r.message + " ".join(v for _, v in r.details)))
    return "".join(f"{indent}{name} = {python_expr(e, env)}\n" for name, e in table.items() if name in used)


def _names(fields: Iterable[Field]) -> str:
    return ", ".join(f.name for f in fields)


def _flat(i: str) -> str:
    """``view``: the bytes of ``buf`` as one flat run (a strided, typed or multi-dimensional buffer
    is counted in items, and ``struct`` refuses a strided one: copied or cast by ``byte_view``)."""
    return (
        f"{i}view = memoryview(buf)\n"
        f"{i}if view.ndim != 1 or view.itemsize != 1 or not view.c_contiguous:\n{i}{i}view = byte_view(view)\n"
    )


def _header(i: str, env: Mapping[str, Any]) -> str:
    """Statements that decode and check the header at the start of ``view`` (``length`` bytes) into
    ``header``, leaving every field in a local of its name (``algorithm`` as its number)."""
    src = "".join(_raise(r, env, i) for r in rules("frame"))
    # Every fixed field at once when the bytes hold them (one unpack per segment instead of two);
    # the rules still read only the prefix's fields until the checksum passed. Shorter: the prefix
    # alone, and the header rule (length >= header_length >= 84) refuses it before the rest is read.
    src += f"{i}if length >= {FIXED_LENGTH}:\n{i}{i}{_names(FIELDS)} = _FIXED.unpack_from(view)\n"
    src += f"{i}else:\n{i}{i}{_names(PREFIX_FIELDS)} = _PREFIX.unpack_from(view)\n"
    src += "".join(_raise(r, env, i) for r in rules("prefix", "header"))
    src += f"{i}header_checksum = int.from_bytes(view[header_length - {CHECKSUM_FIELD.width} : header_length], 'big')\n"
    src += f"{i}header_crc = _HEADER_CRC(view[: header_length - {CHECKSUM_FIELD.width}], 0)\n"
    src += "".join(_raise(r, env, i) for r in rules("checksum"))
    rest = rules("raw", "fields")
    src += _derive(rest, FROM_HEADER_FLAGS | DERIVED, env, i, FROM_HEADER_FLAGS)
    src += "".join(_raise(r, env, i) for r in rest)
    src += (
        f"{i}extension = view[{FIXED_LENGTH} : header_length - {CHECKSUM_FIELD.width}].tobytes()"
        f" if header_length > {HEADER_LENGTH} else b''\n"
    )
    values = {
        "codec": "_CODECS[codec]",
        "algorithm": "_ALGORITHMS[algorithm]",
        "message_checksum": "message_checksum if has_message_checksum else None",
    }
    # tuple.__new__ directly: a NamedTuple's own __new__ is a Python function, called per segment
    args = ", ".join(values.get(f, f) for f in env["SegmentHeader"]._fields)
    return src + f"{i}header = _tuple_new(SegmentHeader, ({args},))\n"


def python_source(env: Mapping[str, Any]) -> str:
    """Source of ``check_prefix``, ``decode_header``, ``decode_segment`` and ``_check_header_fields``.

    ``env`` is the namespace it is compiled in (segmenter.wire's globals): it resolves the
    constants, error classes, ``SegmentHeader``, ``verify_data`` and the struct helpers.
    """
    i = "    "
    header_fields = env["SegmentHeader"]._fields
    fields_rules = rules("fields")
    own = {"has_message_checksum": "message_checksum is not None"}
    src = "def _check_header_fields(h, max_message_size):\n"
    src += f'{i}"""Range and consistency rules that need no data (generated from segmenter.header_table)."""\n'
    src += f"{i}{', '.join(header_fields)} = h\n"
    src += "".join(f"{i}{name} = {value}\n" for name, value in own.items())
    src += _derive(fields_rules, DERIVED, env, i)
    src += "".join(_raise(r, env, i) for r in fields_rules)

    src += "\n\ndef check_prefix(buf, max_header_length=MAX_HEADER_LENGTH):\n"
    src += f'{i}"""Check magic, version and header length (the first {PREFIX_LENGTH} bytes); return it."""\n'
    src += _flat(i)
    src += f"{i}if view.nbytes < {PREFIX_LENGTH}:\n"
    src += f"{i}{i}raise HeaderError('the prefix needs {PREFIX_LENGTH} bytes', reason=Reason.TRUNCATED)\n"
    src += f"{i}{_names(PREFIX_FIELDS)} = _PREFIX.unpack_from(view)\n"
    src += "".join(_raise(r, env, i) for r in rules("prefix"))
    src += f"{i}return header_length\n"

    src += "\n\ndef decode_header(buf, *, max_message_size=MAX_LENGTH, max_header_length=MAX_HEADER_LENGTH):\n"
    src += f'{i}"""Parse and validate a header from the start of ``buf`` (data not needed)."""\n'
    src += _flat(i) + f"{i}length = len(view)\n" + _header(i, env)
    src += f"{i}return header\n"

    # The header's decoding is written into decode_segment again, not called: a broker receive decodes
    # one segment per delivery, and the call, a second flattening and the data checksum's two calls
    # were a tenth of it. The data checksum is compared here; verify_data explains a mismatch.
    src += "\n\ndef decode_segment(buf, *, max_segment_size=DEFAULT_MAX_SEGMENT_SIZE, max_message_size=MAX_LENGTH,"
    src += " verify=True):\n"
    src += f'{i}"""Decode one whole encoded segment; the data is a view into ``buf`` (no copy)."""\n'
    src += _flat(i) + f"{i}length = len(view)\n{i}max_header_length = MAX_HEADER_LENGTH\n"
    src += "".join(_raise(r, env, i) for r in rules("segment"))
    src += _header(i, env)
    src += "".join(_raise(r, env, i) for r in rules("data"))
    src += f"{i}data = view[header_length:]\n"
    src += f"{i}if verify and _DATA_CRC[algorithm](data, 0) != data_checksum:\n{i}{i}verify_data(header, data)\n"
    src += f"{i}return _tuple_new(Segment, (header, data))\n"
    return src


# ----------------------------------------------------------------- Spark SQL
def _sql_uint(raw: str, start: str, width: int) -> str:
    """Unsigned big-endian integer of ``width`` bytes at the 1-based SQL position ``start``.

    Up to 4 bytes as BIGINT; 8 bytes as DECIMAL(20,0), exact for every unsigned value, so the
    rules compare exactly what Python compares (2^64-1 included).
    """
    kind = "BIGINT" if width <= 4 else "DECIMAL(20,0)"
    return f"CAST(conv(hex(substring({raw}, {start}, {width})), 16, 10) AS {kind})"


def sql_fields(raw: str) -> dict[str, str]:
    """SQL for every field, ``header_checksum``, ``header_crc`` and ``length`` of the binary column ``raw``.

    ``header_checksum`` and ``header_crc`` read the column ``header_length`` (select it first).
    """
    out = {"length": f"length({raw})"}
    for f in FIELDS:
        start = str(f.offset + 1)
        out[f.name] = f"substring({raw}, {start}, {f.width})" if f.kind == "bytes" else _sql_uint(raw, start, f.width)
    back = -CHECKSUM_FIELD.offset
    out["header_checksum"] = _sql_uint(raw, f"header_length - {back - 1}", CHECKSUM_FIELD.width)
    out["header_crc"] = f"crc32(substring({raw}, 1, header_length - {back}))"
    return out


def sql_derived(env: Mapping[str, Any]) -> dict[str, str]:
    """SQL for the derived names, over the field columns."""
    return {name: sql_expr(e, env) for name, e in (FROM_HEADER_FLAGS | DERIVED).items()}


def sql_rules(stages: Iterable[str], env: Mapping[str, Any], params: Mapping[str, int]) -> str:
    """One boolean SQL expression: every rule of ``stages`` holds (NULL on rows too short to read)."""
    names = {p: str(v) for p, v in params.items()}
    return " AND ".join(sql_expr(r.predicate, env, names) for r in RULES if r.stage in stages)


# ----------------------------------------------------------------- Java and C
_C_LOGIC = ("and", "or", "not")


def _c_logic(op: str, args: list[str]) -> str:
    """``and``, ``or`` or ``not`` (one of :data:`_C_LOGIC`) over rendered operands, as Java and C spell them."""
    if op == "not":
        return f"(!{args[0]})"
    return "(" + (" && " if op == "and" else " || ").join(args) + ")"


def _bytes_name(c: Const) -> str:
    """The name Java and C give a bytes constant (an array declared once at the top)."""
    return f"C_{c.name.replace('.', '_')}"


# ----------------------------------------------------------------- Java (the bundled jar)
# Two renderings of each rule: over ``long`` (unsigned 64-bit values, compared unsigned; ``add`` and
# ``sub`` throw ArithmeticException where the exact result leaves 0..2^64-1) and over BigInteger
# (exact, for the rows that throw). Booleans stay booleans in both.
_BOOLEAN_OPS = {"eq", "ne", "le", "lt", "ge", "gt", "and", "or", "not", "in"}
_JAVA_COMPARE = {"le": "<= 0", "lt": "< 0", "ge": ">= 0", "gt": "> 0"}
_JAVA_BITS = {"band": ("&", "and"), "bor": ("|", "or")}
_PARAMS = ("max_message_size", "max_header_length", "max_segment_size")


def _is_bool(e: Expr | int) -> bool:
    if isinstance(e, Name):
        derived = FROM_HEADER_FLAGS.get(e.name) or DERIVED.get(e.name)
        return derived is not None and _is_bool(derived)
    return isinstance(e, Op) and e.op in _BOOLEAN_OPS


def _is_bytes(e: Expr | int, env: Mapping[str, Any]) -> bool:
    if isinstance(e, Name):
        return e.name in FIELD and FIELD[e.name].kind == "bytes"
    return isinstance(e, Const) and isinstance(constant(e.name, env), bytes)


def _java_int(value: int, exact: bool) -> str:
    if exact:
        fits = -(1 << 63) <= value < 1 << 63
        return f"BigInteger.valueOf({value}L)" if fits else f'new BigInteger("{value}")'
    if not -(1 << 63) <= value < 1 << 64:
        raise ValueError(f"{value} does not fit 64 bits")
    return f"{value - (1 << 64) if value >= 1 << 63 else value}L"  # the unsigned value's bits


def java_expr(e: Expr | int, env: Mapping[str, Any], exact: bool) -> str:
    """``e`` as Java over locals of the names (see the section comment for the two renderings)."""

    def r(x: Expr | int) -> str:
        return java_expr(x, env, exact)

    if isinstance(e, int):
        return _java_int(e, exact)
    if isinstance(e, Name):
        return e.name
    if isinstance(e, Const):
        value = constant(e.name, env)
        return _bytes_name(e) if isinstance(value, bytes) else _java_int(int(value), exact)
    op, args = e.op, e.args
    if op in _C_LOGIC:
        return _c_logic(op, [r(a) for a in args])
    if op == "len":
        return f"BigInteger.valueOf({r(args[0])}.length)" if exact else f"((long) {r(args[0])}.length)"
    if op == "in":
        assert isinstance(args[1], Const)
        members = [int(m.value) for m in constant(args[1].name, env)]
        return "(" + " || ".join(java_expr(eq(args[0], m), env, exact) for m in members) + ")"
    if op == "bnot":
        return f"{r(args[0])}.not()" if exact else f"(~{r(args[0])})"
    if op in ("add", "sub"):
        if not exact:
            return f"U.{op}({r(args[0])}, {r(args[1])})"
        return f"{r(args[0])}.{'add' if op == 'add' else 'subtract'}({r(args[1])})"
    if op in _JAVA_BITS:
        symbol, method = _JAVA_BITS[op]
        return f"{r(args[0])}.{method}({r(args[1])})" if exact else f"({r(args[0])} {symbol} {r(args[1])})"
    a, b = args
    if any(isinstance(x, Op) and x.op == "bnot" for x in args):
        raise ValueError("a complement compares differently in Python and in 64 bits: use it under band only")
    if _is_bytes(a, env):
        same = f"java.util.Arrays.equals({r(a)}, {r(b)})"
        return same if op == "eq" else f"(!{same})"
    if _is_bool(a) or _is_bool(b):
        return f"({r(a)} {'==' if op == 'eq' else '!='} {r(b)})"
    if op in ("eq", "ne"):
        same = f"({r(a)}.compareTo({r(b)}) == 0)" if exact else f"({r(a)} == {r(b)})"
        return same if op == "eq" else f"(!{same})"
    cmp = f"{r(a)}.compareTo({r(b)})" if exact else f"Long.compareUnsigned({r(a)}, {r(b)})"
    return f"({cmp} {_JAVA_COMPARE[op]})"


def _java_checks(stages: Iterable[str], env: Mapping[str, Any], exact: bool, indent: str, fails: str) -> str:
    return "".join(f"{indent}if (!{java_expr(r.predicate, env, exact)}) {fails}\n" for r in rules(*stages))


def _java_verdict(env: Mapping[str, Any], exact: bool) -> str:
    """The body of ``verdict``: 0 framing fails, 1 routable but another rule fails, 2 every rule holds."""
    i, num = "        ", "BigInteger" if exact else "long"
    read = "big" if exact else "u"
    src = f"{i}{num} length = {'BigInteger.valueOf(total)' if exact else 'total'};\n"
    src += "".join(f"{i}{num} {p} = {f'BigInteger.valueOf({_camel(p)})' if exact else _camel(p)};\n" for p in _PARAMS)
    src += _java_checks(["frame"], env, exact, i, "return 0;")

    def fields(group: Iterable[Field]) -> str:
        out = ""
        for f in group:
            if f.kind == "bytes":
                out += f"{i}byte[] {f.name} = java.util.Arrays.copyOfRange(b, {f.offset}, {f.offset + f.width});\n"
            else:
                out += f"{i}{num} {f.name} = U.{read}(b, {f.offset}, {f.width});\n"
        return out

    src += fields(PREFIX_FIELDS)
    src += _java_checks(["prefix", "header"], env, exact, i, "return 0;")
    at = f"U.index(header_length) - {-CHECKSUM_FIELD.offset}"
    src += f"{i}{num} header_checksum = U.{read}(b, {at}, {CHECKSUM_FIELD.width});\n"
    src += f"{i}{num} header_crc = {'BigInteger.valueOf(' if exact else '('}U.crc32(b, 0, {at}));\n"
    src += _java_checks(["checksum"], env, exact, i, "return 0;")
    src += fields(f for f in FIELDS if f not in PREFIX_FIELDS)
    for name, e in (FROM_HEADER_FLAGS | DERIVED).items():
        src += f"{i}{'boolean' if _is_bool(e) else num} {name} = {java_expr(e, env, exact)};\n"
    src += _java_checks(["segment", "raw", "fields", "data"], env, exact, i, "return 1;")
    return src + f"{i}return 2;\n"


def _java_flag(name: str, env: Mapping[str, Any]) -> str:
    """A boolean derived name as a static method of the fields it reads (64-bit rendering only)."""
    e = (FROM_HEADER_FLAGS | DERIVED)[name]
    used = [f.name for f in FIELDS if f.name in names_in(e)]
    if not _is_bool(e) or {"add", "sub"} & _ops_in(e):
        raise ValueError(f"{name} is not a flag of the fields")
    args = ", ".join(f"long {u}" for u in used)
    return f"    static boolean {_camel(name)}({args}) {{\n        return {java_expr(e, env, False)};\n    }}\n"


def _ops_in(e: Expr | int) -> set[str]:
    return {e.op}.union(*(_ops_in(a) for a in e.args)) if isinstance(e, Op) else set()


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


JAVA_FLAGS = ("has_message_checksum", "length_deferred", "last", "in_group")


def java_source(env: Mapping[str, Any]) -> str:
    """``HeaderTable.java`` of the bundled jar: the fields' places, every rule (``verdict``) and the flags
    the JVM's decoder needs (``Decode.java``), rendered from this table like the Python and the SQL."""
    consts = sorted(
        {c.name for r in RULES for c in _consts_in(r.predicate) if isinstance(constant(c.name, env), bytes)}
    )
    src = "package segmenter.jvm;\n\nimport java.math.BigInteger;\n\n"
    src += "/** Generated from segmenter/header_table.py by tools/build_jar.py: edit the table, not this file. */\n"
    src += "final class HeaderTable {\n"
    src += f"    static final int PREFIX_LENGTH = {PREFIX_LENGTH}, FIXED_LENGTH = {FIXED_LENGTH}"
    src += f", HEADER_LENGTH = {HEADER_LENGTH}, CHECKSUM_WIDTH = {CHECKSUM_FIELD.width};\n"
    for f in FIELDS:
        src += f"    static final int AT_{f.name.upper()} = {f.offset}, WIDTH_{f.name.upper()} = {f.width};\n"
    for name in consts:
        value = constant(name, env)
        items = ", ".join(str(x - 256 if x > 127 else x) for x in value)
        src += f"    private static final byte[] {_bytes_name(Const(name))} = {{{items}}};\n"
    src += "\n    private HeaderTable() {}\n\n"
    src += "    /**\n     * The verdict on a segment of {@code total} bytes whose first bytes are {@code b}: at least\n"
    src += "     * its declared header length held to HEADER_LENGTH..maxHeaderLength, or all {@code total} if\n"
    src += "     * fewer (no rule reads more). 0 the framing fails (not routable), 1 routable but another rule\n"
    src += "     * fails, 2 every rule holds.\n     */\n"
    params = ", ".join(["total", *(_camel(p) for p in _PARAMS)])
    sig = f"(byte[] b, long total, {', '.join('long ' + _camel(p) for p in _PARAMS)})"
    src += f"    static int verdict{sig} {{\n        try {{\n"
    src += f"            return verdict64(b, {params});\n"
    src += "        } catch (ArithmeticException outside64) {\n"
    src += f"            return verdictExact(b, {params});\n"
    src += "        }\n    }\n\n"
    src += f"    private static int verdict64{sig} {{\n{_java_verdict(env, False)}    }}\n\n"
    src += f"    private static int verdictExact{sig} {{\n{_java_verdict(env, True)}    }}\n"
    for name in JAVA_FLAGS:
        src += "\n" + _java_flag(name, env)
    return src + "}\n"


def _consts_in(e: Expr | int) -> list[Const]:
    if isinstance(e, Const):
        return [e]
    return [c for a in e.args for c in _consts_in(a)] if isinstance(e, Op) else []


# ----------------------------------------------------------------- C (the optional compiled decoder)
# Every value is a signed 128-bit integer: each field fits 64 bits unsigned, so a sum, a difference
# or a complement under ``band`` computes exactly what Python's integers compute.
def c_expr(e: Expr | int, env: Mapping[str, Any]) -> str:
    """``e`` as C over the locals ``f.<field>``, the derived names and the parameters."""

    def r(x: Expr | int) -> str:
        return c_expr(x, env)

    if isinstance(e, int):
        return f"((i128){e}ULL)"
    if isinstance(e, Name):
        return f"f->{e.name}" if e.name in FIELD or e.name in FROM_HEADER_FLAGS else e.name
    if isinstance(e, Const):
        value = constant(e.name, env)
        return _bytes_name(e) if isinstance(value, bytes) else r(int(value))
    op, args = e.op, e.args
    if op in _C_LOGIC:
        return _c_logic(op, [r(a) for a in args])
    if op == "bnot":
        return f"(~{r(args[0])})"
    if op == "len":
        (a,) = args
        assert isinstance(a, Name) and FIELD[a.name].kind == "bytes"
        return r(FIELD[a.name].width)
    if op == "in":
        assert isinstance(args[1], Const)
        return "(" + " || ".join(c_expr(eq(args[0], int(m.value)), env) for m in constant(args[1].name, env)) + ")"
    a, b = args
    if _is_bytes(a, env):
        assert isinstance(a, Name) and op in ("eq", "ne")
        return f"(memcmp({r(a)}, {r(b)}, {FIELD[a.name].width}) {_BINARY[op]} 0)"
    return f"({r(a)} {_BINARY.get(op) or _BITS[op]} {r(b)})"


def c_source(env: Mapping[str, Any]) -> str:
    """``segmenter/_fastwire_table.h``: the fields and ``verdict``, every rule as C, for the optional
    compiled decoder (``segmenter/_fastwire.c``). It accepts a segment only when every rule holds;
    anything else goes to the Python decoder, whose error (the first rule that fails) is the one raised."""
    i = "    "
    consts = sorted(
        {c.name for r in RULES for c in _consts_in(r.predicate) if isinstance(constant(c.name, env), bytes)}
    )
    src = "/* Generated from segmenter/header_table.py (c_source): edit the table, not this file. */\n"
    src += f"#define PREFIX_LENGTH {PREFIX_LENGTH}\n#define FIXED_LENGTH {FIXED_LENGTH}\n"
    src += f"#define HEADER_LENGTH {HEADER_LENGTH}\n#define CHECKSUM_WIDTH {CHECKSUM_FIELD.width}\n\n"
    for name in consts:
        value = constant(name, env)
        items = ", ".join(map(str, value))
        src += f"static const unsigned char {_bytes_name(Const(name))}[{len(value)}] = {{{items}}};\n"
    src += "\ntypedef struct {\n"
    for f in FIELDS:
        src += f"{i}const unsigned char *{f.name};\n" if f.kind == "bytes" else f"{i}i128 {f.name};\n"
    src += "".join(f"{i}int {name};\n" for name in FROM_HEADER_FLAGS)
    src += "} fields;\n\n"

    def read(group: Iterable[Field]) -> str:
        at = {x: f"b + {x.offset}" if x.kind == "bytes" else f"be(b + {x.offset}, {x.width})" for x in group}
        return "".join(f"{i}f->{x.name} = {value};\n" for x, value in at.items())

    def checks(*stages: str) -> str:
        return "".join(f"{i}if (!{c_expr(r.predicate, env)}) return 0;\n" for r in rules(*stages))

    params = "".join(f", i128 {p}" for p in _PARAMS)
    src += "/* 1 when every rule holds for the segment of ``length`` bytes at ``b`` (its fields in ``f``), else 0.\n"
    src += "   Reads no byte past what the rules checked before it: the prefix once ``length`` holds it,\n"
    src += "   the rest once the declared header length is in range and present. */\n"
    src += f"static int verdict(const unsigned char *b, i128 length{params}, fields *f) {{\n"
    src += checks("segment", "frame") + read(PREFIX_FIELDS) + checks("prefix", "header")
    at = f"(Py_ssize_t)f->header_length - {-CHECKSUM_FIELD.offset}"
    src += f"{i}i128 header_checksum = be(b + {at}, {CHECKSUM_FIELD.width});\n"
    src += f"{i}i128 header_crc = crc32_ieee(b, {at});\n"
    src += checks("checksum") + read(f for f in FIELDS if f not in PREFIX_FIELDS)
    for name, e in FROM_HEADER_FLAGS.items():
        src += f"{i}f->{name} = {c_expr(e, env)};\n"
    used = set().union(*(names_in(r.predicate) for r in RULES))
    for name, e in DERIVED.items():
        src += f"{i}i128 {name} = {c_expr(e, env)};\n" if name in used else ""
    return src + checks("raw", "fields", "data") + f"{i}return 1;\n}}\n"
