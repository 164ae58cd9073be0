"""Every public field of the options records says what it means where the API reference shows it: an
attribute docstring (the string right after the field), which autodoc prints under the field. A field
with only a trailing comment, or none, fails here."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import textwrap

import pytest

from reassembly.assembler.model import Limits
from reassembly.spark.batch.pipeline import ReassemblyOptions
from reassembly.spark.incremental import IncrementalOptions
from reassembly.spark.stream.functions import StreamOptions

RECORDS = [ReassemblyOptions, StreamOptions, IncrementalOptions, Limits]


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


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_every_public_field_is_documented(cls: type) -> None:
    docs = attribute_docs(cls)
    fields = [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")]
    assert [f for f in fields if len(docs.get(f, "").split()) < 4] == [], f"{cls.__name__}: fields without a meaning"


def test_the_records_are_the_public_ones() -> None:
    """The records checked are those the packages export."""
    spark = importlib.import_module("reassembly.spark")
    assert spark.ReassemblyOptions is ReassemblyOptions and spark.StreamOptions is StreamOptions
    assert importlib.import_module("reassembly").Limits is Limits
