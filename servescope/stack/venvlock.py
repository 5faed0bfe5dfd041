"""One installer per cache venv at a time: a lock for our own runs, and a wait for any pip already writing into it."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from servescope.stack.errors import StackError
from servescope.stack.progress import Step


def installers_in(venv: Path, me: int | None = None) -> list[psutil.Process]:
    """Processes running pip (or a build backend) with this venv's interpreter: a second install would corrupt it."""
    venv = venv.resolve() if venv.exists() else venv
    me = os.getpid() if me is None else me
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.info["pid"] == me or not cmdline:
            continue
        runs_venv = any(str(venv) in part for part in cmdline[:2])
        if runs_venv and is_installer(cmdline):
            found.append(proc)
    return found


def is_installer(cmdline: list[str]) -> bool:
    """pip itself (`bin/pip install`, `python -m pip`) or the build backend pip runs for an sdist."""
    if cmdline[1:3] == ["-m", "pip"] or any(Path(part).name in ("pip", "pip3") for part in cmdline[:2]):
        return True
    return any(Path(part).name == "_in_process.py" for part in cmdline[:3])


@contextmanager
def exclusive(venv: Path, timeout: float = 3600.0, poll: float = 5.0) -> Iterator[None]:
    """Hold the venv's lock file, after any foreign installer into it has finished (bounded by timeout)."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        deadline = time.monotonic() + timeout
        others = installers_in(venv)
        if others:
            with Step(f"waiting for another install into {venv.name} (pid {others[0].pid}) to finish"):
                while installers_in(venv):
                    if time.monotonic() > deadline:
                        raise StackError(f"another pip is still installing into {venv} after {timeout:.0f}s")
                    time.sleep(poll)
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StackError(f"another `make up` holds {lock.name} after {timeout:.0f}s") from None
                time.sleep(poll)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
