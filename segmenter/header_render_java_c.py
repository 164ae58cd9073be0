"""The header table (:mod:`segmenter.header_table`) rendered as Java and as C: the decoders compiled
elsewhere than Python.

``HeaderTable.java`` of the bundled jar (:func:`java_source`, the Spark fast path's decoder) and
``segmenter/_fastwire_table.h`` of the optional compiled ``decode_segment`` (:func:`c_source`) share
what Python and SQL do not need: fixed-width integers (Java's ``long`` and BigInteger, C's 128-bit
values), byte arrays declared once, ``&&`` and ``||``. They are kept together, apart from the Python
and SQL renderers (:mod:`segmenter.header_render`, which re-exports these names).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from . import header_table
from .header_expr import _BINARY, _BITS, constant
from .header_table import (
    CHECKSUM_FIELD,
    DERIVED,
    FIELD,
    FIELDS,
    FROM_HEADER_FLAGS,
    PREFIX_FIELDS,
    RULES,
    Const,
    Expr,
    Field,
    Name,
    Op,
    eq,
    names_in,
    rules,
)

# ----------------------------------------------------------------- Java and C
# The header's lengths, which Java and C declare under the table's own names, and the checksum's width.
_LENGTHS = {
    **{name: getattr(header_table, name) for name in ("PREFIX_LENGTH", "FIXED_LENGTH", "HEADER_LENGTH")},
    "CHECKSUM_WIDTH": CHECKSUM_FIELD.width,
}
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
            return f"Unsigned.{op}({r(args[0])}, {r(args[1])})"
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
                out += f"{i}{num} {f.name} = Unsigned.{read}(b, {f.offset}, {f.width});\n"
        return out

    src += fields(PREFIX_FIELDS)
    src += _java_checks(["prefix", "header"], env, exact, i, "return 0;")
    at = f"Unsigned.index(header_length) - {-CHECKSUM_FIELD.offset}"
    src += f"{i}{num} header_checksum = Unsigned.{read}(b, {at}, {CHECKSUM_FIELD.width});\n"
    src += f"{i}{num} header_crc = {'BigInteger.valueOf(' if exact else '('}Unsigned.crc32(b, 0, {at}));\n"
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
    src += "/** Generated from segmenter/header_table.py by tools/render.py: edit the table, not this file. */\n"
    src += "final class HeaderTable {\n"
    src += "    static final int " + ", ".join(f"{name} = {value}" for name, value in _LENGTHS.items()) + ";\n"
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
    src = "/* Generated from segmenter/header_table.py by tools/render.py: edit the table, not this file. */\n"
    src += "".join(f"#define {name} {value}\n" for name, value in _LENGTHS.items()) + "\n"
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
