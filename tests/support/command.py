"""The ``reassemble`` command as the tests run it: a real process (``python -m reassembly``), never an
import of the command module, with its exit code, stdout and stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def reassemble(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: int = 900
) -> subprocess.CompletedProcess[str]:
    """Run ``reassemble ARGS`` to its end (``env`` over this process's environment)."""
    return subprocess.run(
        [sys.executable, "-m", "reassembly", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        check=False,
    )
