"""Co-resident engines: pause the other engines `make up` started while one engine is measured (LOADGEN_ISOLATE=pause).

On a small machine an idle engine is not idle: vLLM's CPU backend keeps a core busy for a while
after its own load, llama.cpp's threads spin between requests. With `pause` every other engine of
the native stack's pid records (servescope/host/pidrecords.py) gets SIGSTOP on its whole process group
(the stack starts each in its own session, so vLLM's engine core stops with it) while one engine
is measured, and SIGCONT as soon as another engine's turn comes or the run ends, however it ends.
Only records whose pid and start time still match are touched, and never this process's own group.

Off by default: a paused engine's metrics page stops answering, so the exporter reports it down
and its page waits its per-engine budget (up to 0.6 s natively) on every read, which thins the
run's own samples of the engine under test; and a load generator killed with SIGKILL leaves the
others stopped until `make down` (which still stops them). The host noise per phase measures and
flags what a running neighbour costs either way.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from loadgen.targets import Target
from servescope.host import hostnoise, pidrecords

MODES = ("off", "pause")


class Isolation:
    def __init__(self, mode: str, say: Callable[[str], None], records: Callable[[], dict] = pidrecords.live):
        if mode not in MODES:
            raise ValueError(f"--isolate {mode!r}: expected one of {', '.join(MODES)}")
        self.mode, self.say, self.records = mode, say, records
        self.paused: dict[str, int] = {}  # engine name -> process group stopped

    def focus(self, target: Target) -> None:
        """`target` is measured next: every other recorded engine is paused, `target`'s own resumed."""
        if self.mode != "pause":
            return
        engines = {name: rec for name, rec in self.records().items() if rec.is_engine}
        mine = {
            name
            for name, rec in engines.items()
            if name == target.kind or (rec.url and hostnoise.same_endpoint(rec.url, target.url))
        }
        for name in mine & set(self.paused):
            self._signal(name, self.paused.pop(name), signal.SIGCONT, "resumed")
        own_group = os.getpgrp()
        for name, rec in engines.items():
            if name in mine or name in self.paused:
                continue
            try:
                group = os.getpgid(rec.pid)
            except ProcessLookupError:
                continue
            if group == own_group or group != rec.pid:
                # Not a session the stack started for it (or ours): stopping the group would stop others too.
                self.say(f"isolate: {name} (pid {rec.pid}) is not in its own process group: left running")
                continue
            if self._signal(name, group, signal.SIGSTOP, f"paused while {target.instance} is measured"):
                self.paused[name] = group

    def release(self) -> None:
        """Resume everything this run paused (called however the run ends)."""
        for name, group in list(self.paused.items()):
            self._signal(name, group, signal.SIGCONT, "resumed")
            del self.paused[name]

    def _signal(self, name: str, group: int, sig: signal.Signals, what: str) -> bool:
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError) as exc:
            self.say(f"isolate: {name} (process group {group}) not {what.split()[0]}: {exc.strerror or exc}")
            return False
        self.say(f"isolate: {name} (process group {group}) {what}")
        return True
