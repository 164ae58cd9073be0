"""The README's table of optional extras names every extra the package declares, each in the form a
clone installs it with (``pip install -e ".[NAME]"``)."""

from __future__ import annotations

import re
from importlib.metadata import metadata
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_extra_has_a_row_in_the_readme_in_the_from_a_clone_form() -> None:
    declared = set(metadata("segment-reassembly").get_all("Provides-Extra") or [])
    rows = re.findall(r'^\| `([\w-]+)` \| `pip install -e "\.\[([\w-]+)\]"` \|', README.read_text(), re.M)
    assert all(name == extra for name, extra in rows), rows
    assert declared and declared <= {name for name, _ in rows}, declared - {name for name, _ in rows}
