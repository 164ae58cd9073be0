"""The reference pages generated from the code: the API (every ``__all__``) and the reason codes.

A page holds a marker line that is replaced, when Sphinx reads the page, by Markdown (MyST)
generated from the code:

``<!-- api: PACKAGE -->``
    an autodoc entry for every public name of every module of that group (see ``GROUPS``) that
    declares ``__all__``: a name several modules export is documented once, where the shortest
    module path exports it, and listed with a link under the others;
``<!-- reason-codes -->``
    the table of :class:`segmenter.Reason`: code, name, IBM MQ's name where MQ has the code, and
    what it means (the member's comment in ``segmenter/errors.py``).

A reference to a name a module re-exports (``reassembly.assembler.Assembler``) resolves to where
it is documented (``reassembly.Assembler``); an unresolved ``py`` reference to one of our names
written on a page (not one made from a type hint in the API pages) is a warning, so
``sphinx-build -W`` fails on it.

``tests/test_docs_site.py`` checks that the enumeration covers every module with ``__all__``.
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import importlib
import inspect
import io
import pkgutil
import re
import tokenize
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

PACKAGES = ("segmenter", "reassembly", "refmsg")

# The API pages: a page per group, each group the modules whose dotted path starts with one of its
# prefixes (longest prefix wins). Every module with ``__all__`` falls in exactly one group.
GROUPS: dict[str, tuple[str, ...]] = {
    "segmenter": ("segmenter",),
    "reassembly": ("reassembly",),
    "reassembly.spark": ("reassembly.spark",),
    "reassembly.cli": ("reassembly.cli",),
    "refmsg": ("refmsg",),
}

API_MARKER = re.compile(r"^<!-- api: (?P<group>[\w.]+) -->$", re.M)
REASON_MARKER = re.compile(r"^<!-- reason-codes -->$", re.M)


@dataclass(frozen=True)
class Entry:
    """One public name of one module's ``__all__``."""

    module: str
    name: str
    kind: str  # "class", "exception", "function", "data"
    canonical: str  # the dotted path where it is documented (itself, or the shortest exporter's)

    @property
    def path(self) -> str:
        return f"{self.module}.{self.name}"


def _kind(obj: Any) -> str:
    if isinstance(obj, type):
        return "exception" if issubclass(obj, BaseException) else "class"
    if callable(obj) and (
        hasattr(obj, "__code__") or type(obj).__name__ in ("builtin_function_or_method", "cython_function_or_method")
    ):
        return "function"
    return "data"


@cache
def public_modules() -> tuple[str, ...]:
    """Every module of our packages that declares ``__all__`` (``__main__`` modules are not imported)."""
    found = []
    for top in PACKAGES:
        package = importlib.import_module(top)
        names = [top] + [
            info.name
            for info in pkgutil.walk_packages(package.__path__, f"{top}.")
            if info.name.rsplit(".", 1)[-1] != "__main__"
        ]
        for name in names:
            if hasattr(importlib.import_module(name), "__all__"):
                found.append(name)
    return tuple(sorted(found))


def group_of(module: str) -> str:
    matching = [
        (len(prefix), group)
        for group, prefixes in GROUPS.items()
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    if not matching:
        raise LookupError(f"{module} declares __all__ but no API page's group holds it (docs/_ext/reference.py)")
    return max(matching)[1]


@cache
def entries() -> tuple[Entry, ...]:
    """Every (module, name) of every ``__all__``, with where each object is documented."""
    exporters: dict[tuple[str, int], list[str]] = {}
    listed: list[tuple[str, str, Any]] = []
    for module in public_modules():
        mod = importlib.import_module(module)
        for name in mod.__all__:
            obj = getattr(mod, name)
            listed.append((module, name, obj))
            exporters.setdefault((name, id(obj)), []).append(module)
    out = []
    for module, name, obj in listed:
        home = min(exporters[(name, id(obj))], key=lambda m: (m.count("."), m))
        out.append(Entry(module, name, _kind(obj), f"{home}.{name}"))
    return tuple(out)


@cache
def aliases() -> Mapping[str, str]:
    """Dotted path of a re-export (and of an object's own module) -> where it is documented. Cached like
    :func:`entries`: every unresolved reference of a build asks (thousands), the modules do not change."""
    found = {e.path: e.canonical for e in entries() if e.path != e.canonical}
    for e in entries():
        if e.path == e.canonical:
            obj = getattr(importlib.import_module(e.module), e.name)
            real = f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', None)}"
            if real != e.canonical and real.split(".")[0] in PACKAGES:
                found.setdefault(real, e.canonical)
    return MappingProxyType(found)


# --- the API pages --------------------------------------------------------------------------------

_DIRECTIVE = {"class": "autoclass", "exception": "autoexception", "function": "autofunction", "data": "autodata"}
_OPTIONS = {"class": (":members:", ":show-inheritance:"), "exception": (":members:", ":show-inheritance:")}


def _shows_value(obj: Any) -> bool:
    """A constant's value is shown where it is short and plain (84, "crc32"), not a schema's repr."""
    return isinstance(obj, (int, float, str, bytes)) and len(repr(obj)) <= 60


def _lists_fields(cls: type) -> bool:
    """An enum's members, a dataclass's or a NamedTuple's fields are listed even without a docstring."""
    return issubclass(cls, enum.Enum) or dataclasses.is_dataclass(cls) or hasattr(cls, "_fields")


def _summary(mod: ModuleType) -> list[str]:
    """The first paragraph of a module's docstring (reStructuredText, as autodoc reads docstrings)."""
    doc = inspect.cleandoc(mod.__doc__ or "")
    return doc.split("\n\n")[0].splitlines() if doc else []


def api_markdown(group: str) -> str:
    """The Markdown of one API page's body: a section per module, an autodoc entry per name."""
    modules = [m for m in public_modules() if group_of(m) == group]
    if not modules:
        raise LookupError(f"no module with __all__ in group {group}")
    lines: list[str] = []
    for module in modules:
        mod = importlib.import_module(module)
        mine = [e for e in entries() if e.module == module]
        lines += [f"## `{module}`", ""]
        # A module whose path is also a documented name (the package reassembly.spark.resequence and
        # the function reassembly.spark.resequence) is not a reference target: the name is.
        taken = any(e.canonical == module for e in entries())
        rst = [f".. py:module:: {module}", *(["   :no-index:"] if taken else []), ""]
        rst += [*_summary(mod), ""]
        for e in (e for e in mine if e.path == e.canonical):
            obj = getattr(mod, e.name)
            options: tuple[str, ...] = _OPTIONS.get(e.kind, ())
            if isinstance(obj, type) and _lists_fields(obj):
                options = (*options, ":undoc-members:")
            if e.kind == "data" and not _shows_value(obj):
                options = (":no-value:",)
            rst += [f".. {_DIRECTIVE[e.kind]}:: {e.path}", *(f"   {o}" for o in options), ""]
        lines += ["```{eval-rst}", *rst, "```", ""]
        elsewhere = [e for e in mine if e.path != e.canonical]
        if elsewhere:
            lines += [f"Also exported by `{module}`, and documented where the shortest path exports them:", ""]
            lines += [f"- `{e.name}`: {{py:obj}}`{e.canonical}`" for e in elsewhere]
            lines.append("")
    return "\n".join(lines)


def _drop_inherited_docstring(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """A constant has no docstring of its own: autodoc would show its type's (int's, str's)."""
    inherited = type(obj).__doc__
    if what == "data" and not isinstance(obj, type) and inherited:
        own = [line for line in lines if line.strip()]
        if own and own[0].strip() == inherited.strip().splitlines()[0].strip():
            lines.clear()


_FIELD_ALIAS = re.compile(r"Alias for field number \d+")


def _drop_field_alias(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """A NamedTuple field without an attribute docstring has ``collections``' "Alias for field number 0":
    its meaning is in the record's docstring, above it, and the position says nothing to a reader."""
    own = [line for line in lines if line.strip()]
    if len(own) == 1 and _FIELD_ALIAS.fullmatch(own[0].strip()):
        lines.clear()


# --- the reason codes -----------------------------------------------------------------------------


def _member_comments(path: Path, enum_name: str) -> dict[str, str]:
    """The trailing ``# comment`` of each member line of an enum class in a source file."""
    comments: dict[str, str] = {}
    inside = False
    source = path.read_text(encoding="utf-8")
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.NAME and tok.string == "class" and tokens[i + 1].string == enum_name:
            inside = True
        elif inside and tok.type == tokenize.DEDENT and tok.start[1] == 0:
            break
        elif inside and tok.type == tokenize.COMMENT and tok.start[1] > 0:
            line = source.splitlines()[tok.start[0] - 1]
            member = re.match(r"\s+([A-Z][A-Z0-9_]*)\s*=", line)
            if member:
                comments[member.group(1)] = tok.string.lstrip("#").strip()
    return comments


def reason_rows() -> list[tuple[int, str, str, str]]:
    """(code, name, MQ's name or "", what it means) of every ``Reason`` member, by code."""
    errors = importlib.import_module("segmenter.errors")
    comments = _member_comments(Path(str(errors.__file__)), "Reason")
    rows = []
    for member in sorted(errors.Reason, key=int):
        comment = comments.get(member.name, "")
        mq = ""
        if m := re.match(r"(MQRC_[A-Z0-9_]+)\s*:?\s*(.*)", comment):
            mq, comment = m.group(1), m.group(2)
        rows.append((int(member), member.name, mq, comment))
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def reason_markdown() -> str:
    lines = ["| code | name | IBM MQ | meaning |", "|---|---|---|---|"]
    for code, name, mq, meaning in reason_rows():
        lines.append(f"| {code} | `{name}` | {f'`{mq}`' if mq else ''} | {_cell(meaning[:1].upper() + meaning[1:])} |")
    return "\n".join(lines) + "\n"


# --- Sphinx ---------------------------------------------------------------------------------------


def _public_bases(app: Any, name: str, obj: Any, options: Any, bases: list[Any]) -> None:
    """A class built on private parts (the assembler's judging and leaving steps) shows its public bases only."""
    bases[:] = [b for b in bases if not getattr(b, "__name__", "").startswith("_")] or [object]


def _no_return_type_for_exceptions(app: Any, domain: str, objtype: str, content: Any) -> None:
    """autodoc's type hints give an exception's ``__init__`` a "Return type: None" (a class gets none)."""
    from docutils import nodes  # type: ignore[import-untyped]

    if domain != "py" or objtype != "exception":
        return
    for field_list in content.findall(nodes.field_list):
        for item in list(field_list.children):
            if isinstance(item, nodes.field) and item[0].astext() == "Return type":
                field_list.remove(item)


def _builtins_are_builtins(app: Any, doctree: Any) -> None:
    """A type hint ``bytes`` is the builtin, never a field that happens to be named ``bytes``.

    The type hints autodoc writes are searched loosely (any object whose name ends in ``.bytes``),
    which finds dataclass fields called ``bytes`` or ``int`` and warns that the target is ambiguous.
    There is no intersphinx (the site builds offline), so a builtin is plain text.
    """
    from sphinx.addnodes import pending_xref

    for node in doctree.findall(pending_xref):
        if node.get("refdomain") == "py" and node.get("reftarget") in _BUILTINS:
            if node.hasattr("refspecific"):
                del node["refspecific"]
            node["py:module"] = None
            node["py:class"] = None


_BUILTINS = frozenset(name for name in dir(builtins) if not name.startswith("_"))


def _source_read(app: Any, docname: str, source: list[str]) -> None:
    text = API_MARKER.sub(lambda m: api_markdown(m.group("group")), source[0])
    source[0] = REASON_MARKER.sub(lambda m: reason_markdown(), text)


def _missing_reference(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    canonical = aliases().get(target)
    if canonical is not None:
        domain = env.get_domain("py")
        return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], canonical, node, contnode)
    return None


def _check_ours(app: Any, env: Any, node: Any, contnode: Any) -> None:
    """Runs after the other handlers (priority): a ``py`` reference to our name that nothing resolved."""
    from sphinx.util import logging

    if node.get("refdomain") != "py" or str(node.get("refdoc", "")).startswith("reference/api"):
        return None
    target = node.get("reftarget", "")
    if target.split(".")[0] in PACKAGES:
        logging.getLogger(__name__).warning(
            "unresolved reference to %s (public names only: those of an __all__)",
            target,
            location=node,
            type="ref",
            subtype="ours",
        )
    return None


def _always_reread(app: Any, env: Any, added: set[str], changed: set[str], removed: set[str]) -> list[str]:
    """The generated pages follow the code, not their own file: read them on every build."""
    return [doc for doc in env.found_docs if doc.startswith("reference/")]


def setup(app: Any) -> dict[str, Any]:
    app.connect("env-get-outdated", _always_reread)
    app.connect("source-read", _source_read)
    app.connect("autodoc-process-docstring", _drop_inherited_docstring)
    app.connect("autodoc-process-docstring", _drop_field_alias)
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("doctree-read", _builtins_are_builtins)
    app.connect("object-description-transform", _no_return_type_for_exceptions, priority=600)
    app.connect("missing-reference", _missing_reference)
    app.connect("missing-reference", _check_ours, priority=900)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
