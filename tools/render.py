"""Write the header table's committed renderings (``segmenter/header_table.py`` through
``segmenter/header_render.py``); ``--check`` only compares, and fails when one is stale.

* ``segmenter/_decoder.py``: the Python decoder, which ``segmenter.wire`` imports
  (tests/segmenter/test_header_table.py checks it);
* ``segmenter/_fastwire_table.h``: the rules as C for the optional compiled decoder
  (tests/segmenter/test_fastwire.py checks it); ``pip install -e .`` compiles it in afterwards;
* ``jvm/src/segmenter/jvm/HeaderTable.java``: the rules as Java for the bundled jar
  (tests/spark/test_jvm_decode.py and ``tools/build_jar.py --check`` check it); ``python
  tools/build_jar.py`` builds the jar from it, writing it first so that no jar is built from a stale one.

The Spark SQL is rendered at run time and has no file. After editing the table: ``python
tools/render.py``, then ``pip install -e .`` and ``python tools/build_jar.py``.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DECODER = ROOT / "segmenter" / "_decoder.py"
TABLE_H = ROOT / "segmenter" / "_fastwire_table.h"
HEADER_TABLE_JAVA = ROOT / "jvm" / "src" / "segmenter" / "jvm" / "HeaderTable.java"


def _table() -> tuple[types.ModuleType, dict[str, object]]:
    """``segmenter.header_render`` and the names the rules resolve in, imported without running
    ``segmenter/__init__.py``: the package imports ``segmenter.wire``, which imports the very
    ``_decoder.py`` written here, so a stale or broken one could otherwise not be replaced. Neither
    module imports ``wire``; in a process that already imported the package, that package is used."""
    if "segmenter" not in sys.modules:
        package = types.ModuleType("segmenter")
        package.__path__ = [str(ROOT / "segmenter")]
        sys.modules["segmenter"] = package
    from segmenter import header_render, model

    return header_render, model.table_constants()


def renderings() -> dict[Path, str]:
    """Every committed rendering by its path, as the table renders it now."""
    render, env = _table()
    return {
        DECODER: render.python_source(env),
        TABLE_H: render.c_source(env),
        HEADER_TABLE_JAVA: render.java_source(env),
    }


def java_source() -> str:
    """``HeaderTable.java`` as the table renders it (for ``tools/build_jar.py``)."""
    return renderings()[HEADER_TABLE_JAVA]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/render.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    args = parser.parse_args(argv)
    rendered = renderings()
    stale = [path for path, text in rendered.items() if not path.exists() or path.read_text() != text]
    for path in stale:
        if args.check:
            print(f"{path.relative_to(ROOT)} is not what the header table renders: run python tools/render.py")
        else:
            path.write_text(rendered[path])
            print(f"wrote {path.relative_to(ROOT)}")
    if not stale:
        print(f"{len(rendered)} renderings match the header table")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
