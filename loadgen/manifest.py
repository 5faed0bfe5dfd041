"""The run manifest: engines as they described themselves, prompt set and its hash, flags, machine, start/end, status."""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from typing import Any

import psutil

from loadgen.targets import Target
from servescope.contracts.urls import redact
from servescope.workloads.prompts import PromptSet


def machine() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "cores": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "platform": _platform(),
        "python": sys.version.split()[0],
    }


def _platform() -> str:
    """platform.platform()'s text without the processor: looking that up runs `uname -p` in a child process (a fork of
    this one, 0.01 CPU-s of a 4-request run), and the system, release and machine say what the manifest needs."""
    system = platform.uname()  # its processor is looked up only when asked for
    libc = "".join(platform.libc_ver())
    return "-".join(part for part in (system.system, system.release, system.machine, libc and f"with-{libc}") if part)


def _redacted(value: Any) -> Any:
    """Credentials in any URL of the manifest (an engine's, a flag's, the command line's) replaced by ***."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(v) for v in value]
    return value


def build(
    *,
    command: str,
    scenario: str,
    targets: list[Target],
    prompt_sets: list[PromptSet],
    flags: dict[str, Any],
    started_at: float,
    status: str = "running",
    ended_at: float | None = None,
    phases: list[str] | None = None,
    trials: dict[str, Any] | None = None,
    workers: list[dict[str, Any]] | None = None,
    distributed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything a report needs to say what was run where; status is running -> complete | interrupted."""
    from locust import __version__ as locust_version

    manifest = {
        "tool": "servescope-loadgen",
        "command": command,
        "scenario": scenario,
        "status": status,
        "started_at": started_at,
        "ended_at": ended_at,
        "started_at_iso": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started_at)),
        "engines": {t.instance: t.manifest() for t in targets},
        # Each set's kind and how it was made (a workload's lengths, a shared-prefix set's reuse ceiling), then
        # its prompts; a prompt's own output length where it has one.
        "prompt_sets": {
            p.name: {
                **p.describe(),
                "sha256": p.sha256,
                "repeats": p.repeats,  # sent again once a phase has sent them all (a fresh set never is)
                "asked_reuse": p.asked_reuse,  # the prefix-cache reuse the workload means to measure
                "prompts": [
                    {"id": x.id, "text": x.text, **({"max_tokens": x.max_tokens} if x.max_tokens is not None else {})}
                    for x in p.prompts
                ],
            }
            for p in prompt_sets
        },
        "prompt_set": prompt_sets[0].name if prompt_sets else None,
        "prompt_set_sha256": prompt_sets[0].sha256 if prompt_sets else None,
        "flags": flags,
        "phases": phases or [],
        "trials": trials or {},  # repetitions, isolation, each engine's warm-up (loadgen/trials.py)
        "machine": machine(),
        "locust_version": locust_version,
    }
    if workers is not None:  # load from several processes: each one's pid, host, clock offset and bound, fate
        manifest["workers"] = workers
    if distributed is not None:  # what the master's port dropped, and what lost workers never sent, per phase
        manifest["distributed"] = distributed
    # Prompts are stored as sent (their sha256 is of this text): everything else is redacted.
    return {k: v if k == "prompt_sets" else _redacted(v) for k, v in manifest.items()}
