"""Child processes the tools start (an exporter, nginx, a benchmark's servers): stopping them whatever happened."""

from __future__ import annotations

import subprocess


def stop(*procs: subprocess.Popen, timeout: float = 10.0) -> None:
    """Terminate them all at once, then wait for each; kill one that is still there after `timeout`.
    One that has already exited is only reaped."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
