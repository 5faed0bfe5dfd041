"""Test tool: a bounded busy process, the noisy neighbour of the host-noise tests.

  python -m tests.doubles.cpu_hog [--seconds 30] [--processes 1] [--nice -20]

Spins PROCESSES cores (forked copies: one program name) until SIGTERM or --seconds of wall time
have passed (so a test that dies never leaves it running for long). `--nice` asks for a higher
priority (root only; ignored where not permitted), for the process and for its session's
autogroup, so the hog gets its cores even on a busy machine. Prints `busy` once every copy spins.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.doubles.cpu_hog", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="wall-time bound")
    parser.add_argument("--processes", type=int, default=1, help="busy processes (this one and forked copies)")
    parser.add_argument("--nice", type=int, default=0, help="nice value to ask for (negative needs root)")
    args = parser.parse_args(argv)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
        # With the kernel's autogroups a nice value only counts inside the session: started in a session of
        # its own (start_new_session), the hog asks for its group's share too; never for a caller's session.
        if os.getsid(0) == os.getpid():
            Path("/proc/self/autogroup").write_text(str(args.nice))
    except (PermissionError, OSError):
        pass
    deadline = time.monotonic() + args.seconds
    copies = []
    for _ in range(args.processes - 1):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
            spin(deadline)
            os._exit(0)
        copies.append(pid)

    def stop(*_):
        for pid in copies:
            os.kill(pid, signal.SIGTERM)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    print("busy", flush=True)
    spin(deadline)
    stop()
    return 0


def spin(deadline: float) -> None:
    n = 0
    while time.monotonic() < deadline:
        for _ in range(10_000):
            n += 1


if __name__ == "__main__":
    sys.exit(main())
