"""servescope/host/children.py: every child is gone after stop, on the stated schedule (SIGINT, SIGTERM, SIGKILL), whether
it obeys the first signal, ignores it, ignores the second too, or has exited."""

from __future__ import annotations

import signal
import subprocess
import sys

from servescope.host import children

# A child that says each signal it gets, ignoring those named in IGNORE, and prints "up" once its handlers are in.
# The handler writes with os.write, not print: a signal that lands while print("up") is still inside stdout's buffered
# writer would re-enter it (RuntimeError: reentrant call, exit 1), seen in a Docker container 1 run in 4.
CHILD = """
import os, signal, sys, time
for name in {ignored!r}:
    signal.signal(getattr(signal, name), lambda sig, _f: os.write(1, f"got {{signal.Signals(sig).name}}\\n".encode()))
print("up", flush=True)
time.sleep(60)
"""

# A second between signals: the child's handler must have run (and said so) before the next signal comes, and a busy
# host may leave a woken process unscheduled for a good part of 0.2 s.
STEP_S = 1.0


def _child(*ignored: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(ignored=list(ignored))],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout.readline().strip() == "up"
    return proc


def test_a_child_ends_on_sigint_its_own_ctrl_c():
    """Issue 42: the first word of every stop is SIGINT, as Ctrl-C: a child that ends on it gets nothing more."""
    proc = _child()
    children.stop(proc)
    assert proc.returncode != 0 and proc.returncode != -signal.SIGTERM  # Python's KeyboardInterrupt: exit 1


def test_a_child_that_ignores_sigint_gets_sigterm_after_the_timeout():
    proc = _child("SIGINT")
    children.stop(proc, timeout=STEP_S)
    assert proc.returncode == -signal.SIGTERM
    assert proc.stdout.read().split() == ["got", "SIGINT"]


def test_a_child_that_ignores_sigint_and_sigterm_is_killed_on_the_schedule():
    proc = _child("SIGINT", "SIGTERM")
    children.stop(proc, timeout=STEP_S, kill_after=STEP_S)
    assert proc.returncode == -signal.SIGKILL
    assert proc.stdout.read().split() == ["got", "SIGINT", "got", "SIGTERM"]


def test_children_that_have_exited_are_only_reaped():
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    running = _child("SIGINT")
    children.stop(done, running, timeout=0.2)
    assert (done.returncode, running.returncode) == (0, -signal.SIGTERM)
