"""Write ``segmenter/_fastwire_table.h`` (the header table's rules as C, for the optional compiled
decoder ``segmenter/_fastwire.c``) from ``segmenter/header_table.py``. ``--check`` only compares:
tests/segmenter/test_fastwire.py fails when the committed file is not what the table renders."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE_H = ROOT / "segmenter" / "_fastwire_table.h"


def rendered() -> str:
    sys.path.insert(0, str(ROOT))
    from segmenter.header_table import c_source
    from segmenter.wire import table_constants

    return c_source(table_constants())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    text = rendered()
    if args.check:
        if TABLE_H.read_text() != text:
            raise SystemExit(f"{TABLE_H} is not what the header table renders: run python tools/render_c_table.py")
        print(f"{TABLE_H.name} matches the header table")
    else:
        TABLE_H.write_text(text)
        print(f"wrote {TABLE_H}")


if __name__ == "__main__":
    main()
