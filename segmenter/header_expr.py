"""A rule's expression of the header table (:mod:`segmenter.header_table`) as Python or as Spark SQL.

The two spell most operators alike, so one walk of the expression renders both; the renderers of
whole files (:mod:`segmenter.header_render` for the Python decoder and the SQL,
:mod:`segmenter.header_render_java_c` for Java and C) build on it, and the named constants a rule
reads resolve here (:func:`constant`) for all four.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from .header_table import (
    Const,
    Expr,
    Name,
)


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
    """``e`` as Python or as Spark SQL (the two spell most operators alike), every operation in parentheses."""

    def r(x: Expr | int) -> str:
        return _render(x, env, names, sql)

    if isinstance(e, int):
        return str(e)
    if isinstance(e, Name):
        return names.get(e.name, f"`{e.name}`" if sql else e.name)
    if isinstance(e, Const):
        value = constant(e.name, env)
        if isinstance(value, bytes):
            return f"X'{value.hex().upper()}'" if sql else _literal(value)
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
    if op in ("in", "not_in"):
        assert isinstance(args[1], Const)
        enum = constant(args[1].name, env)
        members = [str(int(m.value)) for m in enum] if isinstance(enum, type) and issubclass(enum, Enum) else []
        values = f"{members[0]}," if len(members) == 1 and not sql else ", ".join(members)  # a Python 1-tuple
        word = {"in": "in", "not_in": "not in"}[op]
        return f"({r(args[0])} {word.upper() if sql else word} ({values}))"
    symbol = _BINARY.get(op) or _BITS[op]
    if sql and op == "eq":
        symbol = "="
    return f"({r(args[0])} {symbol} {r(args[1])})"


def python_expr(e: Expr | int, env: Mapping[str, Any], names: Mapping[str, str] | None = None) -> str:
    """``e`` as a Python expression over locals of its names (``names`` renames some)."""
    return _render(e, env, names or {}, sql=False)


def sql_expr(e: Expr, env: Mapping[str, Any], names: Mapping[str, str] | None = None) -> str:
    """``e`` as a Spark SQL expression over columns of its names (``names`` renames some)."""
    return _render(e, env, names or {}, sql=True)


def _literal(value: str | bytes, prefix: str = "") -> str:
    """A str or bytes literal, in double quotes where that needs no escape (as the repository writes them)."""
    text = repr(value)
    quote = text.index("'") if "'" in text[:2] else -1  # after a b prefix, if any
    if quote >= 0 and '"' not in text and "\\'" not in text:
        text = text[:quote] + '"' + text[quote + 1 : -1] + '"'
    return prefix + text
