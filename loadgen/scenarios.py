"""Load phases (sequential, burst, ramp step, open-loop rate, sweep level) and the run that steps through them.

A phase hands work to Locust users and knows when it is done; users pull work from the run's
current phase, so the same user classes serve the headless CLI, the web UI's load shape and
distributed workers. The burst barrier releases every user of a round in the same gevent hub
iteration: sends go out within a millisecond or two, where `curl ... &` spawns processes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice, takewhile

import gevent
from gevent.event import Event

from loadgen.targets import Target
from servescope.contracts.runfolder import PhaseRecord, RequestRecord, RunFolder, trial_phase_name
from servescope.judgements.arrivals import Schedule
from servescope.text import words
from servescope.workloads.base import Prompt, PromptSet

SCENARIOS = ("sequential", "burst", "ramp", "rate", "sweep", "replay", "knee")
MAX_USERS = 10_000  # users of one phase (burst size, a ramp step, a sweep level): each holds a greenlet and a socket


@dataclass
class Settings:
    """What every request of a phase shares."""

    target: Target
    prompt_set: PromptSet
    max_tokens: int
    temperature: float
    timeout_s: float  # REQUEST_TIMEOUT unless the user says otherwise
    think_s: float = 0.0  # a conversation's pause between an answer and its next turn (--think-time)


@dataclass
class Work:
    """One request a phase hands to a user: its prompt and phase, and its arrival index or scheduled send time."""

    prompt: Prompt
    phase_name: str  # for bursts the round: burst-1, burst-2, ...
    arrival_index: int | None = None
    scheduled_at: float | None = None  # open loop: epoch seconds the schedule said to send it


@dataclass
class Share:
    """A distributed worker's part of a phase, set by loadgen/distributed.py when the master starts the phase."""

    users: int  # this worker's users of the phase
    first: int = 0  # burst: the first prompt of its users (the users of the workers before it); else its place
    stride: int = 1  # workers sharing a closed-loop or open-loop phase: each takes every stride-th prompt / arrival
    requests: int | None = None  # closed loop: its quota (requests per user x its users); None: until told to stop
    hold: Callable[[int], None] | None = None  # burst: returns when the master releases round N on every worker


class _Span:
    """First send and last finish of a group of requests (a phase or one burst round)."""

    def __init__(self) -> None:
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.requests = 0
        self.concurrency: int | None = None  # a burst round released with fewer than the phase's users (a lost worker)

    def add(self, record: RequestRecord, elapsed_s: float) -> None:
        end = record.started_at + elapsed_s
        self.started_at = record.started_at if self.started_at is None else min(self.started_at, record.started_at)
        self.ended_at = end if self.ended_at is None else max(self.ended_at, end)
        self.requests += 1


class Phase:
    scenario = ""
    user_class = "ClosedLoopUser"
    planner = None  # a search that picks the next phase from this one's results (loadgen/knee.py)
    level: float | None = None  # the load the planner asked of this phase
    open_loop = False  # arrivals on a schedule (one schedule per process), not users sending back to back
    in_rounds = False  # released round by round at a barrier (a burst): a distributed master releases each round
    max_requests: int | None = None  # the phase's --requests, where it takes one

    def __init__(self, settings: Settings, name: str, users: int, repetition: int = 1, attempt: int = 1):
        self.settings = settings
        self.name = name
        self.users = users
        self.repetition, self.attempt = repetition, attempt  # which pass and which run of it (PhaseRecord)
        self.done = Event()
        self.in_flight = 0
        self.spans: dict[str, _Span] = {}
        self.emitted: set[str] = set()
        self.recorder = None  # where PhaseRecords go, from begin()
        self.share: Share | None = None  # on a distributed worker: this process's part (None: all of it)
        self.sessions: int | None = users  # conversations a conversation set keeps open at once (None: open loop)
        self.backoff_count, self.backoff_s = 0, 0.0  # closed-loop users' waits after refused requests
        self._source = None

    def label(self, name: str) -> str:
        """A span's recorded name: unique across repetitions and attempts ("burst-1#2")."""
        return trial_phase_name(name, self.repetition, self.attempt)

    @property
    def title(self) -> str:
        return self.label(self.name)

    # Whose prompts a request gets: None sends the set's index-th prompt whatever the phase (the matched set: a
    # sequential pass and a burst send the same ones); a phase name draws a fresh set's own prompts for this phase.
    prompt_key: str | None = None

    def prompt(self, index: int) -> Prompt:
        """The prompt of this phase's request `index` (a fresh set: drawn for this phase; a fixed one: cycling)."""
        s = self.settings
        return s.prompt_set.prompt(index, self.prompt_key, s.target.info.get("template_tokens"))

    @property
    def source(self):
        """What turns this phase's work into requests: the prompt set's per-phase state (a conversation's history)."""
        if self._source is None:
            self._source = self.settings.prompt_set.source(self)
        return self._source

    def begin(self, recorder) -> None:
        """The phase becomes current: its finished spans go to `recorder`."""
        self.recorder = recorder

    # -- work hand-out (called from user greenlets) --
    def next_work(self) -> Work | None:
        raise NotImplementedError

    def finished(self, work: Work, record: RequestRecord, elapsed_s: float) -> None:
        self.in_flight -= 1
        self.add_record(record, elapsed_s)
        self._check_done()

    def add_record(self, record: RequestRecord, elapsed_s: float) -> None:
        """Widen the span of the record's phase (or burst round)."""
        self.span(record.phase).add(record, elapsed_s)

    def span(self, name: str) -> _Span:
        return self.spans.setdefault(name, _Span())

    def add_worker_record(self, record: RequestRecord) -> None:
        """On a distributed master, which sends nothing itself: a record a worker measured (loadgen/distributed.py
        ends the phase when every worker says its part is over)."""
        self.add_record(record, record.e2e_s or 0.0)

    def _check_done(self) -> None:
        if self.exhausted() and self.in_flight == 0:
            self.done.set()

    def exhausted(self) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        """The run moved on: hand out no more work (what is in flight finishes)."""

    def again(self) -> Phase | None:
        """The same phase once more, as its next attempt (a retry of a phase the host noise rule flagged); None for a
        phase that is not retried (a closed or open loop runs for a time: its retry would not be the same load)."""
        return None

    # -- a distributed run's part of the phase per worker (loadgen/distributed.py) --
    def worker_share(self, users: int, first_user: int, place: int, workers: int) -> Share:
        """The part of the phase a worker with `users` of its users runs: the worker at `place` of `workers` takes
        every workers-th prompt or arrival from its place (`first_user`: the users of the workers before it)."""
        return Share(users, first=place, stride=workers)

    @property
    def master_clock_s(self) -> float | None:
        """How long the master's clock runs the phase on every worker (None: each worker's part ends by itself)."""
        return None

    def start_clock(self) -> None:
        """The phase's clock starts (on a distributed master: once every worker was told to start)."""

    def stop(self) -> None:
        """The master's clock ended the phase on every worker: no more requests (in-flight ones finish)."""

    def expected_requests(self, scheduled: int | None) -> int | None:
        """How many requests the whole phase sends, when that is known (`scheduled`: how many arrivals an open-loop
        schedule had); None: until a clock ends it. What a lost distributed worker's unsent requests are counted
        against."""
        return self.max_requests

    def emit(self, names: list[str] | None = None) -> None:
        """Write the PhaseRecords of finished spans (each once)."""
        for record in self.phase_records():
            if record.phase in self.emitted or (names is not None and record.phase not in names):
                continue
            self.emitted.add(record.phase)
            if self.recorder is not None:
                self.recorder.phase(record)

    def phase_records(self) -> list[PhaseRecord]:
        s = self.settings
        return [
            PhaseRecord(
                engine=s.target.kind,
                instance=s.target.instance,
                scenario=self.scenario,
                phase=name,
                started_at=span.started_at,
                ended_at=span.ended_at,
                requests=span.requests,
                concurrency=self.users if span.concurrency is None else span.concurrency,
                prompt_set=s.prompt_set.name,
                prompt_set_sha256=s.prompt_set.sha256,
                max_tokens=s.max_tokens,
                repetition=self.repetition,
                attempt=self.attempt,
            )
            for name, span in self.spans.items()
            if span.started_at is not None
        ]

    def describe(self) -> str:
        return f"{self.settings.target.instance} {self.title}: {words.count(self.users, 'user')}"


class SequentialPhase(Phase):
    """One user, the prompt set back to back (the reference page's `while read p; do curl ...; done`)."""

    scenario = "sequential"
    user_class = "SequentialUser"

    def __init__(
        self,
        settings: Settings,
        name: str = "sequential",
        repeat: int = 1,
        count: int | None = None,
        repetition: int = 1,
        attempt: int = 1,
    ):
        super().__init__(settings, name, users=1, repetition=repetition, attempt=attempt)
        # `count` sends the first COUNT prompts, cycling, exactly as a burst of COUNT does: the matched set.
        if count is not None:
            self.sessions = count  # a conversation set plays the burst's conversations, one request at a time
        # Handed out one at a time (nothing queued up front: the memory of a run does not grow with its length).
        self.count = len(settings.prompt_set) * repeat if count is None else count
        self.issued = 0

    def next_work(self) -> Work | None:
        if self.exhausted():
            return None
        work = Work(self.prompt(self.issued), self.title)
        self.issued += 1
        self.in_flight += 1
        return work

    def exhausted(self) -> bool:
        return self.issued >= self.count

    def again(self) -> Phase:
        return SequentialPhase(
            self.settings, self.name, count=self.count, repetition=self.repetition, attempt=self.attempt + 1
        )

    def expected_requests(self, scheduled: int | None) -> int:
        return self.count


class BurstPhase(Phase):
    """SIZE users released at once, all awaited, ROUNDS times with PAUSE between (the reference page's `&` + `wait`)."""

    scenario = "burst"
    user_class = "BurstUser"
    in_rounds = True

    def __init__(
        self,
        settings: Settings,
        size: int,
        rounds: int = 1,
        pause_s: float = 1.0,
        name: str = "burst",
        repetition: int = 1,
        attempt: int = 1,
    ):
        super().__init__(settings, name, users=size, repetition=repetition, attempt=attempt)
        self.size, self.rounds, self.pause_s = size, rounds, pause_s
        self.round = 0  # rounds released so far
        self.arrived = 0
        self.next_index = 0
        self.gate = Event()
        self.last_round_end: float | None = None

    def round_name(self, round_no: int) -> str:
        """The recorded phase of round `round_no` (1-based): burst-1, burst-2, ... ("burst-1#2" in a repetition)."""
        return self.label(f"{self.name}-{round_no}")

    def barrier(self) -> int:
        """How many users a round waits for in this process (on a distributed worker: the ones that run here)."""
        return self.size if self.share is None else max(1, min(self.size, self.share.users))

    def next_work(self) -> Work | None:
        if self.round >= self.rounds:
            return None
        round_no = self.round
        self.arrived += 1
        # Users arrive once their request of the last round is over. On a distributed worker Locust may add users
        # mid-phase (a lost worker's, handed over): one of those arriving early must not release a round that
        # still has requests in flight.
        if self.arrived < self.barrier() or self.in_flight > 0:
            self.gate.wait()
        else:
            # The last user in: every request of the previous round has finished (all users are here).
            self.arrived = 0
            if self.share is not None and self.share.hold is not None:
                self.share.hold(round_no + 1)  # and every other worker's users: the master releases (and pauses)
            elif round_no > 0 and self.pause_s > 0:
                gevent.sleep(max(0.0, self.last_round_end + self.pause_s - time.monotonic()))
            self.next_index = 0
            self.round += 1
            gate, self.gate = self.gate, Event()
            gate.set()  # waiters wake in arrival order, all in this hub iteration
        # A distributed worker's users take the prompts after the users of the workers before it: the matched set.
        index = self.next_index + (self.share.first if self.share is not None else 0)
        self.next_index += 1
        self.in_flight += 1
        return Work(self.prompt(index), self.round_name(round_no + 1), arrival_index=index)

    def finished(self, work: Work, record: RequestRecord, elapsed_s: float) -> None:
        self.last_round_end = time.monotonic()
        super().finished(work, record, elapsed_s)
        if self.in_flight == 0:
            self.emit([work.phase_name])  # the round is over: its wall time is known now

    def exhausted(self) -> bool:
        return self.round >= self.rounds

    def again(self) -> Phase:
        return BurstPhase(
            self.settings,
            self.size,
            self.rounds,
            self.pause_s,
            self.name,
            repetition=self.repetition,
            attempt=self.attempt + 1,
        )

    def expected_requests(self, scheduled: int | None) -> int:
        return self.size * self.rounds

    def worker_share(self, users: int, first_user: int, place: int, workers: int) -> Share:
        # Its users take the prompts after the users of the workers before it: the matched set.
        return Share(users, first=first_user)

    def describe(self) -> str:
        return f"{self.settings.target.instance} {self.title}: {self.size} at once x {self.rounds}"


class ClosedLoopPhase(Phase):
    """USERS users each sending back to back for DURATION (or until REQUESTS were sent): a ramp step or sweep level."""

    user_class = "ClosedLoopUser"

    def __init__(
        self, settings: Settings, name: str, users: int, duration_s: float | None, requests: int | None, scenario: str
    ):
        super().__init__(settings, name, users)
        self.prompt_key = self.title  # every level draws its own prompts: none is served from an earlier's cache
        if duration_s is None and requests is None:
            raise ValueError("a closed-loop phase needs a duration or a request count")
        self.scenario = scenario
        self.duration_s, self.max_requests = duration_s, requests
        self.t_start: float | None = None
        self.issued = 0
        self.closed = False

    def start_clock(self) -> None:
        if self.t_start is None:
            self.t_start = time.monotonic()

    def next_work(self) -> Work | None:
        self.start_clock()
        if self.exhausted():
            self.closed = True
            self._check_done()
            return None
        share = self.share or Share(self.users)
        work = Work(self.prompt(share.first + self.issued * share.stride), self.name)
        self.issued += 1
        self.in_flight += 1
        return work

    def exhausted(self) -> bool:
        if self.closed:
            return True
        # A distributed worker sends its quota, or until the master's clock ends the phase for every worker.
        limit = self.max_requests if self.share is None else self.share.requests
        if limit is not None and self.issued >= limit:
            return True
        return (
            self.share is None
            and self.duration_s is not None
            and self.t_start is not None
            and time.monotonic() - self.t_start >= self.duration_s
        )

    def stop(self) -> None:
        """No more requests: the master's clock ended the step on every worker (in-flight ones finish)."""
        self.closed = True
        self._check_done()

    def close(self) -> None:
        self.closed = True

    def worker_share(self, users: int, first_user: int, place: int, workers: int) -> Share:
        share = super().worker_share(users, first_user, place, workers)
        if self.max_requests is not None:  # its quota: the phase's requests in proportion to its users
            share.requests = round(self.max_requests * users / max(1, self.users))
        return share

    @property
    def master_clock_s(self) -> float | None:
        return self.duration_s

    def time_left(self) -> float | None:
        if self.duration_s is None or self.t_start is None:
            return None
        return self.t_start + self.duration_s - time.monotonic()


class RatePhase(Phase):
    """Open loop: arrivals at the times of a schedule (servescope/judgements/arrivals.py: constant gaps, Poisson, a trace's own
    times), each sent without waiting for the others."""

    scenario = "rate"
    user_class = "RateUser"
    open_loop = True
    scheduling = False  # its schedule has started in this process (one per process, whatever its rate users)

    def __init__(
        self,
        settings: Settings,
        schedule: Schedule,
        duration_s: float | None,
        requests: int | None,
        max_in_flight: int = 256,
        name: str | None = None,
        scenario: str = "rate",
    ):
        super().__init__(settings, name or f"{scenario}-{schedule.label}", users=1)
        self.sessions = None
        self.scenario = scenario
        self.prompt_key = self.title
        if duration_s is None and requests is None and schedule.length is None:
            raise ValueError("an open-loop phase needs a duration or a request count")
        self.schedule = schedule
        self.duration_s, self.max_requests = duration_s, requests  # a replay's --duration: in replayed seconds
        self.max_in_flight = max_in_flight
        self.issued = 0  # arrivals of the schedule so far (on a distributed worker, every worker's)
        self.stopped = False
        self.slot_free = Event()

    def due(self) -> Iterator[float]:
        """The schedule's offsets within the phase's bounds (--requests arrivals, --duration seconds)."""
        offsets = self.schedule.offsets()
        if self.max_requests is not None:
            offsets = islice(offsets, self.max_requests)
        if self.duration_s is not None:
            offsets = takewhile(lambda at: at < self.duration_s, offsets)
        return offsets

    def arrivals(self) -> Iterator[Work]:
        """Yields work at its scheduled instant (absolute schedule: a slow send never delays the next arrival).

        Each work carries that instant (`scheduled_at`, epoch seconds): when the client falls behind (its own
        in-flight ceiling, a busy CPU), the send comes later than the schedule and the report counts the wait.

        On a distributed worker every worker draws the whole schedule (same seed, same start: the master's
        release) and sends every stride-th arrival from its place, so together they send the one schedule.
        """
        if self.scheduling:
            return  # one schedule per process, whatever number of rate users it was given
        self.scheduling = True
        share = self.share or Share(1)
        max_in_flight = math.ceil(self.max_in_flight / share.stride)
        t0 = time.monotonic()
        epoch0 = time.time()
        for at in self.due():
            if self.stopped:
                break
            if self.issued % share.stride == share.first:
                gevent.sleep(max(0.0, t0 + at - time.monotonic()))
                if self.stopped:
                    break
                while self.in_flight >= max_in_flight:  # the client's own ceiling: bounded memory; shows as lag
                    self.slot_free.clear()
                    self.slot_free.wait(1.0)
                self.in_flight += 1
                yield Work(self.prompt(self.issued), self.name, arrival_index=self.issued, scheduled_at=epoch0 + at)
            self.issued += 1
        self.stopped = True
        self._check_done()

    def next_work(self) -> Work | None:  # the RateUser drives arrivals() instead
        return None

    def finished(self, work: Work, record: RequestRecord, elapsed_s: float) -> None:
        super().finished(work, record, elapsed_s)
        self.slot_free.set()

    def exhausted(self) -> bool:
        return self.stopped

    def close(self) -> None:
        self.stopped = True

    def expected_requests(self, scheduled: int | None) -> int | None:
        if self.schedule.length is not None:  # a trace: its arrivals within the bounds are known up front
            return sum(1 for _ in self.due())
        return self.max_requests if self.max_requests is not None else scheduled

    def describe(self) -> str:
        what = self.schedule.describe()
        return super().describe() if what is None else f"{self.settings.target.instance} {self.name}: {what}"


class LoadRun:
    """The phases of one run in order, the current one, and where finished records go."""

    draining = False  # the load shape asks for 0 users between two phases (loadgen/locustfile.py's ShapeUsers)

    def __init__(
        self,
        phases: list[Phase],
        recorder,
        *,
        folder: RunFolder | None = None,
        started_at: float | None = None,
    ):
        self.phases = phases
        self.recorder = recorder
        self.folder = folder  # the run folder this process writes (None on a distributed worker)
        self.started_at = time.time() if started_at is None else started_at
        self.index = -1
        self.changed = Event()
        self.closed = False  # its folder is finished: manifest, Locust's files
        self.failure: str | None = None  # why the run was stopped early by something other than the user
        self.aborted = Event()

    @property
    def phase(self) -> Phase | None:
        return self.phases[self.index] if 0 <= self.index < len(self.phases) else None

    def advance(self) -> Phase | None:
        """Close the current phase (its PhaseRecords are written) and make the next one current."""
        current = self._close_current()
        self.index += 1
        self._changed()
        nxt = self.phase
        if nxt is not None:
            nxt.begin(self.recorder)
            self.recorder.line(f"phase {nxt.describe()}")
            self.recorder.users(nxt.settings.target.kind, nxt.scenario, nxt.users)
        if current is not None and (nxt is None or nxt.scenario != current.scenario):
            self.recorder.users(current.settings.target.kind, current.scenario, 0)
        return nxt

    def finish(self) -> None:
        """End the run where it stands: the current phase keeps what finished, the ones after it never start."""
        current = self._close_current()
        self.index = len(self.phases)
        self._changed()
        if current is not None:
            self.recorder.users(current.settings.target.kind, current.scenario, 0)

    def close(self) -> None:
        self.closed = True

    def abort(self, reason: str) -> None:
        """Stop the run for `reason` (the first one is kept): whoever drives the run ends it and says why."""
        if self.failure is None:
            self.failure = " ".join(reason.split())
        self.aborted.set()
        self._changed()

    def _close_current(self) -> Phase | None:
        current = self.phase
        if current is not None:
            current.emit()
            current.close()
        return current

    def _changed(self) -> None:
        changed, self.changed = self.changed, Event()
        changed.set()

    def phase_named(self, name: str) -> Phase | None:
        """The phase a record belongs to (burst rounds are named <phase>-<round>)."""
        for phase in self.phases:
            if name == phase.name or name.startswith(phase.name + "-"):
                return phase
        return None

    def wait_for_change(self, timeout: float = 1.0) -> None:
        self.changed.wait(timeout)

    @property
    def finished(self) -> bool:
        return self.index >= len(self.phases)


def parse_levels(text: str, what: str) -> list[int]:
    """`1,2,4`: the users of each step or level, each from 1 to MAX_USERS."""
    try:
        levels = [int(x) for x in str(text).replace(" ", "").split(",") if x]
    except ValueError:
        raise ValueError(f"{what}: expected a comma-separated list of integers, got {text!r}") from None
    if not levels or any(not 1 <= n <= MAX_USERS for n in levels):
        raise ValueError(f"{what}: expected user counts from 1 to {MAX_USERS}, got {text!r}")
    return levels


def spawn_rate_for(phase: Phase) -> float:
    # All users of a phase at once: the barrier / the phase itself does the pacing, not Locust's ramp-up.
    return float(max(1, phase.users))
