"""Test tool: a bounded busy process, the noisy neighbour of the host-noise tests.

  python -m tests.doubles.cpu_hog [--seconds 30] [--processes 1] [--nice -20] [--realtime] [--duty 0.8]

Spins PROCESSES cores (forked copies: one program name) until SIGTERM or --seconds of wall time
have passed (so a test that dies never leaves it running for long). `--nice` asks for a higher
priority (root only; ignored where not permitted), for the process and for its session's
autogroup, so the hog gets its cores even on a busy machine. Prints `busy` once every copy spins.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.doubles.cpu_hog", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="wall-time bound")
    parser.add_argument("--processes", type=int, default=1, help="busy processes (this one and forked copies)")
    parser.add_argument("--nice", type=int, default=0, help="nice value to ask for (negative needs root)")
    parser.add_argument(
        "--realtime", action="store_true", help="spin at SCHED_FIFO priority 1 (root): ordinary tasks on its cores wait"
    )
    parser.add_argument(
        "--duty",
        type=float,
        default=1.0,
        help="share of each 0.25 s the hog spins (it sleeps the rest): below 1, "
        "what shares its core runs in the gaps, slowly, instead of not at all",
    )
    args = parser.parse_args(argv)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
        # With the kernel's autogroups a nice value only counts inside the session: started in a session of
        # its own (start_new_session), the hog asks for its group's share too; never for a caller's session.
        if os.getsid(0) == os.getpid():
            Path("/proc/self/autogroup").write_text(str(args.nice))
    except (PermissionError, OSError):
        pass
    if args.realtime:
        # A nice value still shares the core (autogroups weigh sessions against each other); a real-time task runs
        # ahead of every ordinary one, whatever session or group it is in, so the starving is the same everywhere.
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    deadline = time.monotonic() + args.seconds
    copies = []
    for _ in range(args.processes - 1):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
            spin(deadline, args.duty)
            os._exit(0)
        copies.append(pid)

    def stop(*_):
        for pid in copies:
            os.kill(pid, signal.SIGTERM)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    print("busy", flush=True)
    spin(deadline, args.duty)
    stop()
    return 0


def realtime_allowed() -> bool:
    """Whether this host lets a process take --realtime's SCHED_FIFO (root with CAP_SYS_NICE: not in an unprivileged
    container), asked of a throwaway child so the caller's own policy is never changed."""
    probe = "import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def spin(deadline: float, duty: float = 1.0) -> None:
    n = 0
    while (now := time.monotonic()) < deadline:
        if duty < 1.0 and (now % PERIOD_S) >= duty * PERIOD_S:
            time.sleep(PERIOD_S - now % PERIOD_S)
            continue
        for _ in range(10_000):
            n += 1


PERIOD_S = 0.25  # --duty's period: short beside a load phase, so every phase it overlaps is starved alike


if __name__ == "__main__":
    sys.exit(main())
