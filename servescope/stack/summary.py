"""The lines `make up` ends with: the run's report is written and its Summary printed (servescope/report/summary.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from servescope.contracts import knobs
from servescope.stack.progress import say

REPORT_TIMEOUT_S = 300


def report_and_summary(run: Path | str, prometheus_url: str) -> None:
    """`python -m servescope.report` on the run (report.md/.html/.json beside it) and its Summary section on the terminal; a
    report that fails costs one line, never the stack."""
    cmd = [sys.executable, "-m", "servescope.report", "--run", str(run), "--prometheus", prometheus_url]
    try:
        proc = subprocess.run(
            cmd, cwd=knobs.REPO_ROOT, capture_output=True, text=True, timeout=REPORT_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        say(f"report: not written within {REPORT_TIMEOUT_S} s: `make report RUN={run}` writes it")
        return
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        say(f"report: not written ({why}): `make report RUN={run}` tries again")
        return
    lines = proc.stderr.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("report: Summary")), None)
    end = next((i for i, line in enumerate(lines) if line.startswith("report: wrote")), len(lines))
    if start is not None:
        say("")
        say("Summary (the report's first section):")
        for line in lines[start + 1 : end]:
            say(line)
    say(f"report: {proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else run}")
