"""The benchmarks' child processes: `python -m MODULE` from the repository, and stopping them whatever happened."""

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


def stop(*procs: subprocess.Popen, timeout: float = 10.0) -> None:
    """Terminate them all at once, then wait for each; kill one that is still there after `timeout`."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
