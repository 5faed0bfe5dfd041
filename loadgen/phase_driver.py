"""One driver for a run's phases: the headless run, the web UI's conductor and a distributed master step through them alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import gevent
from gevent.event import Event

from loadgen.scenarios import LoadRun, Phase

if TYPE_CHECKING:
    from loadgen.annotations import PhaseAnnotator
    from loadgen.trials import NoiseKeeper
    from servescope.prometheus.sampler import Sampler


class Users:
    """How a phase's users come and go, the one part each way of running a load has of its own: Locust's runner
    started per phase (the headless run), the web UI's load shape that reads the current phase, remote workers
    (loadgen/distributed.py). Each step here does nothing unless the way overrides it."""

    def admit(self, phase: Phase, previous: Phase | None) -> None:
        """Before `phase` becomes current; `previous` is the phase run before it (None for the first)."""

    def start(self, phase: Phase) -> None:
        """`phase` is current: its users are sent (returns once they are)."""

    def release(self, phase: Phase) -> None:
        """`phase` is over and its records written: its users let go, or kept for the next phase."""

    def halt(self) -> None:
        """The run stopped: every user stopped, mid-stream (each writes its partial record)."""

    def end(self, complete: bool) -> None:
        """The run is over (`complete`: no stop cut it short), just before its last phase is closed."""


class PhaseDriver:
    """Each phase of a run in turn: made current, its users started and awaited, its records written and its users
    let go, what follows it added (a noisy phase's retry right after it, the knee's next load at the end).

    The parts a way of running has not got are None: the web UI warms up no engine, watches no host noise and posts
    no annotation; it is never stopped by the driver either (Locust's test_stop ends its conductor), so it has no
    `stops`.
    """

    def __init__(
        self,
        run: LoadRun,
        users: Users,
        *,
        stops: dict[str, Event] | None = None,
        sampler: Sampler | None = None,
        ready: Callable[[Phase, Phase | None], bool] | None = None,
        noise: NoiseKeeper | None = None,
        retries: int = 0,
        annotator: PhaseAnnotator | None = None,
        say: Callable[[str], None] | None = None,
    ):
        """stops: what ends the run mid-phase, by the run's status it gives ("failed": the run aborted, ...), the
        first set wins; sampler: the engine's gauges per phase (servescope/prometheus/sampler.py); ready: the
        phase's engine warmed up and quiet (False: the run stopped meanwhile); noise: the host-noise keeper
        (loadgen/trials.py), a phase flagged by it run again up to `retries` times; annotator: each finished phase
        posted to Grafana; say: the driver's own lines (none where unset)."""
        self.run, self.users = run, users
        self.stops = stops or {}
        self.sampler, self.noise, self.retries, self.annotator = sampler, noise, retries, annotator
        self.ready = ready or (lambda phase, previous: True)
        self.say = say or (lambda text: None)

    def stopped(self) -> str | None:
        """Why the run stopped (the first of `stops` set); None while it runs."""
        return next((status for status, event in self.stops.items() if event.is_set()), None)

    def drive(self) -> str:
        """Every phase in turn, then the run's status ("complete", or the stop's); the last phase closed."""
        previous: Phase | None = None
        for phase in self.run.phases:  # the run's own list: what add_what_follows adds to it comes in its turn
            if self.stopped():
                break
            self.users.admit(phase, previous)
            if not self.ready(phase, previous) or not self.run_phase(phase):
                break
            self.add_what_follows(phase)
            previous = phase
        status = self.stopped() or "complete"
        if status != "complete":
            self.users.halt()  # kills users mid-stream: each writes its partial record as "interrupted"
        self.users.end(status == "complete")
        # Close the last phase (its PhaseRecords; an interrupted one keeps what finished); skip what never started.
        self.run.finish()
        return status

    def run_phase(self, phase: Phase) -> bool:
        """One phase made current, its users started and awaited, its records written and its users let go; False
        when the run stopped in it."""
        if self.noise is not None:
            self.noise.begin(phase.settings.target)
        self.run.advance()
        if self.sampler is not None:
            self.sampler.start(phase.title)  # the engine's gauges into samples.jsonl
        self.users.start(phase)
        gevent.wait([phase.done, *self.stops.values()], count=1)
        if self.stopped():
            # Users stop first, mid-stream (each writes its partial record): the sampler's last read can take
            # its time without another request starting meanwhile.
            self.users.halt()
            if self.sampler is not None:
                self.sampler.stop()
            return False
        if self.sampler is not None:
            self.sampler.stop()
        phase.emit()
        self.users.release(phase)
        if self.annotator is not None:
            self.annotator.phase_done(phase)
        if phase.backoff_count:
            self.say(
                f"{phase.settings.target.instance} {phase.title}: the engine refused connections: users waited "
                f"{phase.backoff_count} times, {phase.backoff_s:.1f} s in all, before sending again"
            )
        return True

    def add_what_follows(self, phase: Phase) -> None:
        """What a finished phase adds to the run: its retry when the host was noisy, the knee's next load."""
        phases = self.run.phases
        noisy = self.noise.flags() if self.noise is not None else []
        retry = phase.again() if noisy and phase.attempt <= self.retries else None
        if retry is not None:
            phases.insert(phases.index(phase) + 1, retry)
            self.say(
                f"{phase.settings.target.instance} {phase.title}: {noisy[0]}: running it again as {retry.title} "
                f"(LOADGEN_NOISE_RETRIES={self.retries})"
            )
        if phase.planner is not None and self.run.folder is not None:  # the knee: the next load from this one's results
            follow_up = phase.planner.after(phase, self.run.folder)
            if follow_up is not None:
                phases.append(follow_up)
