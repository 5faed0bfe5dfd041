"""`python -m servescope.report plan`: how many replicas a traffic needs, from one replica's knee, and what a good token costs."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from servescope import engines
from servescope.contracts import knee_file
from servescope.contracts import routing as routing_policies
from servescope.contracts.runfolder import KNEE, KNEE_CONCURRENCY, RequestRecord, new_run_id
from servescope.contracts.settings import PlanSettings, ReportSettings, SloKnobs
from servescope.engines.base import BATCH_SLOTS
from servescope.judgements import pace, slo, stats
from servescope.report import energy, load, replicas, speed, traffic, workloads
from servescope.report.replicas import Level, Profile
from servescope.text import numbers

METHOD = (
    "predicted, not measured: a discrete-event model of N replicas behind a router (servescope/report/replicas.py), each "
    "request drawing its TTFT and time per token from what one replica's knee measured at the load it meets; "
    "no cache shared across replicas, the traffic's prompts taken to be like the knee's"
)


class PlanError(ValueError):
    """Inputs a plan cannot be made from: one line."""


# The work a plan may take, checked before any: a fleet's traffic (the loader's own maximum, 2,000,000 arrivals) is
# planned in under a minute on 2 cores; more windows, repetitions or replicas than these are refused in one line.
MAX_ARRIVALS = traffic.MAX_ARRIVALS
MAX_WINDOWS = 100_000  # the SLO windows one traffic is cut into (PLAN_WINDOW_S)
MAX_REPEATS = 100  # PLAN_REPEATS
MAX_REPLICAS = 10_000  # PLAN_MAX_REPLICAS: the search doubles up to it, then halves the gap (log2 of it counts tried)
# Simulated requests a replica count: repetitions pool the model's random draws, and a traffic this large is its own
# repetition (PLAN_REPEATS is cut to fit, at least one).
SIMULATED_PER_COUNT = 2_000_000
MAX_PER_HOST = 64  # --per-host: replicas a machine (every event on one touches them all)
ITL_SHAPE_POINTS = 4096  # a level's measured gap shape, kept as this many evenly spaced order statistics at most


@dataclass
class Prediction:
    """The replica model's forecast for a traffic on N replicas: attainment, windows met, in-flight load, latency."""

    replicas: int
    attainment: float | None  # good / requests over the whole traffic, repetitions pooled
    meets: bool  # every window meets the SLOs
    window_meets: list[bool | None]  # None: no request arrived in that window
    good_tokens: float  # per repetition
    mean_in_flight: float  # requests held per replica over the traffic's span (Little's law: sum of E2E / span)
    peak_in_flight: float  # the same in the busiest window
    beyond: int  # requests that met a replica above the highest measured load (counted as failed)
    # TTFT and E2E percentiles (LATENCY_PERCENTILES) of the successful requests, repetitions pooled: {"ttft_s":
    # {"p50": s, ...}, "e2e_s": {...}}; empty where none succeeded
    latency: dict[str, dict[str, float]] = field(default_factory=dict)
    # each repetition's good / requests: how far one run of this traffic can land from another at the same speed
    repetitions: tuple[float, ...] = ()


@dataclass
class PlanRow:
    """One row of the plan: the replicas one engine setting needs for the traffic, its attainment band and its cost."""

    label: str
    engine: str
    knee: float | None
    replicas: int | None  # the fewest that meet the SLOs in every window; None: more than the search went
    replicas_p95_time: int | None  # the replicas 95% of the windows need (what an autoscaler could follow)
    attainment: float | None
    attainment_one_fewer: float | None
    # At that count over the speed spread (servescope/report/speed.py): [slow edge, fast edge]; None: no spread
    attainment_band: list[float | None] | None
    utilisation: float | None  # mean in flight per replica / the knee's load
    headroom: float | None  # 1 - the busiest window's in flight per replica / the knee's load
    price_per_hour: float | None
    cost_per_million_good_tokens: float | None
    beyond: int
    source: str
    joules_per_good_token: float | None = None  # measured at the knee's load, one replica
    energy_reason: str = ""
    notes: list[str] = field(default_factory=list)
    replicas_at_knee_speed: int | None = None  # the fewest meeting the SLOs at the knee's own speed
    speed: dict[str, Any] = field(default_factory=dict)  # the spread the band is over (speed.Spread.to_json)
    # Predicted TTFT / E2E percentiles at that count: "knee" (its speed), "slow" and "fast" (the band's edges)
    latency: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)


# ---------------------------------------------------------------- the knee's replica


def profile_of(path: Path, slots: int | None = None) -> Profile:
    """One replica as its knee run folder measured it: the trusted measurements of each level, pooled; its batch
    slots `slots`, else the setting the run recorded, else not known."""
    path = Path(path)
    if slots is not None and (isinstance(slots, bool) or slots < 1):
        raise PlanError(f"--slots {slots}: a replica needs at least 1 batch slot")
    try:
        summary = knee_file.read(path)
    except FileNotFoundError:
        raise PlanError(
            f"{path}: no {KNEE} (a `python -m loadgen knee` run folder is what a plan starts from)"
        ) from None
    except knee_file.KneeFileError as exc:
        raise PlanError(str(exc)) from None
    recorded = _recorded_spec(summary)
    try:
        run = load.load(path)
    except load.RunError as exc:
        raise PlanError(str(exc)) from None
    try:
        instance = str(summary.get("instance") or "")
        closed_loop = summary.get("over") == KNEE_CONCURRENCY
        by_level: dict[float, list[RequestRecord]] = {}
        walls: dict[float, float] = {}
        energy_by_level: dict[float, list[energy.Energy]] = {}
        measured: dict[float, list[tuple[str, list[RequestRecord], dict | None]]] = {}
        phases = {p.phase: p for p in run.phases_of(instance)}
        for probe in summary["probes"]:
            if probe.get("trusted") and probe["phase"] in phases:
                ph = phases[probe["phase"]]
                records = run.requests_of(instance, ph.phase, gaps=True)
                measured.setdefault(float(probe["level"]), []).append((ph.phase, records, ph.noise))
        outvoted = []
        for level, found in measured.items():
            paces = [pace.of_records(records) for _, records, _ in found]
            out = pace.outvoted(paces)
            for i, (phase, records, _) in enumerate(found):
                if i in out:  # a transient the level's other measurements outvote: in the spread, not the replica
                    others = ", ".join(numbers.milliseconds(p, missing="-") for j, p in enumerate(paces) if j != i)
                    outvoted.append(
                        f"{phase} ({numbers.milliseconds(paces[i])} ms a token; the level's others {others})"
                    )
                    continue
                ph = phases[phase]
                by_level.setdefault(level, []).extend(records)
                walls[level] = walls.get(level, 0.0) + max(ph.ended_at - ph.started_at, 1e-9)
                energy_by_level.setdefault(level, []).append(energy.of_record(ph))
        levels = []
        for level, records in sorted(by_level.items()):
            busy = sum(r.e2e_s or 0.0 for r in records)
            in_flight = level if closed_loop else busy / walls[level]
            if in_flight > 0:  # an open-loop level whose requests held no time: no load to model
                levels.append(_level(in_flight, records))
        levels = _with_gap_shapes(sorted(levels, key=lambda lv: lv.concurrency))
        ok = [r for recs in by_level.values() for r in recs if r.ok]
        out_tokens = int(stats.median([r.output_tokens for r in ok if r.output_tokens]) or 0) if ok else 0
        prompt = [r.prompt_tokens for r in ok if r.prompt_tokens]
        info = run.engines.get(instance)
        knee_level = summary.get("knee") if summary.get("knee") in by_level else None
        joules, energy_reason = _energy_at(energy_by_level.get(knee_level), by_level.get(knee_level), recorded)
        spread = speed.of([m for level, found in sorted(measured.items()) for m in speed.measurements(level, found)])
    finally:
        run.close()
    if not levels:
        raise PlanError(f"{path}: {KNEE} has no trusted measurement to model a replica with")
    if not any(len(lv.ttft_s) for lv in levels):
        raise PlanError(f"{path}: every request the knee trusted failed: no latency to model a replica with")
    engine = str(summary.get("engine") or "")
    adapter = engines.ENGINES.get(engine)
    label = adapter.title if adapter else engine or instance
    label += f" ({instance})" if instance and instance != engine else ""
    lever = adapter.lever(BATCH_SLOTS) if adapter else None
    # The setting that sizes a replica's batch, where the run recorded it (this checkout's knobs say nothing of it)
    setting = None
    for name in lever.knob.recorded_as if lever and info else ():
        value, where = info.flag_source(name)
        if where == "run" and value not in (None, "") and not isinstance(value, bool):  # `--slots` alone: a switch
            setting = value
            break
    recorded = setting is not None
    label += f" {lever.flag}={setting}" if recorded else ""
    if slots is None and recorded:
        try:
            slots = int(setting)
        except (TypeError, ValueError):
            slots = None
        if slots is not None and slots < 1:  # a setting no engine runs with: not a batch size to model
            slots = None
    knee = summary.get("knee")
    try:
        return Profile(
            label=label,
            engine=engine,
            levels=tuple(levels),
            knee=float(knee) if isinstance(knee, (int, float)) and closed_loop else None,
            slots=slots,
            output_tokens=max(out_tokens, 1),
            prompt_tokens=int(stats.median(prompt)) if prompt else None,
            joules_per_good_token=joules,
            energy_reason=energy_reason,
            speed=spread,
            outvoted=tuple(outvoted),
        )
    except ValueError as exc:
        raise PlanError(f"{path}: {exc}") from None


def _recorded_spec(summary: dict) -> slo.SloSpec | None:
    """The SLOs a knee run recorded in its knee.json, read with it; None when they cannot be read."""
    try:
        return slo.resolve(summary.get("spec"), summary.get("objective"))
    except slo.SloError:
        return None


def _energy_at(
    measured: list[energy.Energy] | None, records: list[RequestRecord] | None, spec: slo.SloSpec | None
) -> tuple[float | None, str]:
    """Joules per good output token the knee's own load measured (every measurement of it read, or none counts),
    judged by the knee's own SLOs (`spec`; None: unreadable)."""
    if not measured or not records:
        return None, "not measured: no trusted measurement at the knee's load"
    missing = next((e for e in measured if not e.measured), None)
    if missing is not None:
        return None, missing.text()
    if spec is None:
        return None, "not measured: the knee's SLOs are unreadable"
    good = sum(r.output_tokens or 0 for r in records if spec.good(r))
    return (sum(e.joules for e in measured) / good, "") if good else (None, "not measured: no good token at the knee")


def _level(concurrency: float, records: list[RequestRecord]) -> Level:
    ok = [r for r in records if r.ok and r.ttft_s is not None]
    # TTFT as the SLO judges it: from the schedule's instant where an open-loop knee kept one
    ttft = np.sort(np.array([r.ttft_s + slo.schedule_lag(r) for r in ok], np.float64))
    tpot = np.sort(np.array([t for t in (slo.tpot(r) for r in ok) if t is not None], np.float64))
    failed = 1 - len(ok) / len(records) if records else 1.0
    prefill = [v for v in map(workloads.engine_prefill_ms, ok) if v is not None]
    # The gaps' shape: each gap over its own request's time per token (a stall shows as a ratio well above 1)
    ratios = [np.asarray(r.itl_s, np.float64) / t for r in ok if r.itl_s and (t := slo.tpot(r)) and t > 0]
    shape = np.sort(np.concatenate(ratios)) if ratios else np.zeros(0)
    if len(shape) > ITL_SHAPE_POINTS:
        shape = shape[np.linspace(0, len(shape) - 1, ITL_SHAPE_POINTS).round().astype(np.int64)]
    return Level(concurrency, ttft, tpot, failed, len(records), pace.pace(prefill), shape)


def _with_gap_shapes(levels: list[Level]) -> list[Level]:
    """A level that measured no gap (its requests failed, or answered one token) takes the nearest level's shape."""
    measured = [i for i, lv in enumerate(levels) if len(lv.itl_shape)]
    if not measured:
        return levels
    return [
        lv if len(lv.itl_shape) else replace(lv, itl_shape=levels[min(measured, key=lambda j: abs(j - i))].itl_shape)
        for i, lv in enumerate(levels)
    ]


# ---------------------------------------------------------------- the model, judged as the knee judged


def check_work(
    profile: Profile,
    load: traffic.Traffic,
    spec: slo.SloSpec,
    repeats: int,
    window_s: float,
    sharing: replicas.Sharing | None = None,
) -> None:
    """PlanError (one line) on a plan too large to make or one the knee cannot answer, before any simulation."""
    n = len(load.arrivals)
    if n == 0:
        raise PlanError(f"{load.name}: no request arrives in it: nothing to plan for")
    if n > MAX_ARRIVALS:
        raise PlanError(f"{load.name}: {n:,} requests, more than {MAX_ARRIVALS:,}: plan a part of it")
    if not (math.isfinite(load.duration_s) and load.duration_s > 0):
        raise PlanError(f"{load.name}: a span of {load.duration_s:g} s: expected seconds above 0")
    if not (isinstance(repeats, int) and 1 <= repeats <= MAX_REPEATS):
        raise PlanError(f"PLAN_REPEATS={repeats}: expected 1 to {MAX_REPEATS}")
    count = load.duration_s / window_s if window_s > 0 else math.inf
    if not count <= MAX_WINDOWS:
        raise PlanError(
            f"{load.duration_s:g} s of traffic in {window_s:g}-s windows (PLAN_WINDOW_S) is more than {MAX_WINDOWS:,} "
            f"windows: windows of at least {load.duration_s / MAX_WINDOWS:.3g} s"
        )
    tokens = _schedule(load).output_tokens
    asks_more = bool(np.any(tokens > 1)) or (bool(np.any(tokens == 0)) and profile.output_tokens > 1)
    for p in (profile, *((sharing.busy,) if sharing else ())):
        if asks_more and not p.measured_tpot:
            raise PlanError(
                f"{p.label}: its knee measured no time per output token (answers of one token): it cannot model a "
                "traffic asking for more; measure the knee with longer answers (--max-tokens)"
            )
    itl = [t for t in spec.terms if t.metric == "itl"]
    if itl:
        for p in (profile, *((sharing.busy,) if sharing else ())):
            if not p.measured_itl:
                raise PlanError(
                    f"{p.label}: the SLO's {itl[0].name} cannot be modelled: its knee recorded no inter-token gaps "
                    "(answers of one token, or not streamed); plan without that term (--slo)"
                )
        if not asks_more and any(t.percentile is not None for t in itl):
            raise PlanError(
                f"{load.name}: every request asks for one token: no inter-token gap for the SLO's {itl[0].name} to "
                "judge; plan without that term (--slo)"
            )


def repetitions(load: traffic.Traffic, repeats: int) -> int:
    """The simulations pooled a replica count: `repeats`, fewer where the traffic alone is SIMULATED_PER_COUNT."""
    return max(1, min(repeats, SIMULATED_PER_COUNT // max(1, len(load.arrivals))))


_schedules: list[tuple[traffic.Traffic, replicas.Schedule]] = []


def _schedule(load: traffic.Traffic) -> replicas.Schedule:
    """The traffic's arrivals as the event loop's columns, made once per traffic (a search simulates it many times)."""
    for known, schedule in _schedules:
        if known is load:
            return schedule
    schedule = replicas.Schedule.of(load.arrivals)
    _schedules[:] = [(load, schedule)]
    return schedule


def predict(
    profile: Profile,
    load: traffic.Traffic,
    n: int,
    spec: slo.SloSpec,
    policy: str,
    repeats: int,
    window_s: float,
    sharing: replicas.Sharing | None = None,
) -> Prediction:
    """`repeats` simulations of `load` over `n` replicas, judged window by window by the knee's rule."""
    check_work(profile, load, spec, repeats, window_s, sharing)
    schedule = _schedule(load)
    windows = max(1, math.ceil(load.duration_s / window_s))
    window = np.minimum((schedule.at / window_s).astype(np.int64), windows - 1)
    tally = _Tally(spec, windows)
    shapes = replicas.shapes(profile, sharing)
    ttft: list[np.ndarray] = []
    e2e: list[np.ndarray] = []
    each: list[float] = []
    for seed in range(repeats):
        out = replicas.run(schedule, profile, n, policy, seed, sharing)
        good_before, requests_before = float(tally.good.sum()), float(tally.requests.sum())
        tally.add(out, window, shapes)
        added = float(tally.requests.sum()) - requests_before
        if added:
            each.append((float(tally.good.sum()) - good_before) / added)
        ttft.append(out.ttft_s[out.ok])
        e2e.append(out.e2e_s[out.ok])
        del out  # a fleet's outcomes: one repetition's at a time
    meets: list[bool | None] = []
    peak = 0.0
    for w in range(windows):
        requests = int(tally.requests[w])
        if not requests:
            meets.append(None)
            continue
        meets.append(tally.holds(w))
        span = min(window_s, load.duration_s - w * window_s)  # the last window ends with the traffic
        # Little's law: requests held = arrival rate x time in the system (E2E), per replica
        peak = max(peak, float(tally.e2e[w]) / (span * repeats * n))
    total = int(tally.requests.sum())
    return Prediction(
        replicas=n,
        attainment=int(tally.good.sum()) / total if total else None,
        meets=all(m is not False for m in meets),
        window_meets=meets,
        good_tokens=float(tally.good_tokens.sum()) / repeats,
        mean_in_flight=float(tally.e2e.sum()) / (repeats * n * load.duration_s),
        peak_in_flight=peak,
        beyond=int(tally.beyond.sum()) // repeats,
        latency={"ttft_s": percentiles(np.concatenate(ttft)), "e2e_s": percentiles(np.concatenate(e2e))},
        repetitions=tuple(each),
    )


def attainment_band(knee: Prediction, slow: Prediction, fast: Prediction) -> list[float | None]:
    """The attainment a run of this traffic should measure, 10th to 90th percentile: the knee speed's prediction,
    widened below by the slow edge's fall and above by the fast edge's rise, each combined in quadrature with how far
    one repetition lands from another at that edge (Student's t at 90% over the repetitions' spread, for one more run
    about their mean: a short traffic's attainment moves with which requests meet a tail or a busy replica, a long
    one's hardly). None: not predicted."""
    if knee.attainment is None or slow.attainment is None or fast.attainment is None:
        return [slow.attainment, fast.attainment]

    def scatter(p: Prediction) -> float:
        k = len(p.repetitions)
        return speed.next_run_half_width(float(np.std(p.repetitions, ddof=1)), k - 1, k) if k >= 2 else 0.0

    below = math.hypot(max(knee.attainment - slow.attainment, 0.0), scatter(slow))
    above = math.hypot(max(fast.attainment - knee.attainment, 0.0), scatter(fast))
    return [max(0.0, knee.attainment - below), min(1.0, knee.attainment + above)]


LATENCY_PERCENTILES = (50, 90, 99)


def percentiles(values: np.ndarray) -> dict[str, float]:
    """{"p50": ..., "p90": ..., "p99": ...} of `values` by numpy's default rule (the report's, servescope/judgements/percentile.py);
    empty for none."""
    if not len(values):
        return {}
    found = np.percentile(values, LATENCY_PERCENTILES)
    return {f"p{q}": float(v) for q, v in zip(LATENCY_PERCENTILES, found, strict=True)}


class _Tally:
    """Per window, summed over the repetitions: the counts slo.holds judges by (the knee's rule, servescope/judgements/slo.py),
    taken from the outcomes' columns with the same per-request rule as slo.Term.request_meets, and the model's ITL
    gaps (servescope/report/replicas.py) counted without being made."""

    def __init__(self, spec: slo.SloSpec, windows: int) -> None:
        self.spec = spec
        self.windows = windows
        zeros = lambda: np.zeros(windows)  # noqa: E731
        self.requests, self.meeting, self.good, self.good_tokens = zeros(), zeros(), zeros(), zeros()
        self.e2e, self.beyond = zeros(), zeros()
        self.met = [zeros() for _ in spec.terms]  # per term: requests (ITL: gaps) that met it
        self.units = [zeros() for _ in spec.terms]  # per term: what its share is of

    def add(self, out: replicas.Outcomes, window: np.ndarray, shapes: list[np.ndarray]) -> None:
        def per_window(weights: np.ndarray | None = None) -> np.ndarray:
            return np.bincount(window, weights, minlength=self.windows)

        ok = out.ok
        gaps = _Gaps(out, shapes)
        meets = [gaps.request_meets(t) & ok for t in self.spec.terms]
        per_request = [m for t, m in zip(self.spec.terms, meets, strict=True) if t.percentile is None]
        meeting = np.logical_and.reduce(per_request) if per_request else np.zeros(len(out), bool)
        good = np.logical_and.reduce(meets) if meets else ok
        failed = ~ok
        self.requests += per_window()
        self.meeting += per_window(meeting.astype(np.float64))
        self.good += per_window(good.astype(np.float64))
        self.good_tokens += per_window(np.where(good, out.output_tokens, 0).astype(np.float64))
        self.e2e += per_window(np.where(ok, out.e2e_s, 0.0))  # a failed request's E2E is not known: 0, as before
        self.beyond += per_window((out.error == replicas.replica_events.ERR_BEYOND).astype(np.float64))
        for i, term in enumerate(self.spec.terms):
            if term.percentile is None:
                continue
            if term.metric == "itl":  # pooled gaps; a failed request counts as one missed gap
                self.met[i] += per_window(gaps.met(term.limit_s))
                self.units[i] += per_window(np.where(ok, gaps.count, 0) + failed)
            else:
                self.met[i] += per_window(meets[i].astype(np.float64))
                self.units[i] += per_window()

    def holds(self, w: int) -> bool:
        shares = [int(m[w]) / int(u[w]) if u[w] else None for m, u in zip(self.met, self.units, strict=True)]
        return slo.holds(self.spec, int(self.requests[w]), int(self.meeting[w]), shares)


class _Gaps:
    """The model's inter-token gaps of each outcome (servescope/report/replicas.py): its tokens - 1 gaps are its time per token
    times the evenly spaced quantiles of its level's shape, gap j = tpot * shape[((2j + 1) * len(shape)) // (2m)]:
    ascending in j, so a count of gaps under a limit is a bisection, and a request's percentile is two of them."""

    def __init__(self, out: replicas.Outcomes, shapes: list[np.ndarray]) -> None:
        self.out = out
        tokens = out.output_tokens
        many = out.ok & (tokens > 1)
        with np.errstate(invalid="ignore", divide="ignore"):
            self.tpot = np.where(many, (out.e2e_s - out.ttft_s) / np.maximum(tokens - 1, 1), np.nan)
        size = np.array([len(s) for s in shapes] + [0], np.int64)
        level = np.where(out.level >= 0, out.level, len(shapes))
        self.shape_len = size[level]
        self.offsets = np.concatenate([[0], np.cumsum(size[:-1])]).astype(np.int64)[np.minimum(level, len(shapes) - 1)]
        self.values = np.concatenate([*shapes, np.zeros(1)]) if shapes else np.zeros(1)
        # Gaps a request has: tokens - 1 where it succeeded and its level has a shape (else none, as a record without)
        self.count = np.where(many & (self.shape_len > 0), tokens - 1, 0)

    def gap(self, j: np.ndarray, rows: np.ndarray) -> np.ndarray:
        m, ns = self.count[rows], self.shape_len[rows]
        return self.tpot[rows] * self.values[self.offsets[rows] + ((2 * j + 1) * ns) // (2 * m)]

    def met(self, limit: float) -> np.ndarray:
        """Each request's gaps at or under `limit`."""
        rows = np.flatnonzero(self.count > 0)
        lo, hi = np.zeros(len(rows), np.int64), self.count[rows].copy()
        while True:
            open_ = lo < hi
            if not open_.any():
                break
            mid = (lo + hi) // 2
            under = np.zeros(len(rows), bool)
            sel = np.flatnonzero(open_)
            under[sel] = self.gap(mid[sel], rows[sel]) <= limit
            lo = np.where(open_ & under, mid + 1, lo)
            hi = np.where(open_ & ~under, mid, hi)
        counts = np.zeros(len(self.count))
        counts[rows] = lo
        return counts

    def value(self, term: slo.Term) -> np.ndarray:
        """Each request's value for an ITL term (its longest gap, or its own percentile); NaN where it has no gap."""
        rows = np.flatnonzero(self.count > 0)
        m = self.count[rows]
        out = np.full(len(self.count), np.nan)
        if term.percentile is None:
            out[rows] = self.gap(m - 1, rows)
            return out
        # numpy_percentile_of (servescope/judgements/percentile.py), element by element
        v = (m - 1) * (term.percentile / 100)
        lo = np.floor(v).astype(np.int64)
        top = v >= m - 1
        lo_c = np.where(top, m - 1, lo)
        hi_c = np.where(top, m - 1, lo + 1)
        a, b, g = self.gap(lo_c, rows), self.gap(hi_c, rows), v - lo
        value = np.where(g >= 0.5, b - (b - a) * (1 - g), a + (b - a) * g)
        out[rows] = np.where(top, self.gap(m - 1, rows), value)
        return out

    def request_meets(self, term: slo.Term) -> np.ndarray:
        """slo.Term.request_meets over the columns (a successful request's; a failed one is judged apart)."""
        out = self.out
        if term.metric == "ttft":
            return out.ttft_s <= term.limit_s
        if term.metric == "e2e":
            return out.e2e_s <= term.limit_s
        if term.metric == "tpot":
            return ~(self.tpot > term.limit_s)  # one token: no time per token, nothing to miss
        return ~(self.value(term) > term.limit_s)  # no gap: nothing to miss


def records(profile: Profile, out: replicas.Outcomes, shapes: list[np.ndarray]) -> list[RequestRecord]:
    """The outcomes as the records slo.evaluate judges, each with the model's gaps made (for a handful of outcomes:
    the plan itself counts them without making them)."""
    gaps = _Gaps(out, shapes)
    made = []
    for i in range(len(out)):
        ok = bool(out.ok[i])
        m = int(gaps.count[i])
        itl = [float(gaps.gap(np.array([j]), np.array([i]))[0]) for j in range(m)]
        made.append(
            RequestRecord(
                engine=profile.engine,
                instance=f"replica-{int(out.replica[i])}",
                scenario="plan",
                phase="plan",
                api="openai",
                model="",
                prompt_set="",
                prompt_set_sha256="",
                prompt_id="",
                max_tokens=int(out.output_tokens[i]),
                started_at=float(out.at[i]),
                ok=ok,
                status=200 if ok else 0,
                error=replicas.ERRORS.get(int(out.error[i])),
                ttft_s=float(out.ttft_s[i]) if ok else None,
                e2e_s=float(out.e2e_s[i]) if ok else None,
                itl_s=itl,
                output_tokens=int(out.output_tokens[i]) if ok else None,
            )
        )
    return made


def plan(
    profile: Profile,
    load: traffic.Traffic,
    spec: slo.SloSpec,
    policy: str,
    repeats: int,
    window_s: float,
    max_replicas: int,
    price: float | None,
    sharing: replicas.Sharing | None = None,
    spread: speed.Spread | None = None,
) -> tuple[PlanRow, list[Prediction]]:
    """The fewest replicas that meet the SLOs in every window at the slow edge of `spread` (default: the speed spread
    the knee measured, profile.speed), with the attainment at that count as a band from the slow edge to the fast one.

    The search assumes more replicas never do worse, and a slower engine never better: it doubles from one at the
    knee's speed until a count meets, then halves the gap; at the slow edge it starts from that count (a dozen
    simulations for a fleet, not hundreds; the spread costs a few more, run only near the answer). Returns the row and
    the knee-speed predictions made up to the knee-speed count, by count."""
    check_work(profile, load, spec, repeats, window_s, sharing)
    if not (isinstance(max_replicas, int) and 1 <= max_replicas <= MAX_REPLICAS):
        raise PlanError(f"PLAN_MAX_REPLICAS={max_replicas}: expected 1 to {MAX_REPLICAS}")
    spread = spread or profile.speed or speed.none("not read from a knee")
    repeats = repetitions(load, repeats)
    made: dict[int, Prediction] = {}
    edges: dict[tuple[speed.Edge, int], Prediction] = {}

    def at(n: int) -> Prediction:
        if n not in made:
            made[n] = predict(profile, load, n, spec, policy, repeats, window_s, sharing)
        return made[n]

    def at_edge(edge: speed.Edge, n: int) -> Prediction:
        if edge == speed.KNEE_SPEED:
            return at(n)
        if (edge, n) not in edges:
            own, busy = at_speed(profile, sharing, spread, edge)
            edges[edge, n] = predict(own, load, n, spec, policy, repeats, window_s, busy)
        return edges[edge, n]

    at_knee = _fewest(lambda n: at(n).meets, 0, max_replicas)
    tried = [made[k] for k in sorted(made) if at_knee is None or k <= at_knee]
    # Only a count that meets at the knee's speed can meet slower: the slow edge's search starts there.
    count = at_knee if at_knee is None else _fewest(lambda n: at_edge(spread.slow, n).meets, at_knee - 1, max_replicas)
    notes: list[str] = []
    notes.append(
        f"{profile.slots} batch slots a replica, the rest waiting in its queue"
        if profile.slots
        else "batch slots not known (not recorded; --slots): the engine's queueing as the knee measured it"
    )
    if sharing:
        notes.append(
            f"{sharing.per_host} replicas a machine: a replica with a busy neighbour draws from the knee measured "
            "with its neighbours busy"
        )
    if profile.prompt_tokens:
        notes.append(f"knee measured {profile.prompt_tokens}-token prompts, {profile.output_tokens} tokens out")
    notes.append(spread.describe())
    if profile.outvoted:
        notes.append(
            f"left out of the modelled replica, in the spread only: {'; '.join(profile.outvoted)} (its pace disagreed "
            f"with its level's other measurements, which agreed: a transient, servescope/judgements/pace.py)"
        )
    shown = count or at_knee  # the count the row's figures are at: the recommended one, else the knee speed's
    last = at(max_replicas if shown is None else shown)
    row = PlanRow(
        label=profile.label,
        engine=profile.engine,
        knee=profile.knee,
        replicas=count,
        replicas_p95_time=None,
        attainment=last.attainment,
        attainment_one_fewer=None,
        attainment_band=None,
        utilisation=None,
        headroom=None,
        price_per_hour=price,
        cost_per_million_good_tokens=None,
        beyond=last.beyond,
        source="",
        joules_per_good_token=profile.joules_per_good_token,
        energy_reason=profile.energy_reason,
        notes=notes,
        replicas_at_knee_speed=at_knee,
        speed=spread.to_json(),
        latency={"knee": last.latency},
    )
    if at_knee is None:
        row.notes.append(f"more than {max_replicas} replicas (PLAN_MAX_REPLICAS): the search stopped there")
        return row, tried
    if not spread.point:
        slow, fast = at_edge(spread.slow, shown), at_edge(spread.fast, shown)
        row.attainment_band = attainment_band(at(shown), slow, fast)
        row.latency.update(slow=slow.latency, fast=fast.latency)
    if count is None:
        row.notes.append(
            f"{at_knee} replica(s) meet the SLOs if the engine keeps its knee speed; at the slow edge of the speed it "
            f"showed more than {max_replicas} (PLAN_MAX_REPLICAS) would be needed: the figures are at {at_knee}"
        )
    elif count > at_knee:
        row.notes.append(
            f"{at_knee} replica(s) meet the SLOs if the engine keeps its knee speed; {count} hold across the speed it "
            f"showed (at its slow edge {at_knee} reach {numbers.percent(at_edge(spread.slow, at_knee).attainment, 0, '-')})"
        )
    row.notes.append(_latency_note(shown, row.latency))
    found = at(shown)
    row.attainment_one_fewer = at(shown - 1).attainment if shown > 1 else None
    row.replicas_p95_time = _p95_time(found, made, at)
    if profile.knee:
        row.utilisation = found.mean_in_flight / profile.knee
        row.headroom = 1 - found.peak_in_flight / profile.knee
    if price is not None and found.good_tokens > 0:
        hours = load.duration_s / 3600
        row.cost_per_million_good_tokens = shown * price * hours / (found.good_tokens / 1e6)
    return row, tried


def _fewest(meets, missing: int, limit: int) -> int | None:
    """The fewest replicas above `missing` (a count known to miss; 0: none) that meet, up to `limit`, more never doing
    worse: the gap above `missing` doubles until a count meets, then halves. None: not even `limit` meets."""
    base, step, meeting = missing, 1, None
    while True:
        n = min(base + step, limit)
        if meets(n):
            meeting = n
            break
        missing = n
        if n >= limit:
            break
        step *= 2
    while meeting is not None and meeting - missing > 1:
        mid = (missing + meeting) // 2
        if meets(mid):
            meeting = mid
        else:
            missing = mid
    return meeting


def at_speed(
    profile: Profile, sharing: replicas.Sharing | None, spread: speed.Spread, edge: speed.Edge
) -> tuple[Profile, replicas.Sharing | None]:
    """The knee (and its busy twin) at one edge of the spread: every TTFT and time per token scaled by the edge's
    factors. A busy knee with a measured spread of its own goes to the same edge of its own."""
    own = profile.scaled(edge.ttft, edge.tpot)
    if sharing is None:
        return own, None
    busy = sharing.busy.speed
    if spread.source == speed.MEASURED and busy is not None and busy.source == speed.MEASURED:
        edge = busy.slow if edge == spread.slow else busy.fast
    return own, replicas.Sharing(sharing.per_host, sharing.busy.scaled(edge.ttft, edge.tpot))


def _latency_note(n: int, latency: dict[str, dict[str, dict[str, float]]]) -> str:
    """One line: the predicted TTFT and E2E percentiles at `n` replicas, at the knee's speed and across the band."""
    edged = "slow" in latency

    def cell(metric: str, q: str) -> str:
        value = latency["knee"].get(metric, {}).get(q)
        if value is None:
            return "-"
        if not edged:
            return f"{value:.3g}"
        slow, fast = latency["slow"].get(metric, {}).get(q), latency["fast"].get(metric, {}).get(q)
        return f"{value:.3g} ({numbers.significant(fast, 3, '-')}-{numbers.significant(slow, 3, '-')})"

    parts = [
        f"{name} " + ", ".join(f"{q} {cell(metric, q)}" for q in (f"p{p}" for p in LATENCY_PERCENTILES)) + " s"
        for name, metric in (("TTFT", "ttft_s"), ("E2E", "e2e_s"))
    ]
    band = " (fast-slow edge in brackets)" if edged else ""
    return f"predicted latency at {n} replica(s), the knee's speed{band}: {'; '.join(parts)}"


def _p95_time(found: Prediction, made: dict[int, Prediction], at) -> int | None:
    """The replicas 95% of the windows need on their own: the fewest at which that many windows meet the SLOs (a
    window that meets at a count meets with more, as the search assumes), found by halving the gap below `found`."""
    judged = sum(m is not None for m in found.window_meets)
    if not judged:
        return None
    need = min(judged, math.ceil(0.95 * judged))

    def enough(p: Prediction) -> bool:
        return sum(bool(m) for m in p.window_meets) >= need

    high = min(k for k, p in made.items() if k <= found.replicas and enough(p))
    low = max((k for k, p in made.items() if k < high and not enough(p)), default=0)
    while high - low > 1:
        mid = (low + high) // 2
        if enough(at(mid)):
            high = mid
        else:
            low = mid
    return high


# ---------------------------------------------------------------- command line


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m servescope.report plan", description=__doc__)
    p.add_argument("runs", nargs="+", metavar="KNEE_RUN", help="knee run folders (ID under --results, or a path)")
    p.add_argument("--results", type=Path, default=None, help="where run folders live (default: SERVESCOPE_RESULTS)")
    t = p.add_argument_group("traffic (one of; default: the trace PLAN_TRACE names, at PLAN_SPEED)")
    t.add_argument("--trace", metavar="NAME|FILE", help="a trace as `--prompts trace:` reads it (e.g. trace-small)")
    t.add_argument("--rate", type=float, metavar="REQ/S", help="constant arrivals")
    t.add_argument("--poisson", type=float, metavar="REQ/S", help="Poisson arrivals")
    t.add_argument("--prometheus-query", metavar="PROMQL", help="a real service's request rate (req/s) in Prometheus")
    p.add_argument(
        "--speed", type=float, default=None, help="--trace: its clock this many times faster (default PLAN_SPEED)"
    )
    p.add_argument("--duration", type=float, default=600.0, help="--rate / --poisson: seconds of traffic (600)")
    p.add_argument("--prometheus", metavar="URL", default=None, help="--prometheus-query: where (PROMETHEUS_PORT)")
    p.add_argument("--since", type=float, default=3600.0, help="--prometheus-query: seconds back from now (3600)")
    p.add_argument("--step", type=float, default=60.0, help="--prometheus-query: resolution in seconds (60)")
    p.add_argument(
        "--slots",
        type=int,
        metavar="N",
        help="each replica's batch slots (default: the engine setting the run recorded)",
    )
    p.add_argument("--slo", metavar="SPEC", help="SLOs (default: the knees' own, which must agree)")
    p.add_argument("--slo-attainment", metavar="SHARE", help="share of requests that must meet them")
    p.add_argument(
        "--per-host",
        type=int,
        default=1,
        metavar="M",
        help="replicas sharing one machine (default 1: a machine each); needs --busy-knee",
    )
    p.add_argument(
        "--busy-knee",
        action="append",
        default=[],
        metavar="KNEE_RUN",
        help="--per-host: a knee of one replica measured while its neighbours were kept busy, one per KNEE_RUN",
    )
    p.add_argument(
        "--routing", choices=routing_policies.POLICIES, default=None, help="the router's policy (PLAN_ROUTING)"
    )
    p.add_argument("--price", action="append", default=[], metavar="ENGINE=PER_HOUR", help="price of an instance-hour")
    p.add_argument("--out", type=Path, default=None, help="folder for plan.json and plan.md (default: RESULTS/plan-ID)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    report = ReportSettings.from_env()  # the plan command's entry: the knobs, read once
    knobs = report.plan
    try:
        results = args.results or load.results_dir()
        settings = settings_of(knobs, args.routing)
        profiles = [profile_of(load.resolve(r, results), args.slots) for r in args.runs]
        spec = _spec(args, [load.resolve(r, results) for r in args.runs], report.slo)
        sharings = _sharings(args, results)
        replicas.warm()
        offered = _traffic(args, knobs, report.prometheus_url)
        prices = _prices(args.price, knobs)
        for profile, sharing in zip(profiles, sharings, strict=True):  # every row's limits, before any row's work
            check_work(profile, offered, spec, settings["repeats"], settings["window_s"], sharing)
    except (PlanError, traffic.TrafficError, slo.SloError, load.RunError, ValueError) as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return 2
    repeats = repetitions(offered, settings["repeats"])
    print(
        f"plan: {offered.name}: {len(offered.arrivals)} requests over {offered.duration_s:.1f} s "
        f"(mean {offered.mean_rate:.3g} req/s); {spec.describe()}; routing {settings['routing']}, "
        f"{settings['window_s']:g}-s windows, {repeats} repetition(s)"
        + (
            f" (PLAN_REPEATS {settings['repeats']}: the traffic is its own repetition)"
            if repeats < settings["repeats"]
            else ""
        ),
        file=sys.stderr,
    )
    rows = []
    try:
        for path, profile, sharing in zip(args.runs, profiles, sharings, strict=True):
            row, _ = plan_with(settings, profile, offered, spec, prices.get(profile.engine), sharing)
            row.source = str(path)
            rows.append(row)
    except PlanError as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return 2
    text = render(rows, offered, spec, settings)
    sys.stdout.write(text)
    out = args.out or results / f"plan-{new_run_id()}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        doc = {
            "method": METHOD,
            "traffic": {"name": offered.name, "requests": len(offered.arrivals), "duration_s": offered.duration_s},
            "slo": {"spec": spec.text, "objective": spec.objective},
            "settings": settings,
            "rows": [asdict(r) for r in rows],
        }
        (out / "plan.json").write_text(json.dumps(doc, indent=2) + "\n")
        (out / "plan.md").write_text("# Plan\n\n```\n" + text + "```\n")
    except OSError as exc:
        print(f"plan: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"plan: wrote {out / 'plan.json'} and plan.md", file=sys.stderr)
    return 0


def plan_with(
    settings: dict[str, Any],
    profile: Profile,
    load: traffic.Traffic,
    spec: slo.SloSpec,
    price: float | None,
    sharing: replicas.Sharing | None = None,
) -> tuple[PlanRow, list[Prediction]]:
    """`plan` under the model's settings as settings_of gives them."""
    return plan(
        profile,
        load,
        spec,
        settings["routing"],
        settings["repeats"],
        settings["window_s"],
        settings["max_replicas"],
        price,
        sharing,
        spread_of(settings, profile),
    )


def spread_of(settings: dict[str, Any], profile: Profile) -> speed.Spread:
    """The speeds a row is predicted over: PLAN_SLOWER's where it is set, else the spread the knee measured."""
    if settings.get("slower") is not None:
        return speed.override(settings["slower"])
    return profile.speed or speed.none("not read from a knee")


def settings_of(knobs: PlanSettings, routing: str | None = None) -> dict[str, Any]:
    """The model's settings: the router's policy (given, else PLAN_ROUTING), windows, repetitions, search limit, from
    the plan's knobs (each checked here: PlanError, one line naming it)."""
    routing = routing or knobs.routing
    if routing not in routing_policies.POLICIES:
        raise PlanError(f"PLAN_ROUTING={routing!r}: expected {' or '.join(routing_policies.POLICIES)}")
    try:
        window_s = knobs.window_s
        repeats, max_replicas = knobs.repeats, knobs.max_replicas
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    if not 1 <= repeats <= MAX_REPEATS:
        raise PlanError(f"PLAN_REPEATS={repeats}: expected 1 to {MAX_REPEATS}")
    if not 1 <= max_replicas <= MAX_REPLICAS:
        raise PlanError(f"PLAN_MAX_REPLICAS={max_replicas}: expected 1 to {MAX_REPLICAS}")
    text = knobs.slower.strip()
    slower: float | None = None
    if text:  # empty: the spread each knee measured
        try:
            slower = float(text)
        except ValueError:
            slower = math.nan
        if not 0 <= slower < 10:
            raise PlanError(
                f"PLAN_SLOWER={text!r}: expected empty (the knee's measured speed spread) or a share from 0 (the "
                "knee's speed alone) to under 10, e.g. 0.05"
            )
    return {
        "routing": routing,
        "window_s": window_s,
        "repeats": repeats,
        "max_replicas": max_replicas,
        "slower": slower,
    }


def _sharings(args, results: Path) -> list[replicas.Sharing | None]:
    """One busy knee per knee run when replicas share machines (--per-host above 1), none otherwise."""
    if not 1 <= args.per_host <= MAX_PER_HOST:
        raise PlanError(f"--per-host {args.per_host}: expected 1 to {MAX_PER_HOST}")
    if args.per_host == 1:
        if args.busy_knee:
            raise PlanError("--busy-knee: only with --per-host above 1 (replicas sharing a machine)")
        return [None] * len(args.runs)
    if len(args.busy_knee) != len(args.runs):
        raise PlanError(
            f"--per-host {args.per_host}: give one --busy-knee per knee run ({len(args.runs)}), "
            f"got {len(args.busy_knee)}"
        )
    return [replicas.Sharing(args.per_host, profile_of(load.resolve(r, results), args.slots)) for r in args.busy_knee]


def _spec(args, paths: list[Path], knob: SloKnobs) -> slo.SloSpec:
    """The SLOs the plan is made for: --slo (and --slo-attainment), else the ones its knee runs recorded (else the SLO
    knobs', `knob`)."""
    if args.slo:
        return slo.resolve(args.slo, args.slo_attainment, knob)
    seen = set()
    for path in paths:
        summary = knee_file.read(path)  # read and checked by profile_of before
        seen.add((summary.get("spec"), summary.get("objective")))
    if len(seen) > 1:
        raise PlanError("the knees were measured under different SLOs: say which to plan for with --slo")
    text, objective = seen.pop()
    return slo.resolve(text, args.slo_attainment or objective, knob)


def _traffic(args, knobs: PlanSettings, prometheus_url: str) -> traffic.Traffic:
    """The traffic the command line says (`knobs`: PLAN_TRACE and PLAN_SPEED when it says none; `prometheus_url`:
    the stack's Prometheus when --prometheus-query names no --prometheus)."""
    given = [x for x in (args.trace, args.rate, args.poisson, args.prometheus_query) if x is not None]
    if len(given) > 1:
        raise PlanError("say the traffic once: one of --trace, --rate, --poisson, --prometheus-query")
    if not given:
        return default_traffic(knobs, args.speed)
    if args.trace is not None:
        return traffic.trace(args.trace, default_speed(knobs) if args.speed is None else args.speed)
    if args.rate is not None:
        return traffic.constant(args.rate, args.duration)
    if args.poisson is not None:
        return traffic.poisson(args.poisson, args.duration)
    return traffic.prometheus(args.prometheus or prometheus_url, args.prometheus_query, args.since, args.step)


def _prices(given: list[str], knobs: PlanSettings) -> dict[str, float]:
    """ENGINE=PRICE pairs: PLAN_PRICE_PER_HOUR's, then --price's over them."""
    pairs = [p for p in knobs.prices.split(",") if p.strip()] + given
    prices: dict[str, float] = {}
    for pair in pairs:
        engine, sep, value = pair.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if not sep or engine.strip() not in engines.ENGINES or not (price >= 0 and math.isfinite(price)):
            raise PlanError(
                f"price {pair!r}: expected ENGINE=PRICE_PER_HOUR, ENGINE one of {', '.join(engines.ENGINES)}"
            )
        prices[engine.strip()] = price
    return prices


COLUMNS = (
    "engine / setting",
    "knee",
    "replicas",
    "p95 time",
    "attain",
    "band",
    "at N-1",
    "util",
    "headroom",
    "$/M good tok",
    "J/good tok",
)
COLUMNS_HELP = (
    "replicas: the fewest meeting the SLOs in every window at the slow edge of the speed its knee showed (the band's; "
    "a note says when fewer meet only at the knee's own speed); p95 time: what 95% of the windows need at the knee's "
    "speed; attain: predicted SLO attainment at that count at the knee's speed; band: the same from the slow edge to "
    "the fast one of the engine's speed as its knee measured it move (the 10th-90th percentile of its repeated "
    "measurements, or PLAN_SLOWER; near saturation a few percent of speed is many points); at N-1: at one fewer, the "
    "knee's speed; util: mean requests held (running or queued) per replica over the knee's load; headroom: what the "
    "busiest window leaves of it; $/M good tok: replicas x price x hours over the good output tokens "
    "(PLAN_PRICE_PER_HOUR or --price); J/good tok: measured, the machine's energy over the good output tokens at the "
    "knee's load (docs/energy.md), not modelled"
)


def cells(r: PlanRow, max_replicas: int) -> list[str]:
    """One plan row as the table shows it, in COLUMNS' order (the terminal and the report share it)."""
    return [
        r.label,
        numbers.number(r.knee, "-", unit=" u"),
        numbers.integer(r.replicas, f">{max_replicas}"),
        numbers.integer(r.replicas_p95_time, "-"),
        numbers.percent(r.attainment, 0, "-"),
        band(r.attainment_band),
        numbers.percent(r.attainment_one_fewer, 0, "-"),
        numbers.percent(r.utilisation, 0, "-"),
        numbers.percent(r.headroom, 0, "-"),
        numbers.significant(r.cost_per_million_good_tokens, 3, "not priced" if r.price_per_hour is None else "-"),
        numbers.significant(r.joules_per_good_token, 3, "not measured"),
    ]


def band(edges: list[float | None] | None) -> str:
    """[slow, fast] attainment as the table shows it: "88-97%"; "-" without a spread."""
    if not edges or any(e is None for e in edges):
        return "-"
    slow, fast = edges
    return numbers.percent_range(slow, fast)


def row_notes(rows: list[PlanRow]) -> list[str]:
    """What each row rests on and where it stops, as `label: note` lines."""
    out: list[str] = []
    for r in rows:
        if r.beyond:
            out.append(f"{r.label}: {r.beyond} request(s) met a replica above the highest load its knee measured")
        out.extend(f"{r.label}: {n}" for n in r.notes)
        if r.joules_per_good_token is None and r.energy_reason:
            out.append(f"{r.label}: energy {r.energy_reason}")
    return out


WIDTHS = (34, 6, 8, 8, 7, 9, 7, 5, 8, 12, 12)


def render(rows: list[PlanRow], offered: traffic.Traffic, spec: slo.SloSpec, settings: dict[str, Any]) -> str:
    def line(values: list[str]) -> str:
        first = f"{values[0][: WIDTHS[0]]:<{WIDTHS[0]}}"
        return " ".join([first, *(f"{v:>{w}}" for v, w in zip(values[1:], WIDTHS[1:], strict=True))])

    lines = [f"plan for {offered.name}, {spec.describe()}:", line(list(COLUMNS))]
    lines.extend(line(cells(r, settings["max_replicas"])) for r in rows)
    lines.append(f"note: {METHOD}.")
    lines.append(f"note: {COLUMNS_HELP}.")
    lines.extend(f"note: {n}" for n in row_notes(rows))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the report's section on a knee run


def default_speed(knobs: PlanSettings) -> float:
    try:
        return knobs.speed
    except ValueError as exc:
        raise PlanError(str(exc)) from None


def default_traffic(knobs: PlanSettings, speed: float | None = None) -> traffic.Traffic:
    """The traffic a plan is made for when none is said: the trace PLAN_TRACE names, its clock PLAN_SPEED faster."""
    name = knobs.trace.strip()
    if not name:
        raise PlanError("say the traffic: one of --trace, --rate, --poisson, --prometheus-query (PLAN_TRACE is empty)")
    return traffic.trace(name, default_speed(knobs) if speed is None else speed)


def for_report(path: Path, spec: slo.SloSpec, knobs: PlanSettings) -> tuple[dict[str, Any], list[PlanRow]] | None:
    """The plan a knee run's report shows (its JSON and its row): this knee, the default traffic, the report's
    SLOs, the report's plan knobs; None on other runs. What cannot be planned (bad knobs, a knee without levels) is
    ({"not_planned": why}, [])."""
    if not (path / KNEE).is_file():
        return None
    try:
        settings = settings_of(knobs)
        offered = default_traffic(knobs)
        profile = profile_of(path)
        price = _prices([], knobs).get(profile.engine)
        row, _ = plan_with(settings, profile, offered, spec, price)
    except (PlanError, traffic.TrafficError, ValueError) as exc:
        return {"not_planned": str(exc)}, []
    row.source = str(path)
    doc = {
        "method": METHOD,
        "traffic": {"name": offered.name, "requests": len(offered.arrivals), "duration_s": offered.duration_s},
        "slo": {"spec": spec.text, "objective": spec.objective},
        "settings": settings,
        "rows": [asdict(row)],
    }
    return doc, [row]
