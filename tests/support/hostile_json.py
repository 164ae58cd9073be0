"""Hostile snapshot documents: any JSON value put in place of any value of a genuine document."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

JSONV = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=3),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
    max_leaves=6,
)


def replace_somewhere(doc: Any, data: st.DataObject, new: Any) -> Any:
    """``doc`` with one value, at any depth (drawn from ``data``), replaced by ``new``."""
    paths: list[tuple[Any, ...]] = []

    def walk(node: Any, path: tuple[Any, ...]) -> None:
        paths.append(path)
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            walk(v, (*path, k))

    walk(doc, ())
    path = data.draw(st.sampled_from(paths[1:]))
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = new
    return doc
