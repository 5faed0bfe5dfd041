"""`python -m loadgen knee`: the highest load that still meets the SLOs (bracket, bisect, repeat at the boundary) and what ran out above it.

The search runs over concurrency (closed loop: USERS users back to back) or arrival rate (open loop),
one load phase per measurement, each as long as a sweep level (--duration / --requests):

  bracket   from --start-load, double while the SLOs hold (up to --max-load); halve while they fail
            (down to --min-load)
  bisect    between the highest load that holds and the lowest that fails, to one user (concurrency)
            or --knee-precision (rate, relative)
  confirm   both boundary loads are measured again until each has --knee-repeats measurements, unless
            its verdict is settled already (per-request SLO terms, no errors, and the attainment's 95%
            Wilson interval clear of the objective: more requests could not flip it); a level's verdict
            pools all its measurements, so a repeat that flips it moves the boundary and the bisection
            goes on (--knee-probes bounds the whole search); and a boundary load whose measurements
            disagree in pace (time per output token more than pace.AGREE apart, servescope/judgements/pace.py)
            once more, so the plan can leave out a transient the others outvote

A measurement the host noise rule flags (another program took the CPU while it ran) is a
measurement of the machine as it was: a level's verdict pools its quiet measurements where it
has any, else its noisy ones (a transient is outweighed by a quiet repeat; a machine busy the
whole search is measured as it is, said in one note). A failing level measured only on a busy
host is measured at least twice when it is a boundary of the answer: so a busy host costs at most
one more measurement of the first failing level, never a repeat without end. A measurement where the engine was not there (refused, timed out, unreadable: servescope/judgements/binding.py's engine
fault): the search waits for the engine to answer its health check and measures the level again,
and after FAULT_RETRIES such measurements in a row it stops with that line, never with a capacity.
The same holds for one the load generator could not keep up with (its CPU plus run-queue wait, the
binding rule's client): the load it asked for was not offered, so its verdict says nothing of the
engine (with kernel stamps its latencies can look fine while it sent a tenth of its requests).

Whether a load meets the SLOs is servescope/judgements/slo.py's rule over that phase's records. At the lowest
failing load, what ran out is named by servescope/judgements/binding.py's rule from evidence of its own (the
phase's server samples, the latency against the level below, the engine's and the load generator's
CPU, the schedule): batch slots, KV capacity, compute, client, SLO below the floor, or undecided.
Beside each level goes the share of its prompt tokens the engine took from its prefix cache
(servescope/judgements/prefix_reuse.py), flagged when the workload did not ask for it. The search, level by
level, goes to knee.json in the run folder (what `make tune` reads) and to the terminal.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import gevent

from loadgen.scenarios import ClosedLoopPhase, Phase, RatePhase, Settings
from servescope import engines
from servescope.contracts.runfolder import (
    KNEE,
    KNEE_CONCURRENCY,
    KNEE_RATE,
    RequestRecord,
    RunFolder,
    SampleRecord,
    read_samples,
    write_file,
)
from servescope.host import hostnoise, probe
from servescope.judgements import arrivals, binding, knee_answer, pace, prefix_reuse, slo
from servescope.text import numbers, words

CONCURRENCY, RATE = KNEE_CONCURRENCY, KNEE_RATE
OVER = (CONCURRENCY, RATE)
UNITS = {CONCURRENCY: "users", RATE: "req/s"}
FAULT_RETRIES = 2  # measurements of one level in a row the engine (or the client) failed: then the search stops


def _number(value: Any) -> float | None:
    """A load as the options give it (a number, or the web UI's text already checked as one); None when not given."""
    return None if value in (None, "") else float(value)


def _whole(value: Any) -> int | None:
    return None if value in (None, "") else int(value)


@dataclass(frozen=True)
class KneeOptions:
    """The search's options (loadgen/options.py's knee rows), typed as the command line or the web UI gave them."""

    over: str
    slo: str | None  # as given: the search is judged by the RunPlan's spec
    slo_attainment: float | None
    min_load: float
    max_load: float
    start_load: float | None  # None: from the lowest load
    knee_repeats: int
    knee_precision: float
    knee_probes: int
    arrivals: str  # an open-loop level's schedule: constant or poisson
    max_in_flight: int

    @classmethod
    def from_options(cls, options: Any) -> KneeOptions:
        given = {f.name: getattr(options, f.name, None) for f in fields(cls)}
        for name in ("min_load", "max_load", "start_load", "knee_precision"):
            given[name] = _number(given[name])
        for name in ("knee_repeats", "knee_probes", "max_in_flight"):
            given[name] = _whole(given[name])
        return cls(**given)


class KneeInputError(ValueError):
    """Search input the knee cannot use. Its text names each input by what it is ("the lowest load"); `named(names)`
    is the same line with the entry's own names for them (the command line's flags, loadgen/options.py)."""

    MEANINGS = {
        "over": "the search's axis",
        "min_load": "the lowest load",
        "start_load": "the start load",
        "max_load": "the highest load",
    }

    def __init__(self, line: Callable[[Mapping[str, str]], str]):
        self.line = line
        super().__init__(line(self.MEANINGS))

    def named(self, names: Mapping[str, str]) -> str:
        return self.line({**self.MEANINGS, **names})


@dataclass
class Probe:
    """One measurement: one load phase at one level."""

    phase: str
    level: float
    started_at: float | None
    ended_at: float | None
    result: slo.SloResult
    binding: binding.Binding
    noisy: tuple[str, ...] = ()  # the host noise rule's findings: concluded from only where its level has no quiet one
    reuse: prefix_reuse.Reuse | None = None
    noise: dict | None = None  # its PhaseRecord's host noise (the engine's and the load generator's CPU)

    @property
    def fault(self) -> bool:
        """The engine was not there: not a measurement of its capacity (left out, measured again)."""
        return self.binding.resource == binding.ENGINE_FAULT

    @property
    def void(self) -> bool:
        """Not a measurement of the engine's capacity: the engine was not there, or the client could not offer the
        load (left out, measured again)."""
        return self.binding.resource in binding.STOPPED

    @property
    def client(self) -> bool:
        """The load generator could not offer the load asked for: a measurement of the client, not the engine."""
        return self.binding.resource == binding.CLIENT

    @property
    def measured(self) -> bool:
        """A measurement of the engine (noisy or not): the engine there, the load offered."""
        return not self.void


def noise_of(folder: RunFolder, phase: str, instance: str) -> tuple[tuple[str, ...], dict | None]:
    """(the host noise rule's flags, the noise itself) of a finished phase (its PhaseRecord's `noise`)."""
    for record in folder.phases():
        if record.phase == phase and record.instance == instance:
            noise = getattr(record, "noise", None)
            flags = tuple(hostnoise.flags(noise, instance))
            return flags, noise if isinstance(noise, dict) else None
    return (), None


class KneeSearch:
    """Hands out the next phase after each finished one; the phase driver appends it (loadgen/phase_driver.py)."""

    def __init__(
        self,
        settings: Settings,
        options: KneeOptions,
        spec: slo.SloSpec,
        duration_s: float | None,
        requests: int | None,
        *,
        fault_wait_s: float,
    ):
        self.settings = settings
        self.fault_wait_s = fault_wait_s  # how long a fault waits for the engine to answer again
        self.over = str(options.over)
        if self.over not in OVER:
            over = self.over
            raise KneeInputError(lambda n: f"{n['over']} {over!r}: expected {' or '.join(OVER)}")
        self.spec = spec
        self.min_load = self._level(options.min_load, "min_load")
        self.max_load = self._level(options.max_load, "max_load")
        start = options.start_load if options.start_load is not None else self.min_load
        self.start_load = self._level(start, "start_load")
        if not self.min_load <= self.start_load <= self.max_load:
            got = f"{self.min_load:g}, {self.start_load:g}, {self.max_load:g}"
            raise KneeInputError(
                lambda n: f"knee: expected {n['min_load']} <= {n['start_load']} <= {n['max_load']}, got {got}"
            )
        self.repeats = options.knee_repeats
        self.precision = options.knee_precision
        self.max_probes = options.knee_probes
        self.duration_s, self.requests = duration_s, requests  # per measurement (requests: per user when closed)
        self.arrivals = options.arrivals  # an open-loop level's schedule: constant or poisson
        self.max_in_flight = options.max_in_flight
        self.probes: list[Probe] = []
        self._records: dict[str, list[RequestRecord]] = {}  # phase -> its records (levels pool them)
        self._samples: dict[str, list[SampleRecord]] = {}  # phase -> this engine's samples during it
        self.note = ""
        self.stopped_on: str | None = None  # the binding resource (engine fault, client) that ended the search
        self.say = print  # where the search's own lines go between measurements (the CLI's recorder)
        self.prompt_set = settings.prompt_set

    def _level(self, value: float, name: str) -> float:
        """One load bound (`name`: its KneeOptions field), checked for the search's axis."""
        level = float(value)
        if self.over == CONCURRENCY:
            if level != int(level) or level < 1:
                raise KneeInputError(lambda n: f"{n[name]} {value!r}: a concurrency is a whole number of users >= 1")
            return int(level)
        if level <= 0:
            raise KneeInputError(lambda n: f"{n[name]} {value!r}: a rate is a number of arrivals per second > 0")
        return level

    # ------------------------------------------------------------ phases

    def phase(self, level: float) -> Phase:
        k = sum(1 for p in self.probes if p.level == level) + 1
        if self.over == CONCURRENCY:
            n = int(level)
            phase: Phase = ClosedLoopPhase(
                self.settings,
                f"knee-c{n}-{k}",
                n,
                self.duration_s,
                None if self.requests is None else self.requests * n,
                scenario="knee",
            )
        else:
            schedule = arrivals.Poisson(level) if self.arrivals == "poisson" else arrivals.Constant(level)
            phase = RatePhase(
                self.settings,
                schedule,
                duration_s=self.duration_s,
                requests=self.requests,
                max_in_flight=self.max_in_flight,
                name=f"knee-r{level:g}-{k}",
                scenario="knee",
            )
        phase.planner = self
        phase.level = level
        return phase

    def first(self) -> Phase:
        return self.phase(self.start_load)

    def after(self, phase: Phase, folder: RunFolder) -> Phase | None:
        """Judge the finished phase from the run folder; the next phase to run, or None when the search is over."""
        target = self.settings.target
        records = [r for r in folder.requests() if r.phase == phase.name and r.instance == target.instance]
        samples = _samples_of(list(read_samples(folder)), phase.name, target.kind, target.instance)
        started = min((r.started_at for r in records), default=None)
        ended = max((slo.finished_at(r) for r in records), default=None)
        wall = (ended - started) if started is not None and ended is not None else 0.0
        flags, noise = noise_of(folder, phase.name, target.instance)
        result = slo.evaluate(self.spec, records, wall)
        alone = binding.Level(phase.level, records, samples, [noise] if noise else [], result)
        probe = Probe(
            phase.name,
            phase.level,
            started,
            ended,
            result,
            self._classify(alone, None),
            flags,
            prefix_reuse.of_phase(samples, records),
            noise,
        )
        self.probes.append(probe)
        self._records[phase.name] = records
        self._samples[phase.name] = samples
        warning = prefix_reuse.warning(probe.reuse, self.prompt_set.asked_reuse, self.prompt_set.name)
        if warning:
            self.say(f"knee: {phase.name}: {warning}")
        level = self.next_level()
        self.write(folder)
        if level is not None and probe.client:
            self.say(
                f"knee: {phase.name}: the load generator could not keep up ({probe.binding.evidence}): "
                f"measuring {level:g} again"
            )
        if level is not None and probe.fault:
            self.say(f"knee: {phase.name}: engine fault ({probe.binding.evidence}): measuring {level:g} again")
            self._wait_for_engine()
        return None if level is None else self.phase(level)

    def _classify(self, failing: binding.Level, below: binding.Level | None) -> binding.Binding:
        return binding.classify(
            failing,
            below,
            engine=self.settings.target.kind,
            spec=self.spec,
            open_loop=self.over == RATE,
            lowest=failing.level <= self.min_load,
        )

    def _wait_for_engine(self) -> None:
        """Until the engine answers its health check again (at most fault_wait_s, LOADGEN_FAULT_WAIT_S): a restarting
        engine is not measured while it starts."""
        target = self.settings.target
        url = target.root_url + engines.kind(target.kind).health_path
        deadline = time.monotonic() + self.fault_wait_s
        while time.monotonic() < deadline:
            if probe.is_up(url, timeout=2):
                return
            gevent.sleep(0.5)

    # ------------------------------------------------------------ the search

    def trusted(self, level: float | None = None) -> list[Probe]:
        """The measurements the search concludes from (of one level): the engine there; of a level measured both
        quietly and on a busy host, the quiet ones only."""
        measured = [p for p in self.probes if p.measured and (level is None or p.level == level)]
        quiet = {p.level for p in measured if not p.noisy}
        return [p for p in measured if not p.noisy or p.level not in quiet]

    def levels(self) -> list[float]:
        return sorted({p.level for p in self.trusted()})

    def verdict(self, level: float) -> slo.SloResult:
        """All trusted measurements of a level pooled: more requests, a steadier percentile."""
        probes = self.trusted(level)
        records = [r for p in probes for r in self._records.get(p.phase, [])]
        return slo.evaluate(self.spec, records, sum(p.result.wall_s for p in probes))

    def boundary(self) -> tuple[float | None, float | None]:
        """(the knee: highest level below every failing one that holds, the lowest failing level)."""
        meets = {level: self.verdict(level).meets for level in self.levels()}
        fails = [level for level, ok in meets.items() if not ok]
        lowest_fail = min(fails) if fails else None
        below = [level for level, ok in meets.items() if ok and (lowest_fail is None or level < lowest_fail)]
        return (max(below) if below else None), lowest_fail

    def next_level(self) -> float | None:
        if len(self.probes) >= self.max_probes:
            self.note = f"the probe budget (--knee-probes {self.max_probes}) was spent before the search settled"
            return None
        last = self.probes[-1]
        if last.void:
            run = 0
            for p in reversed(self.probes):
                if p.binding.resource != last.binding.resource:
                    break
                run += 1
            if run >= FAULT_RETRIES:
                self.stopped_on = last.binding.resource
                self.note = (
                    f"{binding.STOPPED[self.stopped_on]} at {last.level:g} {UNITS[self.over]} in {run} measurements in a row "
                    f"({last.binding.evidence}): the search stopped; nothing above is a capacity"
                )
                return None
            return last.level  # not a measurement of the engine: the same load again (once it answers)
        knee, fail = self.boundary()
        if fail is None:
            top = max(self.levels())
            return self._grow(top) if top < self.max_load else self._settle(top)
        if knee is None:
            return self._shrink(fail) if fail > self.min_load else self._settle(fail)
        if not self._resolved(knee, fail):
            return self._middle(knee, fail)
        return self._settle(knee, fail)

    def _settle(self, *levels: float) -> float | None:
        """The boundary level still owed a measurement: for its verdict (_confirm), else for its pace (_pace_owed)."""
        level = self._confirm(*levels)
        return level if level is not None else self._pace_owed(*levels)

    def _busy_only(self, level: float) -> bool:
        """Every measurement the search concludes from at this level was taken on a busy host."""
        return all(p.noisy for p in self.trusted(level))

    def _confirm(self, *levels: float) -> float | None:
        for level in levels:
            # A failure measured only on a busy host may be a transient's: a boundary level that failed so is measured
            # at least twice before it stands (a quiet repeat outweighs it; a host busy throughout fails it again).
            verdict = self.verdict(level)
            if slo.settled(self.spec, verdict):
                continue  # more measurements could not flip it (its attainment's 95% interval is clear of the objective)
            busy_failure = self._busy_only(level) and not verdict.meets
            if len(self.trusted(level)) < (max(self.repeats, 2) if busy_failure else self.repeats):
                return level
        return None

    def paces(self, level: float) -> list[float | None]:
        """Each trusted measurement's pace at this level, in the order measured."""
        return [self._pace(p) for p in self.trusted(level)]

    def _pace(self, probe: Probe) -> float | None:
        """One measurement's pace (pace.of_records): its requests' mean time per output token."""
        return pace.of_records(self._records.get(probe.phase, []))

    def _pace_owed(self, *levels: float) -> float | None:
        """A boundary level whose measurements disagree in pace (no two within pace.AGREE): measured once more, so a
        transient in one of them is outvoted where the plan models the replica (servescope/judgements/pace.py). At
        most one beyond max(--knee-repeats, 2): an engine whose speed keeps moving is measured as it is, and the
        plan's speed spread carries it."""
        for level in levels:
            paces = self.paces(level)
            if len(paces) <= max(self.repeats, 2) and pace.owed(paces):
                shown = ", ".join(numbers.milliseconds(p, missing="-") for p in paces)
                self.say(
                    f"knee: {level:g} {UNITS[self.over]}: its measurements disagree in pace ({shown} ms a token, more "
                    f"than {pace.AGREE:.0%} apart): measuring it once more"
                )
                return level
        return None

    def _grow(self, level: float) -> float:
        return min(self.max_load, level * 2)

    def _shrink(self, level: float) -> float:
        return max(self.min_load, level // 2 if self.over == CONCURRENCY else _round(level / 2))

    def _middle(self, low: float, high: float) -> float:
        return (low + high) // 2 if self.over == CONCURRENCY else _round((low + high) / 2)

    def _resolved(self, low: float, high: float) -> bool:
        return high - low <= 1 if self.over == CONCURRENCY else high <= low * (1 + self.precision)

    # ------------------------------------------------------------ the answer

    def pooled(self, level: float) -> binding.Level:
        """Every trusted measurement of a level, as the binding rule reads it."""
        probes = self.trusted(level)
        return binding.Level(
            level,
            [r for p in probes for r in self._records.get(p.phase, [])],
            [s for p in probes for s in self._samples.get(p.phase, [])],
            [p.noise for p in probes if p.noise],
            self.verdict(level),
        )

    def limit_binding(self) -> tuple[float | None, binding.Binding]:
        """The binding resource at the lowest failing level (else the highest measured), against the level below it."""
        knee, fail = self.boundary()
        measured = self.levels()
        last = self.probes[-1] if self.probes else None
        if self.stopped_on or (not measured and last is not None and last.void):
            return last.level, last.binding
        if not measured:
            return None, binding.Binding(binding.UNDECIDED, "nothing measured")
        level = fail if fail is not None else max(measured)
        # Compute is read against the lightest load measured (1 user, as a rule): next to the knee, a latency that
        # grows steadily with the batch changes little from one level to the next (x1.13 from 6 to 7 users where
        # it is x3.4 from 1), which said nothing about the batch's cost.
        lower = [x for x in measured if x < level]
        return level, self._classify(self.pooled(level), self.pooled(min(lower)) if lower else None)

    def reuse(self, level: float) -> prefix_reuse.Reuse:
        probes = self.trusted(level)
        return prefix_reuse.of_phase(
            [s for p in probes for s in self._samples.get(p.phase, [])],
            [r for p in probes for r in self._records.get(p.phase, [])],
        )

    def non_monotonic(self) -> bool:
        """A level that holds above one that fails: feasibility is not monotone in the load (a noisy machine?)."""
        meets = {level: self.verdict(level).meets for level in self.levels()}
        fails = [level for level, ok in meets.items() if not ok]
        return any(ok and fails and level > min(fails) for level, ok in meets.items())

    def unsettled(self) -> int:
        """About how many more measurements would settle the answer (0: settled): bisections left between the
        boundary loads, and the boundary loads' confirmations still owed (derived from the search's own rules)."""
        knee, fail = self.boundary()
        if knee is None or fail is None:
            return 0
        owed = sum(1 for level in (knee, fail) if self._confirm(level) is not None)
        if self._resolved(knee, fail):
            return owed
        steps, low, high = 0, knee, fail
        while not self._resolved(low, high) and steps < 32:
            low, steps = self._middle(low, high), steps + 1
        return steps + owed + 1  # each bisected level measured, then the new boundary confirmed (at least once)

    def capacity_range(self) -> list[float | None] | None:
        """[lowest, highest] capacity the measurements allow while unsettled (None: settled or no boundary).

        A knee still owed its confirmation may fail on a repeat: the range starts at the highest other load that
        held. A failing load still owed its confirmation may yet hold: the range is open above. Between two settled
        loads not yet bisected, any load between them is possible."""
        knee, fail = self.boundary()
        if knee is None or fail is None or not self.unsettled():
            return None
        low: float | None = knee
        if self._confirm(knee) is not None:
            low = max((x for x in self.levels() if x < knee and self.verdict(x).meets), default=None)
        high: float | None = None
        if self._confirm(fail) is None:
            high = fail - 1 if self.over == CONCURRENCY else fail
        return [low, high]

    def summary(self) -> dict[str, Any]:
        knee, fail = self.boundary()
        level, b = self.limit_binding()
        engine = self.settings.target.kind
        knob = binding.knob_for(engine, b.resource)
        if self.stopped_on or (not self.trusted() and self.probes and self.probes[-1].void):
            status = binding.STOPPED[self.stopped_on or self.probes[-1].binding.resource]
        elif not self.trusted():
            status = "nothing measured"
        elif knee is None:
            status = "fails at the lowest load"
        elif fail is None:
            status = "meets the SLOs up to the highest load"
        else:
            status = "found"
        used = {p.phase for p in self.trusted()}
        return {
            "over": self.over,
            "unit": UNITS[self.over],
            "engine": engine,
            "instance": self.settings.target.instance,
            "spec": self.spec.text,
            "objective": self.spec.objective,
            "knee": knee,
            "first_failing": fail,
            "status": status,
            "non_monotonic": self.non_monotonic(),
            # Measurements still owed before the answer stands (0: settled); a search stopped by its budget owes some.
            "unsettled": self.unsettled() if status == "found" else 0,
            "capacity_range": self.capacity_range() if status == "found" else None,
            "measurement_s": (sum(p.result.wall_s for p in self.probes) / len(self.probes) if self.probes else None),
            "note": self.note,
            "binding_level": level,
            "binding": {**b.to_json(), "advice": b.advice(engine)},
            "prompt_set": {
                "name": self.prompt_set.name,
                "repeats": self.prompt_set.repeats,
                "asked_reuse": self.prompt_set.asked_reuse,
            },
            "knob": knob.to_json() if knob else None,
            "search": {
                "min_load": self.min_load,
                "start_load": self.start_load,
                "max_load": self.max_load,
                "repeats": self.repeats,
                "precision": self.precision,
                "max_probes": self.max_probes,
                "duration_s": self.duration_s,
                "requests": self.requests,
            },
            "levels": [self._level_json(level) for level in self.levels()],
            "probes": [
                {
                    "phase": p.phase,
                    "level": p.level,
                    "started_at": p.started_at,
                    "ended_at": p.ended_at,
                    "result": asdict(p.result),
                    "binding": p.binding.resource,
                    "fault": p.binding.evidence if p.fault else None,
                    "client": p.binding.evidence if p.client else None,  # the load was not offered
                    "trusted": p.phase in used,
                    "noisy": list(p.noisy),
                    "reuse": asdict(p.reuse) if p.reuse else None,
                    "pace_s": self._pace(p),
                }
                for p in self.probes
            ],
        }

    def _level_json(self, level: float) -> dict[str, Any]:
        v = self.verdict(level)
        probes = self.trusted(level)
        reuse = self.reuse(level)
        return {
            "reuse": {**asdict(reuse), "share": reuse.share},
            "reuse_unasked": prefix_reuse.unasked(reuse, self.prompt_set.asked_reuse),
            "level": level,
            "measurements": len(probes),
            "phases": [p.phase for p in probes],
            "meets": v.meets,
            "each_meets": [p.result.meets for p in probes],
            "result": asdict(v),
        }

    def write(self, folder: RunFolder) -> None:
        """knee.json after every measurement: an interrupted search keeps what it had found."""
        write_file(folder.path / KNEE, json.dumps(self.summary(), indent=2) + "\n")  # never through a link

    def lines(self) -> list[str]:
        """The search as the terminal shows it: one row per level, then the knee and the binding resource."""
        return summary_lines(self.summary(), self.spec.describe())


def _samples_of(samples: list[SampleRecord], phase: str, kind: str, instance: str) -> list[SampleRecord]:
    """The phase's samples of this engine: by instance name, else the only instance of its kind the exporter saw."""
    mine = [s for s in samples if s.phase == phase]
    named = [s for s in mine if s.instance == instance]
    if named:
        return named
    of_kind = {s.instance for s in mine if s.engine == kind}
    return [s for s in mine if s.engine == kind] if len(of_kind) == 1 else []


def _round(value: float) -> float:
    return float(f"{value:.4g}")


def summary_lines(s: dict[str, Any], slo_words: str) -> list[str]:
    """A search's knee.json as the terminal shows it: one row per level, then the knee and the binding resource."""
    unit = s["unit"]
    out = [
        f"knee over {s['over']} for {s['instance']}, {slo_words}:",
        f"  {'load':>8} {'runs':>4} {'meets':>5} {'attain':>7} {'good/s':>7} {'good tok/s':>10} "
        f"{'cached':>7}  failed most",
    ]
    for row in s["levels"]:
        r = row["result"]
        flaky = " (repeats disagree)" if len(set(row["each_meets"])) > 1 else ""
        cached = numbers.percent(row["reuse"]["share"], 0, "-") + ("!" if row["reuse_unasked"] else "")
        out.append(
            f"  {row['level']:>8g} {row['measurements']:>4} {'yes' if row['meets'] else 'no':>5} "
            f"{numbers.percent(r['attainment'], 0, '-'):>7} {numbers.fixed(r['goodput_rps'], 2, '-'):>7} {numbers.fixed(r['good_tokens_per_s'], 2, '-'):>10} "
            f"{cached:>7}  {r['failed_most'] or '-'}{flaky}"
        )
    ps = s["prompt_set"]
    if any(row["reuse_unasked"] for row in s["levels"]):
        out.append(
            f"note: '!' cached: the engine took more of the prompts from its prefix cache than {ps['name']} asks "
            f"for: those levels measured the cache (--prompts synthetic:TOKENS sends a fresh prompt per request)"
        )
    elif ps["repeats"] and not ps["asked_reuse"]:
        out.append(
            f"note: {ps['name']} is a fixed set, sent again at every level: a prefix-caching engine may serve "
            f"repeats from its cache (--prompts synthetic:TOKENS sends a fresh prompt per request)"
        )
    if s["status"] == "found" and s.get("unsettled"):
        out.append(
            f"knee: {knee_answer.span(s)}; failed at {words.load(s['first_failing'], unit)} "
            f"({knee_answer.unsettled_words(s)})"
        )
    elif s["status"] == "found":
        out.append(f"knee: {words.load(s['knee'], unit)}; fails at {words.load(s['first_failing'], unit)}")
    elif s["status"] == "fails at the lowest load":
        out.append(f"knee: none - the SLOs fail even at {s['first_failing']:g} {unit} (--min-load)")
    elif s["status"] == "meets the SLOs up to the highest load":
        out.append(f"knee: at least {s['knee']:g} {unit} - the SLOs hold up to --max-load {s['search']['max_load']:g}")
    b = s["binding"]
    if s["status"] in binding.STOPPED.values():
        out.append(f"knee: none - {s['note'] or s['status']}")
    elif s["first_failing"] is not None:
        out.append(f"binding at {s['binding_level']:g} {unit}: {b['advice']} ({b['evidence']})")
    elif s["binding_level"] is not None:  # nothing failed: what the server did at the top, not what ran out
        out.append(f"at {s['binding_level']:g} {unit}, the highest load tried: {b['evidence']}")
    out += hostnoise.busy_notes(s["probes"])
    if s["non_monotonic"]:
        out.append("note: a load above a failing one met the SLOs (feasibility not monotone: a noisy machine?)")
    if s["note"] and s["status"] not in binding.STOPPED.values():
        out.append(f"note: {s['note']}")
    if s.get("unsettled"):
        out.append(f"note: {knee_answer.unsettled_words(s)} (--knee-probes)")
    return out
