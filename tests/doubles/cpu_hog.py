"""Test tool: a bounded busy process, the noisy neighbour of the host-noise tests.

  python -m tests.doubles.cpu_hog [--seconds 30] [--nice -20]

Spins one core until SIGTERM or --seconds of wall time have passed (so a test that dies never
leaves it running for long). `--nice` asks for a higher priority (root only; ignored where not
permitted) so the hog gets its core even on a busy machine. Prints `busy` once it spins.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.doubles.cpu_hog", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="wall-time bound")
    parser.add_argument("--nice", type=int, default=0, help="nice value to ask for (negative needs root)")
    args = parser.parse_args(argv)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    except (PermissionError, OSError):
        pass
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("busy", flush=True)
    deadline = time.monotonic() + args.seconds
    n = 0
    while time.monotonic() < deadline:
        for _ in range(10_000):
            n += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
