"""The header table (:mod:`segmenter.header_table`) rendered: as Python, Spark SQL, Java and C.

One table, four readers of it, so that they agree by construction:

* :func:`python_source` renders the Python decoder and validator (``check_prefix``,
  ``decode_header``, ``decode_segment``, ``_check_header_fields``) as a module,
  ``segmenter/_decoder.py``, committed so that it can be read and stepped through;
  :mod:`segmenter.wire` imports it.
* :func:`sql_fields`, :func:`sql_derived` and :func:`sql_rules` render the same fields and rules
  as Spark SQL, built at run time by ``reassembly/spark``.
* :func:`java_source` renders them as Java, ``HeaderTable.java`` of the bundled jar (its
  ``Decode``, the Spark fast path's decoder).
* :func:`c_source` renders them as C, ``segmenter/_fastwire_table.h`` of the optional compiled
  ``decode_segment`` (``segmenter/_fastwire.c``).

``python tools/render.py`` writes the three committed renderings (``--check`` compares), and tests
fail when a committed one is not what the table renders. Every renderer takes ``env``, the
namespace the rules' named constants resolve in (:func:`segmenter.model.table_constants`).

This module renders Python and SQL; an expression's walk that both share is
:mod:`segmenter.header_expr`, and the Java and C renderers are :mod:`segmenter.header_render_java_c`.
Every renderer named above is importable from here.
"""

from __future__ import annotations

import ast
import builtins
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .header_expr import _literal
from .header_expr import constant as constant
from .header_expr import python_expr as python_expr
from .header_expr import sql_expr as sql_expr
from .header_render_java_c import JAVA_FLAGS as JAVA_FLAGS
from .header_render_java_c import c_expr as c_expr
from .header_render_java_c import c_source as c_source
from .header_render_java_c import java_expr as java_expr
from .header_render_java_c import java_source as java_source
from .header_table import (
    CHECKSUM_FIELD,
    DERIVED,
    FIELDS,
    FIXED_LENGTH,
    FROM_HEADER_FLAGS,
    HEADER_LENGTH,
    PREFIX_FIELDS,
    PREFIX_LENGTH,
    RULES,
    Expr,
    Field,
    Op,
    Rule,
    names_in,
    not_,
    rules,
    struct_format,
)

# ----------------------------------------------------------------- the Python decoder (segmenter/_decoder.py)
# Each rule becomes ``if <the predicate's negation>: raise <its error>``, the condition spelled as one
# would write it (``a > b`` for ``not a <= b``, De Morgan for ``and`` and ``or``), so that the module
# reads like hand-written code; every line is held to WIDTH columns, so that it passes ``ruff check``
# like every other module, and every local is declared with its type, so that ``mypy --strict``
# checks the generated code rather than waving it through as ``Any``.
WIDTH = 120  # the repository's line length (pyproject.toml)
_I = "    "
_NEGATED = {"eq": "ne", "ne": "eq", "le": "gt", "gt": "le", "lt": "ge", "ge": "lt", "in": "not_in", "not_in": "in"}
_GENERATED = "# Generated from segmenter/header_table.py by `python tools/render.py`: edit the table, not this file.\n"
_DOCSTRING = '''"""The Python segment decoder: the header table's fields and rules as straight-line code.

Rendered from :mod:`segmenter.header_table` by :func:`segmenter.header_render.python_source` and
committed, so that it reads and steps like any module; ``python tools/render.py`` writes it, and
tests/segmenter/test_header_table.py fails when it is not what the table renders. Each rule is one
``if`` that raises the rule's error, in table order: the first rule that fails names the reason.
:mod:`segmenter.wire` re-exports these functions; where the optional compiled decoder was built
(``segmenter/_fastwire.c``, from the same table), it hands every segment it does not accept to
:func:`decode_segment` here, so the errors raised are always these.
"""
'''
# Where the decoder's free names come from: the standard library, these modules of ours, segmenter.errors
# for a rule's error (and Reason), and segmenter.model for every other name (the table's constants).
_STDLIB = ("struct",)
_FROM = {
    "buffers": ("Buffer",),
    "checksum": ("ChecksumAlgorithm", "checksum_function"),
    "flags": ("KNOWN_FLAGS", "Codec", "MsgFlags"),
    "sources": ("byte_view",),
}


def _negation(e: Expr | int) -> Expr:
    """``not e`` with the ``not`` pushed inward where an operator has a converse: true exactly when ``e`` is
    false (the values compared are integers, bytes and booleans, which have no NaN)."""
    if isinstance(e, Op):
        if e.op in _NEGATED:
            return Op(_NEGATED[e.op], e.args)
        if e.op in ("and", "or"):
            return Op("or" if e.op == "and" else "and", tuple(_negation(a) for a in e.args))
        if e.op == "not":
            (inner,) = e.args
            return inner
    return not_(e)


def _bare(text: str) -> str:
    """``text`` without the parentheses that enclose all of it, if they do (``(a) or (b)`` keeps its own)."""
    depth = 0
    for j, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return text[1:-1] if j == len(text) - 1 and j > 0 else text
    return text


def _split(e: Expr | int, env: Mapping[str, Any], indent: str, head: str, tail: str, bare: bool) -> list[str]:
    """``head + e + tail`` at ``indent``: one line where it fits, else ``e`` in parentheses of its own,
    split at its ``and`` / ``or`` (as ruff format splits a long condition). ``bare``: ``e`` is all of
    the expression, so its outermost parentheses can go."""
    text = python_expr(e, env)
    flat = indent + head + (_bare(text) if bare else text) + tail
    if len(flat) <= WIDTH:
        return [flat]
    inner = indent + _I
    if len(inner + _bare(text)) <= WIDTH:
        return [indent + head + "(", inner + _bare(text), indent + ")" + tail]
    if not (isinstance(e, Op) and e.op in ("and", "or")):
        raise ValueError(f"{text!r} passes {WIDTH} columns and has no 'and' or 'or' to split it at")
    lines = [indent + head + "("]
    for j, a in enumerate(e.args):
        lines += _split(a, env, inner, "" if j == 0 else f"{e.op} ", "", bare=False)
    return [*lines, indent + ")" + tail]


def _call(indent: str, head: str, args: Iterable[str]) -> list[str]:
    """``head(args)`` on one line, else its arguments on a line of their own, else one per line."""
    args = list(args)
    flat = f"{indent}{head}({', '.join(args)})"
    if len(flat) <= WIDTH:
        return [flat]
    inner = indent + _I
    if len(inner + ", ".join(args)) <= WIDTH:
        return [f"{indent}{head}(", inner + ", ".join(args), f"{indent})"]
    return [f"{indent}{head}(", *(f"{inner}{a}," for a in args), f"{indent})"]


def _unpack(indent: str, names: Iterable[str], value: str) -> list[str]:
    """``a, b, c = value``, the targets one per line in parentheses where one line would not fit (each
    target marked for :func:`_finish`, which may rename it, so the width is checked with the longer name)."""
    names = [f"${x}$" for x in names]
    flat = f"{indent}{', '.join(names)} = {value}"
    if len(flat) <= WIDTH:
        return [flat]
    return [f"{indent}(", *(f"{indent}{_I}{x}," for x in names), f"{indent}) = {value}"]


def _lines(lines: Iterable[str]) -> str:
    return "".join(line + "\n" for line in lines)


def _raise(rule: Rule, env: Mapping[str, Any], indent: str) -> str:
    """The rule as ``if`` its predicate fails, ``raise`` its error (an f-string message where it has fields)."""
    args = [_literal(rule.message, "f" if "{" in rule.message else ""), f"reason=Reason.{rule.reason}"]
    args += [f"{key}={value}" for key, value in rule.details]
    condition = _split(_negation(rule.predicate), env, indent, "if ", ":", bare=True)
    return _lines([*condition, *_call(indent + _I, f"raise {rule.error}", args)])


def _derive(
    needed: Iterable[Rule], table: Mapping[str, Expr], env: Mapping[str, Any], indent: str, always: Iterable[str] = ()
) -> str:
    """Assignments of the derived names the rules (or ``always``) use, in table order."""
    used = set(always)
    for r in needed:
        used |= names_in(r.predicate) | set(re.findall(r"\w+", r.message + " ".join(v for _, v in r.details)))
    return "".join(
        _lines(_split(e, env, indent, f"{name} = ", "", bare=True)) for name, e in table.items() if name in used
    )


def _declare(indent: str, fields: Iterable[Field]) -> str:
    """Each field's local declared with its type (``struct`` unpacks into ``Any``; mypy checks the rest),
    marked for :func:`_finish`, which drops the declarations of the fields the function does not read."""
    return "".join(f"{indent}${f.name}$: {'bytes' if f.kind == 'bytes' else 'int'}\n" for f in fields)


_MARKED = re.compile(r"\$(\w+)\$")  # no Python token has a $ (and no rule's message may: it would be read as one)
_MARKED_DECLARATION = re.compile(r"^ *\$(\w+)\$: \w+\n", re.MULTILINE)


def _finish(function: str) -> str:
    """``function`` with its marked names settled: an unpacked field it never reads becomes ``_<name>``
    (ruff refuses an unused unpacked name; the name still says which field it is), and its declaration goes."""
    read = {
        node.id
        for node in ast.walk(ast.parse(_MARKED.sub(r"\1", function)))
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }
    function = _MARKED_DECLARATION.sub(lambda m: m.group(0) if m.group(1) in read else "", function)
    return _MARKED.sub(lambda m: m.group(1) if m.group(1) in read else f"_{m.group(1)}", function)


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
    src += _declare(i, FIELDS)
    src += f"{i}# Every fixed field at once where the bytes hold them (one unpack per segment, not two); the\n"
    src += f"{i}# rules read only the prefix's fields until the header checksum passed. A shorter buffer: the\n"
    src += f"{i}# prefix alone, and the header rule (length >= header_length >= {HEADER_LENGTH}) refuses it first.\n"
    src += f"{i}if length >= {FIXED_LENGTH}:\n"
    src += _lines(_unpack(i + _I, (f.name for f in FIELDS), "_FIXED.unpack_from(view)"))
    src += f"{i}else:\n"
    src += _lines(_unpack(i + _I, (f.name for f in PREFIX_FIELDS), "_PREFIX.unpack_from(view)"))
    src += "".join(_raise(r, env, i) for r in rules("prefix", "header"))
    width = CHECKSUM_FIELD.width
    src += f'{i}header_checksum = int.from_bytes(view[header_length - {width} : header_length], "big")\n'
    src += f"{i}header_crc = _HEADER_CRC(view[: header_length - {width}], 0)\n"
    src += "".join(_raise(r, env, i) for r in rules("checksum"))
    rest = rules("raw", "fields")
    src += _derive(rest, FROM_HEADER_FLAGS | DERIVED, env, i, FROM_HEADER_FLAGS)
    src += "".join(_raise(r, env, i) for r in rest)
    src += (
        f"{i}extension = view[{FIXED_LENGTH} : header_length - {width}].tobytes()"
        f' if header_length > {HEADER_LENGTH} else b""\n'
    )
    values = {
        "codec": "_CODECS[codec]",
        "algorithm": "_ALGORITHMS[algorithm]",
        "message_checksum": "message_checksum if has_message_checksum else None",
    }
    args = [values.get(f, f) for f in env["SegmentHeader"]._fields]
    src += f"{i}# tuple.__new__ directly: a NamedTuple's own __new__ is a Python function, called per segment\n"
    flat = f"{i}header = _tuple_new(SegmentHeader, ({', '.join(args)}))"
    if len(flat) <= WIDTH:
        return src + flat + "\n"
    i2, i3 = i + _I, i + _I + _I
    lines = [f"{i}header = _tuple_new(", f"{i2}SegmentHeader,", f"{i2}(", *(f"{i3}{a}," for a in args), f"{i2}),"]
    return src + _lines([*lines, i + ")"])


def _preamble() -> str:
    """The decoder's module-level helpers: the structs of the table's fields, and lookups built once."""
    prefix, last = PREFIX_FIELDS[0].name, PREFIX_FIELDS[-1].name
    return (
        f'_PREFIX = struct.Struct("{struct_format(PREFIX_FIELDS)}")  # {prefix} .. {last}: enough to frame a header\n'
        f'_FIXED = struct.Struct("{struct_format(FIELDS)}")  # every fixed field (the header checksum follows)\n'
        "_HEADER_CRC = checksum_function(ChecksumAlgorithm.CRC32)  # the header checksum: CRC-32/IEEE, always\n"
        "_CODECS = {int(c): c for c in Codec}\n"
        "_ALGORITHMS = {int(a): a for a in ChecksumAlgorithm}\n"
        "_DATA_CRC = {int(a): checksum_function(a) for a in ChecksumAlgorithm}\n"
        "_tuple_new = tuple.__new__  # builds a NamedTuple without calling its (Python) __new__\n"
    )


def _functions(env: Mapping[str, Any]) -> str:
    """``_check_header_fields``, ``check_prefix``, ``decode_header`` and ``decode_segment``."""
    functions = (_fields_check(env), _check_prefix(env), _decode_header(env), _decode_segment(env))
    return "\n\n".join(_finish(f) for f in functions)


def _fields_check(env: Mapping[str, Any]) -> str:
    """``_check_header_fields``: the ``fields`` rules over a :class:`SegmentHeader` (the assembler checks a
    header it was handed, not decoded, with it)."""
    i = _I
    fields_rules = rules("fields")
    own = {"has_message_checksum": "message_checksum is not None"}
    src = "def _check_header_fields(h: SegmentHeader, max_message_size: int) -> None:\n"
    src += f'{i}"""Range and consistency rules that need no data (a header decoded, or built by a caller)."""\n'
    src += _lines(_unpack(i, env["SegmentHeader"]._fields, "h"))
    src += "".join(f"{i}{name} = {value}\n" for name, value in own.items())
    src += _derive(fields_rules, DERIVED, env, i)
    return src + "".join(_raise(r, env, i) for r in fields_rules)


def _check_prefix(env: Mapping[str, Any]) -> str:
    """``check_prefix``: the ``prefix`` rules alone (a stream decoder frames a header with it)."""
    i = _I
    src = "def check_prefix(buf: Buffer, max_header_length: int = MAX_HEADER_LENGTH) -> int:\n"
    src += f'{i}"""Check magic, version and header length (the first {PREFIX_LENGTH} bytes); return the latter.\n\n'
    src += f"{i}``buf``: the bytes, from the header's first. ``max_header_length``: the longest header accepted, "
    src += "in bytes.\n"
    src += f'{i}"""\n'
    src += _flat(i)
    src += f"{i}if view.nbytes < {PREFIX_LENGTH}:\n"
    src += f'{i}{i}raise HeaderError("the prefix needs {PREFIX_LENGTH} bytes", reason=Reason.TRUNCATED)\n'
    src += _declare(i, PREFIX_FIELDS)
    src += _lines(_unpack(i, (f.name for f in PREFIX_FIELDS), "_PREFIX.unpack_from(view)"))
    src += "".join(_raise(r, env, i) for r in rules("prefix"))
    return src + f"{i}return header_length\n"


def _decode_header(env: Mapping[str, Any]) -> str:
    """``decode_header``: every rule that needs no data."""
    i = _I
    src = "def decode_header(\n"
    src += f"{i}buf: Buffer, *, max_message_size: int = MAX_LENGTH, max_header_length: int = MAX_HEADER_LENGTH\n"
    src += ") -> SegmentHeader:\n"
    src += f'{i}"""Parse and validate a header from the start of ``buf`` (data not needed).\n\n'
    src += f"{i}``max_message_size``: the largest message the header may declare, in bytes. "
    src += "``max_header_length``: the longest\n"
    src += f'{i}header accepted, in bytes.\n{i}"""\n'
    src += _flat(i) + f"{i}length = len(view)\n" + _header(i, env)
    return src + f"{i}return header\n"


def _decode_segment(env: Mapping[str, Any]) -> str:
    """``decode_segment``: every rule, then the data checksum."""
    i = _I
    src = "def decode_segment(\n"
    src += f"{i}buf: Buffer,\n{i}*,\n{i}max_segment_size: int = DEFAULT_MAX_SEGMENT_SIZE,\n"
    src += f"{i}max_message_size: int = MAX_LENGTH,\n{i}verify: bool = True,\n) -> Segment:\n"
    src += f'{i}"""Decode one whole encoded segment; the data is a view into ``buf`` (no copy).\n\n'
    src += f"{i}The header's decoding is written out here again rather than called: a broker receive decodes one\n"
    src += f"{i}segment per delivery, and the call, a second flattening and the data checksum's two calls would be\n"
    src += f"{i}a tenth of it. The data checksum is compared here; ``verify_data`` explains a mismatch.\n\n"
    src += f"{i}``max_segment_size``: the largest segment accepted, header included, in bytes. "
    src += "``max_message_size``: the largest\n"
    src += f"{i}message the header may declare. ``verify``: True compares the data checksum; False skips it "
    src += "(for a caller that\n"
    src += f'{i}checks it later).\n{i}"""\n'
    src += _flat(i) + f"{i}length = len(view)\n{i}max_header_length = MAX_HEADER_LENGTH\n"
    src += "".join(_raise(r, env, i) for r in rules("segment"))
    src += _header(i, env)
    src += "".join(_raise(r, env, i) for r in rules("data"))
    src += f"{i}data = view[header_length:]\n"
    src += f"{i}if verify and _DATA_CRC[algorithm](data, 0) != data_checksum:\n{i}{i}verify_data(header, data)\n"
    src += f"{i}return _tuple_new(Segment, (header, data))\n"
    return src


def _imports(body: str, env: Mapping[str, Any]) -> str:
    """The import statements of every name ``body`` reads and does not bind (see :data:`_FROM`), as
    ruff's isort orders and wraps them."""
    loaded: set[str] = set()
    bound: set[str] = set(dir(builtins))
    for node in ast.walk(ast.parse(body)):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    errors = {r.error for r in RULES} | {"HeaderError", "Reason"}
    stdlib: list[str] = []
    ours: dict[str, list[str]] = {}
    for name in sorted(loaded - bound):
        module = next((m for m, names in _FROM.items() if name in names), None)
        if name in _STDLIB:
            stdlib.append(name)
            continue
        if module is None and name in errors:
            module = "errors"
        elif module is None and name in env:
            module = "model"
        elif module is None:
            raise ValueError(f"the rendered decoder reads {name!r}, which nothing it imports provides")
        ours.setdefault(module, []).append(name)

    def member(name: str) -> tuple[int, str]:  # constants, then classes, then the rest (ruff's order-by-type)
        return (0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2, name.lower())

    src = "".join(f"import {name}\n" for name in stdlib) + ("\n" if stdlib else "")
    for module in sorted(ours):
        names = sorted(ours[module], key=member)
        flat = f"from .{module} import {', '.join(names)}"
        wrapped = [f"from .{module} import (", *(f"{_I}{x}," for x in names), ")"]
        src += _lines([flat] if len(flat) <= WIDTH else wrapped)
    return src


def python_source(env: Mapping[str, Any]) -> str:
    """``segmenter/_decoder.py``: the module of ``check_prefix``, ``decode_header``, ``decode_segment`` and
    ``_check_header_fields``, with its imports and helpers.

    ``env`` resolves the rules' named constants and gives ``SegmentHeader``'s fields, whose order the
    decoder builds it in. Raises ValueError for a line that cannot be held to :data:`WIDTH`.
    """
    body = _preamble() + "\n\n" + _functions(env)
    src = _GENERATED + _DOCSTRING + "\nfrom __future__ import annotations\n\n" + _imports(body, env) + "\n" + body
    long = [line for line in src.splitlines() if len(line) > WIDTH]
    if long:
        raise ValueError(f"rendered lines pass {WIDTH} columns: {long}")
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


