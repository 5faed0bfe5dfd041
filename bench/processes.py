"""The benchmarks' child processes: `python -m MODULE` from the repository (servescope/host/children.py stops them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def python_module(module: str, *args: object) -> subprocess.Popen:
    """`python -m MODULE ARGS` from the repository, its output discarded."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
