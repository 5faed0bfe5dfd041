"""Progress lines for the long steps (installs, the llama.cpp build, conversion, warm-up): elapsed time, and an estimate
only from what this machine measured (the step's last duration here, or its own progress rate)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from servescope.stack.errors import StackError
from servescope.text.numbers import elapsed

HEARTBEAT_S = 12.0
# How many past durations of a step are kept with the cache, and how far into a step its progress rate is trusted
# for a remaining-time estimate (a build's first percent is configuration, not compiling).
HISTORY_KEPT = 5
RATE_MIN_FRACTION = 0.05


def say(line: str) -> None:
    print(line, flush=True)


def tail(path: Path, lines: int = 20) -> str:
    """The last lines of a log, for error messages (the evidence is in the log, not in our words)."""
    try:
        with open(path, errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines)).rstrip()
    except OSError:
        return f"(no log at {path})"


class StepTimes:
    """How long each long step took on this machine, kept with the cache (a JSON file: step key -> last durations).

    The estimate a step shows is what it took here last time, not a figure from another machine; a damaged or
    unwritable file only means no estimate.
    """

    def __init__(self, path: Path | None = None):
        self.path = path

    @classmethod
    def here(cls) -> StepTimes:
        from servescope.stack import paths  # the cache's place is a knob; read when a step starts, not at import

        return cls(paths.cache_dir() / "step-times.json")

    def _read(self) -> dict[str, list[float]]:
        try:
            data = json.loads(self.path.read_text()) if self.path else {}
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {
            k: [float(x) for x in v if isinstance(x, int | float) and 0 < x < 1e7]
            for k, v in data.items()
            if isinstance(v, list)
        }

    def last(self, key: str) -> float | None:
        found = self._read().get(key)
        return found[-1] if found else None

    def record(self, key: str, seconds: float) -> None:
        if self.path is None:
            return
        data = self._read()
        data[key] = [*data.get(key, []), round(seconds, 1)][-HISTORY_KEPT:]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".partial")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
            tmp.replace(self.path)
        except OSError:
            pass  # no history is no estimate next time, never a failed step


def remaining_from_rate(seconds: float, fraction: float | None) -> float | None:
    """Derived: the time left if the step keeps the rate it had so far (None before RATE_MIN_FRACTION of it)."""
    if fraction is None or not RATE_MIN_FRACTION <= fraction < 1 or seconds <= 0:
        return None
    return seconds * (1 - fraction) / fraction


class Step:
    """`with Step("building llama.cpp"):` prints a start line, a heartbeat line every HEARTBEAT_S, and the total.

    With a `key`, the start line says how long the step took here last time, and its duration is kept for the next
    one; with a `fraction` (the step's own progress, 0..1), heartbeats add the time left at the rate so far.
    """

    def __init__(
        self,
        label: str,
        interval: float = HEARTBEAT_S,
        detail: Callable[[], str] | None = None,
        emit: Callable[[str], None] = say,
        key: str | None = None,
        fraction: Callable[[], float | None] | None = None,
        times: StepTimes | None = None,
    ):
        self.label = label
        self.interval = interval
        self.detail = detail  # optional: e.g. the log's last progress marker
        self.emit = emit
        self.key = key
        self.fraction = fraction
        self.times = times if times is not None else (StepTimes.here() if key else StepTimes())
        self._done = threading.Event()
        self.started = 0.0

    def __enter__(self) -> Step:
        self.started = time.monotonic()
        last = self.times.last(self.key) if self.key else None
        self.emit(f"→ {self.label}{f' (last time on this machine: {elapsed(last)})' if last else ''}")
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._done.wait(self.interval):
            extra = []
            try:
                if self.detail is not None:
                    extra.append(self.detail())
                left = remaining_from_rate(self.seconds, self.fraction()) if self.fraction else None
                if left is not None:
                    extra.append(f"about {elapsed(left)} left at its rate so far")
            except Exception:  # a heartbeat must never kill the step it reports on
                pass
            text = " ".join(e for e in extra if e)
            self.emit(f"… {self.label} ({elapsed(self.seconds)}){' ' + text if text else ''}")

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def __exit__(self, exc_type, exc, tb) -> None:
        self._done.set()
        self._thread.join(timeout=1)
        mark = "✓" if exc_type is None else "✗"
        self.emit(f"{mark} {self.label} ({elapsed(self.seconds)})")
        if exc_type is None and self.key:
            self.times.record(self.key, self.seconds)


def run_logged(
    cmd: list[str],
    log: Path,
    label: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    detail: Callable[[], str] | None = None,
    key: str | None = None,
    fraction: Callable[[], float | None] | None = None,
) -> None:
    """Run a long command with its output in `log` and a heartbeat on the terminal; one-line error on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    with Step(label, detail=detail, key=key, fraction=fraction), open(log, "a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        try:
            code = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=cwd)
        except OSError as exc:
            raise StackError(f"{label}: cannot run {cmd[0]}: {exc}") from None
    if code != 0:
        raise StackError(f"{label} failed (exit {code}); log: {log}\n{tail(log, 15)}")
