"""The API reference says what each option, field and parameter means where it shows it.

* Every public field of every record the reference lists (a dataclass or a NamedTuple: the options
  records a caller builds to say how something runs, and the events, stats, summaries, reports and
  results it gets back) has an attribute docstring, the string right after the field, which
  autodoc prints under it; or the record's own docstring names the field (````field````). A field
  with only a trailing comment, or none, fails here. A field a record inherits is documented where
  its base defines it (the entry that shows it).
* Every parameter of every function, constructor and shown method the reference lists is named
  (````name````) in the docstring autodoc shows for it (:func:`callables` says which): the meaning
  is where the signature is, not in a how-to table.
* No docstring of a public name sends the reader to a source file (``see save.py``): the reference
  is read without the source.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import re
import sys
import textwrap
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import pytest

from reassembly.assembler.model import Limits
from reassembly.spark.batch.pipeline import ReassemblyOptions
from reassembly.spark.incremental import IncrementalOptions
from reassembly.spark.stream.functions import StreamOptions

DOCS_EXT = Path(__file__).resolve().parents[1] / "docs" / "_ext"


@cache
def _reference() -> ModuleType:
    """``docs/_ext/reference.py``: the names the API reference lists (it needs no Sphinx to say so)."""
    sys.path.insert(0, str(DOCS_EXT))
    try:
        return importlib.import_module("reference")
    finally:
        sys.path.remove(str(DOCS_EXT))


OPTIONS = {
    "reassembly.collector.Rule",
    "reassembly.brokers.Rolling",
    "reassembly.brokers.kafka.LoopHooks",
    "reassembly.spark.inputs.SegmentInput",
    "reassembly.StartAt",
    "reassembly.StartWhen",
    "reassembly.StartAuto",
    "reassembly.EndAt",
    "reassembly.EndWhen",
    "reassembly.EndAuto",
    "refmsg.Chunker",
    "refmsg.EncryptionKeys",
    "segmenter.Segmenter",
}
"""Options records whose names do not say so."""
_SUFFIXES = ("Options", "Limits", "Policy", "Names")


def _public(canonical: str) -> Any:
    module, name = canonical.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def _is_record(obj: Any) -> bool:
    """A dataclass or a NamedTuple: a class whose fields autodoc lists as members."""
    return isinstance(obj, type) and (
        dataclasses.is_dataclass(obj) or (issubclass(obj, tuple) and hasattr(obj, "_fields"))
    )


def _field_names(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(cls._fields)  # type: ignore[attr-defined]


def records() -> list[str]:
    """Every record (dataclass or NamedTuple) the API reference documents, by the path it is documented under."""
    return sorted(
        {e.canonical for e in _reference().entries() if e.path == e.canonical and _is_record(_public(e.canonical))}
    )


def options_records() -> list[str]:
    """The options records among :func:`records`."""
    return [r for r in records() if dataclasses.is_dataclass(_public(r)) and (r in OPTIONS or r.endswith(_SUFFIXES))]


def attribute_docs(cls: type) -> dict[str, str]:
    """Each field of ``cls``'s class body followed by a string statement: field -> that string."""
    source = textwrap.dedent(inspect.getsource(cls))
    (node,) = ast.parse(source).body
    assert isinstance(node, ast.ClassDef)
    docs = {}
    for stmt, after in zip(node.body, node.body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = after.value.value
    return docs


def undocumented(cls: type) -> list[str]:
    """The public fields of ``cls`` with neither an attribute docstring of at least four words nor a
    mention in the docstring of the class (``cls``, or the record it inherits the field from)."""
    docs: dict[str, str] = {}
    own = ""
    for klass in reversed(cls.__mro__):
        if _is_record(klass):
            docs.update(attribute_docs(klass))
            own += "\n" + (inspect.getdoc(klass) or "")
    fields = [f for f in _field_names(cls) if not f.startswith("_")]
    return [f for f in fields if len(docs.get(f, "").split()) < 4 and f"``{f}" not in own]


@pytest.mark.parametrize("canonical", records())
def test_every_public_field_is_documented(canonical: str) -> None:
    assert undocumented(_public(canonical)) == [], f"{canonical}: fields without a meaning"


def test_the_records_checked_are_the_public_records() -> None:
    """The discovery finds the options records the packages export and those :data:`OPTIONS` names (a
    name there that the reference does not list fails: it was renamed or moved), the events, and the
    NamedTuples."""
    found = records()
    options = options_records()
    for cls in (ReassemblyOptions, StreamOptions, IncrementalOptions, Limits):
        assert any(_public(r) is cls for r in options), cls
    for name in ("reassembly.BatchOptions", "reassembly.ResequenceOptions", "reassembly.ResequenceLimits"):
        assert name in options
    assert "reassembly.spark.collect.SparkCollectOptions" in options
    assert set(options) >= OPTIONS, OPTIONS - set(options)
    for name in ("reassembly.MessageComplete", "reassembly.Unfinished", "segmenter.SegmentHeader", "refmsg.RMH"):
        assert name in found, name
    assert hasattr(_public("segmenter.SegmentHeader"), "_fields")


def test_a_record_with_a_commented_field_fails() -> None:
    @dataclasses.dataclass(frozen=True)
    class Example:
        """Options."""

        size: int = 1  # a comment autodoc never shows
        named: int = 2
        """How many of them there are."""

    assert undocumented(Example) == ["size"]


class _Point(NamedTuple):
    """A point."""

    x: int  # a comment autodoc never shows
    y: int
    """Where it is, upwards, in pixels."""


@dataclasses.dataclass(frozen=True)
class _Base:
    """A base."""

    size: int
    """How many bytes it holds."""


@dataclasses.dataclass(frozen=True)
class _Derived(_Base):
    """A derived record; ``extra``: what it adds."""

    extra: int = 0
    other: int = 1


def test_a_named_tuple_with_a_commented_field_fails() -> None:
    assert undocumented(_Point) == ["x"]


def test_an_inherited_field_is_documented_by_its_base() -> None:
    assert undocumented(_Base) == []
    assert undocumented(_Derived) == ["other"]


_SOURCE_FILE = re.compile(r"``[\w./-]+\.py``|\bsee [\w./-]+\.py\b")


def _docstrings(obj: Any) -> list[str]:
    if not (isinstance(obj, type) or callable(obj)):
        return []
    docs = [inspect.getdoc(obj) or ""]
    if isinstance(obj, type):
        docs += [inspect.getdoc(m) or "" for n, m in vars(obj).items() if not n.startswith("_") and callable(m)]
    return docs


def test_no_public_docstring_sends_the_reader_to_a_source_file() -> None:
    found = [
        f"{e.canonical}: {m.group(0)}"
        for e in _reference().entries()
        if e.path == e.canonical
        for doc in _docstrings(_public(e.canonical))
        for m in _SOURCE_FILE.finditer(doc)
    ]
    assert found == []


ENTRY_POINTS = (
    "reassembly.spark.reassemble",
    "reassembly.spark.reassemble_stream",
    "reassembly.spark.resequence",
    "reassembly.spark.resequence_stream",
    "reassembly.spark.collect.collect_stream",
    "reassembly.spark.incremental.run_incremental",
    "reassembly.spark.stream.file_source",
    "reassembly.spark.stream.start",
    "reassembly.Resequencer",
    "reassembly.BatchResequencer",
)
"""The functions and classes that take the options records: :func:`callables` must find each of them."""


def _names(doc: str, param: str) -> bool:
    """``doc`` names ``param`` as a literal: ````param````, ````param(...)````, ````param=...````, or
    ````*param```` / ````**param```` (several named together, ````a````, ````b````: ..., count each)."""
    return re.search(rf"``\*{{0,2}}{re.escape(param)}(``|[(=\[])", doc) is not None


def _constructor_owner(cls: type) -> type | None:
    """The class whose ``__init__`` or ``__new__`` makes ``cls``'s signature, when it is one of ours."""
    for klass in cls.__mro__:
        if "__init__" in vars(klass) or "__new__" in vars(klass):
            return klass if klass.__module__.split(".")[0] in _reference().PACKAGES else None
    return None


def _shown_methods(cls: type) -> list[tuple[str, Any]]:
    """The public methods autodoc's ``:members:`` shows under ``cls``: its own, with a docstring (its
    own or inherited), or every one where the entry also has ``:undoc-members:`` (docs/_ext/reference.py)."""
    every = _reference()._lists_fields(cls)
    found = []
    for name, member in vars(cls).items():
        function = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
        if name.startswith("_") or not inspect.isfunction(function):
            continue
        if every or inspect.getdoc(getattr(cls, name)):
            found.append((name, function))
    return found


def callables() -> list[tuple[str, Any, str]]:
    """(dotted name, callable, the docstring autodoc shows for it) of every callable the reference lists.

    * A function: its docstring.
    * A class or exception: its constructor's parameters, in the class docstring, the one autodoc
      shows (``autoclass_content`` is the default, "class", and ``__init__`` is an excluded member in
      docs/conf.py). A constructor inherited from another listed class is documented there (the entry
      shows its bases); a dataclass's or NamedTuple's parameters are its fields, listed as members
      with their attribute docstrings (the options records' are checked by field above); an enum's
      and a ``Protocol``'s constructors are not called by a user.
    * Each public method a listed class shows (:func:`_shown_methods`): its docstring.
    """
    found: list[tuple[str, Any, str]] = []
    listed = {id(_public(e.canonical)) for e in _reference().entries() if e.kind != "data"}
    for e in _reference().entries():
        if e.path != e.canonical or e.kind == "data":
            continue
        obj = _public(e.canonical)
        if not isinstance(obj, type):
            found.append((e.canonical, obj, inspect.getdoc(obj) or ""))
            continue
        owner = _constructor_owner(obj)
        if not (
            owner is None
            or issubclass(obj, enum.Enum)
            or getattr(obj, "_is_protocol", False)
            or dataclasses.is_dataclass(obj)
            or hasattr(obj, "_fields")
            or (owner is not obj and id(owner) in listed)
        ):
            found.append((e.canonical, obj, inspect.getdoc(obj) or ""))
        found += [
            (f"{e.canonical}.{name}", function, inspect.getdoc(getattr(obj, name)) or "")
            for name, function in _shown_methods(obj)
        ]
    return found


def undocumented_parameters(obj: Any, doc: str) -> list[str]:
    """The parameters of ``obj`` that ``doc`` does not name (``self`` and ``cls`` need no meaning)."""
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return []
    return [p for p in params if p not in ("self", "cls") and not _names(doc, p)]


def test_every_parameter_of_every_listed_callable_is_documented() -> None:
    """Every parameter of every function, constructor and shown method the reference lists is named
    (````name````) in the docstring autodoc shows for it, with what it means.

    ``*args`` and ``**kwargs`` are parameters like the others: what a call may pass there is part of
    its meaning (``**details`` of an error are the fields it carries), so they are named too
    (````*args````, ````**details````). ``self`` and ``cls`` are not: the caller never passes them.
    """
    missing = [f"{name}.{param}" for name, obj, doc in callables() for param in undocumented_parameters(obj, doc)]
    assert missing == [], f"{len(missing)} parameters without a meaning: {missing}"


def test_the_callables_checked_include_the_entry_points() -> None:
    """The discovery finds the functions and classes that take the options records, and a method."""
    names = {name for name, _, _ in callables()}
    assert set(ENTRY_POINTS) <= names, set(ENTRY_POINTS) - names
    assert "reassembly.Assembler.receive" in names


def test_an_undocumented_parameter_fails() -> None:
    class Example:
        """An example.

        ``size``: how many bytes; ``a``, ``b``: the two ends (``b=None``: open); ``**extra``: more.
        """

        def __init__(self, size: int, a: int, b: int | None, count: int, **extra: int) -> None:
            pass

    assert undocumented_parameters(Example, inspect.getdoc(Example) or "") == ["count"]
