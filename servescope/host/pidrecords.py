"""The native stack's pid records: where they live, and which of them still name the process `make up` started.

`python -m servescope.stack up` writes one JSON record per service (servescope/stack/supervisor.Record) into
SERVESCOPE_STATE/native/pids/<name>.json: at least `name`, `pid` and `create_time`. A record
proves its process only while that pid's start time still matches (a reused pid is another
process). Readers outside the stack (the load generator's host-noise accounting, the exporter)
read them here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import psutil

from servescope import engines
from servescope.contracts import knobs

# A process whose start time differs from its record's by more than this is not the recorded one.
CREATE_TIME_SLACK_S = 1.0
# The stack's own services: they observe the engines (or serve the UI); they are not engines.
OBSERVERS = ("exporter", "prometheus", "locust")


def native_state_dir() -> Path:
    """SERVESCOPE_STATE/native: what one `up` leaves for `status` and `down` (pid files, logs, Prometheus data)."""
    return knobs.path("SERVESCOPE_STATE") / "native"


def native_pid_dir() -> Path:
    return native_state_dir() / "pids"


@dataclass(frozen=True)
class LiveRecord:
    """One pid record whose process still runs: the service's name, pid, URL and how the stack started it."""

    name: str  # vllm, llamacpp, ollama, exporter, prometheus, locust
    pid: int
    url: str  # where the service listens (the engines' URL; for Ollama its own port, not the proxy's)
    cmdline: tuple[str, ...] = ()  # how the stack started it (an engine's serving flags)

    @property
    def is_engine(self) -> bool:
        return self.name in engines.ENGINES


def live(directory: Path | None = None) -> dict[str, LiveRecord]:
    """The records whose process still runs (same pid, same start time); torn or stale ones are left out."""
    directory = native_pid_dir() if directory is None else directory
    found: dict[str, LiveRecord] = {}
    if not directory.is_dir():
        return found
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text())
            name, pid, created = str(data["name"]), int(data["pid"]), data.get("create_time")
        except (OSError, ValueError, TypeError, KeyError):
            continue  # a torn record, or an "absent" note without a pid: it proves nothing
        try:
            started = psutil.Process(pid).create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            continue
        if isinstance(created, (int, float)) and abs(started - created) > CREATE_TIME_SLACK_S:
            continue
        cmdline = data.get("cmdline")
        argv = tuple(str(a) for a in cmdline) if isinstance(cmdline, list) else ()
        found[name] = LiveRecord(name, pid, str(data.get("url") or ""), argv)
    return found
