"""servescope/children.py: every child is gone after stop, whether it obeys SIGTERM, ignores it or has exited."""

from __future__ import annotations

import signal
import subprocess
import sys

from servescope import children


def _child(code: str) -> subprocess.Popen:
    """A Python child that prints "up" once it is ready (its SIGTERM handler set), then sleeps."""
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_a_child_that_obeys_sigterm_is_terminated():
    proc = _child("import sys, time; print('up', flush=True); time.sleep(60)")
    proc.stdout.readline()
    children.stop(proc)
    assert proc.returncode == -signal.SIGTERM


def test_a_child_that_ignores_sigterm_is_killed_after_the_timeout():
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    proc = _child(code)
    proc.stdout.readline()  # SIGTERM is ignored from here on
    children.stop(proc, timeout=0.2)
    assert proc.returncode == -signal.SIGKILL


def test_children_that_have_exited_are_only_reaped():
    done = _child("pass")
    done.wait()
    running = _child("import time; print('up', flush=True); time.sleep(60)")
    running.stdout.readline()
    children.stop(done, running)
    assert (done.returncode, running.returncode) == (0, -signal.SIGTERM)
