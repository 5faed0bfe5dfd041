"""Progress lines with elapsed time for the long steps (installs, the llama.cpp build, conversion, warm-up)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from stack.errors import StackError

HEARTBEAT_S = 12.0


def say(line: str) -> None:
    print(line, flush=True)


def elapsed(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m{seconds % 60:02d}s"


def tail(path: Path, lines: int = 20) -> str:
    """The last lines of a log, for error messages (the evidence is in the log, not in our words)."""
    try:
        with open(path, errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines)).rstrip()
    except OSError:
        return f"(no log at {path})"


class Step:
    """`with Step("building llama.cpp"):` prints a start line, a heartbeat line every HEARTBEAT_S, and the total."""

    def __init__(
        self,
        label: str,
        interval: float = HEARTBEAT_S,
        detail: Callable[[], str] | None = None,
        emit: Callable[[str], None] = say,
    ):
        self.label = label
        self.interval = interval
        self.detail = detail  # optional: e.g. the log's last progress marker
        self.emit = emit
        self._done = threading.Event()
        self.started = 0.0

    def __enter__(self) -> Step:
        self.started = time.monotonic()
        self.emit(f"→ {self.label}")
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._done.wait(self.interval):
            extra = ""
            if self.detail is not None:
                try:
                    extra = self.detail()
                except Exception:  # a heartbeat must never kill the step it reports on
                    extra = ""
            self.emit(f"… {self.label} ({elapsed(self.seconds)}){' ' + extra if extra else ''}")

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def __exit__(self, exc_type, exc, tb) -> None:
        self._done.set()
        self._thread.join(timeout=1)
        mark = "✓" if exc_type is None else "✗"
        self.emit(f"{mark} {self.label} ({elapsed(self.seconds)})")


def run_logged(
    cmd: list[str],
    log: Path,
    label: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    detail: Callable[[], str] | None = None,
) -> None:
    """Run a long command with its output in `log` and a heartbeat on the terminal; one-line error on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    with Step(label, detail=detail), open(log, "a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        try:
            code = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=cwd)
        except OSError as exc:
            raise StackError(f"{label}: cannot run {cmd[0]}: {exc}") from None
    if code != 0:
        raise StackError(f"{label} failed (exit {code}); log: {log}\n{tail(log, 15)}")
