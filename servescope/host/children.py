"""Child processes the tools start (an exporter, nginx, a benchmark's servers, a knee): stopping them whatever happened."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable

# The last word of every stop: SIGKILL this long after the SIGTERM that came after a SIGINT (stop() below; the native
# stack's services, servescope/stack/supervisor.py).
KILL_AFTER_TERM_S = 5.0


def stop(*procs: subprocess.Popen, timeout: float = 10.0, kill_after: float = KILL_AFTER_TERM_S) -> None:
    """Stop them all on the schedule every child gets: SIGINT to each at once (its own Ctrl-C: it ends in order),
    SIGTERM to what is left `timeout` seconds later, SIGKILL `kill_after` seconds after that; each one waited for.
    One that has already exited is only reaped."""
    left = list(procs)
    for sig, wait_s in ((signal.SIGINT, timeout), (signal.SIGTERM, kill_after), (signal.SIGKILL, None)):
        for proc in left:
            if proc.poll() is None:
                try:
                    proc.send_signal(sig)
                except ProcessLookupError:  # gone between the poll and the signal
                    pass
        deadline = None if wait_s is None else time.monotonic() + wait_s
        for proc in left:
            try:
                proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        left = [proc for proc in left if proc.poll() is None]
        if not left:
            return


# The stated schedule on which a child doing work of its own is stopped (a knee quick started, at its budget or on
# Ctrl-C): SIGINT at once, so it ends what it does as Ctrl-C ends it and keeps what it finished (a knee ends its users
# mid-stream and writes its run folder); SIGTERM STOP_TERMINATE_AFTER_S later if it is still there; SIGKILL
# STOP_KILL_AFTER_S after the SIGINT. Whatever the child does with the first two, it is gone by the last.
STOP_TERMINATE_AFTER_S = 30.0
STOP_KILL_AFTER_S = 45.0


def stop_schedule() -> tuple[tuple[signal.Signals, float], ...]:
    """(signal, seconds after the stop began) in order: read when a stop begins, so a test can shorten it."""
    return ((signal.SIGINT, 0.0), (signal.SIGTERM, STOP_TERMINATE_AFTER_S), (signal.SIGKILL, STOP_KILL_AFTER_S))


class Stopping:
    """One child being stopped on the schedule: the first signal sent when it is made, each later one by `due()` once
    its time has come (a caller polling its own work between), or by `wait()` until the child is gone."""

    def __init__(self, proc: subprocess.Popen, clock: Callable[[], float] = time.monotonic):
        self.proc, self.clock = proc, clock
        self.began = clock()
        self.schedule = list(stop_schedule())
        self.sent: list[signal.Signals] = []
        self.due()

    def due(self) -> signal.Signals | None:
        """Send every signal whose time has come (none once the child has exited); the last one sent now, if any."""
        sent = None
        while self.schedule and self.clock() - self.began >= self.schedule[0][1]:
            sig, _ = self.schedule.pop(0)
            if self.proc.poll() is not None:
                self.schedule.clear()
                break
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:  # gone between the poll and the signal
                self.schedule.clear()
                break
            self.sent.append(sig)
            sent = sig
        return sent

    def kill(self) -> None:
        """Now (a second Ctrl-C): SIGKILL, the schedule's last word."""
        self.schedule = [(signal.SIGKILL, 0.0)]
        self.began = self.clock()
        self.due()

    def wait(self, poll_s: float = 0.1) -> int:
        """Until the child has exited, each signal sent when due; its exit status."""
        while self.proc.poll() is None:
            self.due()
            try:
                self.proc.wait(poll_s)
            except subprocess.TimeoutExpired:
                pass
        return self.proc.returncode
