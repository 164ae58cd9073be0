"""The API reference says what each option means where it shows the option.

* Every public field of every options record the reference lists (the records a caller builds to say
  how something runs: :data:`OPTIONS` names them, and every public record whose name ends in
  ``Options``, ``Limits``, ``Policy`` or ``Names`` is one) has an attribute docstring, the string
  right after the field, which autodoc prints under it; or the record's own docstring names the
  field (````field````). A field with only a trailing comment, or none, fails here.
* No docstring of a public name sends the reader to a source file (``see save.py``): the reference
  is read without the source.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import sys
import textwrap
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

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
    return isinstance(obj, type) and dataclasses.is_dataclass(obj)


def options_records() -> list[str]:
    """Every options record the API reference documents, by the path it is documented under."""
    found = {
        e.canonical
        for e in _reference().entries()
        if e.path == e.canonical
        and _is_record(_public(e.canonical))
        and (e.canonical in OPTIONS or e.name.endswith(_SUFFIXES))
    }
    return sorted(found)


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
    """The public fields of ``cls`` with neither an attribute docstring nor a mention in its docstring."""
    docs = attribute_docs(cls)
    own = inspect.getdoc(cls) or ""
    fields = [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")]
    return [f for f in fields if len(docs.get(f, "").split()) < 4 and f"``{f}" not in own]


@pytest.mark.parametrize("canonical", options_records())
def test_every_public_field_is_documented(canonical: str) -> None:
    cls = _public(canonical)
    assert undocumented(cls) == [], f"{canonical}: fields without a meaning"


def test_the_records_checked_are_the_public_options_records() -> None:
    """The discovery finds the records the packages export and those :data:`OPTIONS` names (a name
    there that the reference does not list fails: it was renamed or moved)."""
    records = options_records()
    for cls in (ReassemblyOptions, StreamOptions, IncrementalOptions, Limits):
        assert any(_public(r) is cls for r in records), cls
    for name in ("reassembly.BatchOptions", "reassembly.ResequenceOptions", "reassembly.ResequenceLimits"):
        assert name in records
    assert "reassembly.spark.collect.SparkCollectOptions" in records
    assert set(records) >= OPTIONS, OPTIONS - set(records)


def test_a_record_with_a_commented_field_fails() -> None:
    @dataclasses.dataclass(frozen=True)
    class Example:
        """Options."""

        size: int = 1  # a comment autodoc never shows
        named: int = 2
        """How many of them there are."""

    assert undocumented(Example) == ["size"]


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
"""The functions and classes that take the options records: each parameter is named in its docstring."""


@pytest.mark.parametrize("canonical", ENTRY_POINTS)
def test_every_parameter_of_the_entry_points_is_documented(canonical: str) -> None:
    obj = _public(canonical)
    doc = inspect.getdoc(obj) or ""
    params = inspect.signature(obj).parameters
    missing = [p for p in params if p != "self" and f"``{p}``" not in doc and f"``{p}(" not in doc]
    assert missing == [], f"{canonical}: parameters without a meaning"
