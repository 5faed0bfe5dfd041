"""Concurrency sweeps (throughput and latency per level, the saturation knee) and bursts (queue drain, TTFT by arrival)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from servescope.contracts import series, thresholds
from servescope.contracts.runfolder import RequestRecord
from servescope.judgements import stats
from servescope.report import query
from servescope.report.gauges import GaugeReport
from servescope.report.load import Run

KNEE_FRACTION = 0.9
KNEE_RULE = (
    f"saturation knee = the lowest concurrency whose output throughput reaches {KNEE_FRACTION:.0%} of the best level's; "
    f"past it, more concurrency buys latency, not throughput"
)
DRAIN_RULE = (
    "queue drained = the moment the last request of the burst received its first token (every request admitted), "
    "measured from the burst's first send; from the gauges: the first sample after the peak where waiting is back to 0"
)
TABLE_SCENARIOS = ("sequential", "burst")


@dataclass
class SweepLevel:
    """One concurrency level of a sweep: its throughput, failures, and TTFT and E2E summaries."""

    concurrency: int
    phases: list[str]
    requests: int
    failed: int
    wall_s: float
    output_tokens: int
    tokens_per_s: float | None
    requests_per_s: float | None
    ttft: dict
    e2e: dict


@dataclass
class Sweep:
    """One engine instance's levels of one scenario (a sweep, a ramp) in order, and the knee read from them."""

    instance: str
    engine: str
    scenario: str
    levels: list[SweepLevel]
    knee_concurrency: int | None
    knee_text: str


@dataclass
class BurstDrain:
    """One burst of one engine instance: how long its queue took to drain, and TTFT by arrival order."""

    instance: str
    engine: str
    phase: str
    burst_size: int
    wall_s: float
    drain_s: float | None  # client side: last first-token minus first send
    gauge_drain_s: float | None  # gauge side: waiting back to 0
    ttft_by_arrival: list[tuple[int, float | None]] = field(default_factory=list)
    queued: int = 0  # requests whose first token came late against the burst's fastest (thresholds.TTFT_QUEUED_*)
    served_after: int = 0  # requests whose first token came only after another of the burst had finished
    started_at: float | None = None  # epoch seconds: the burst's first send


def sweeps(run: Run) -> list[Sweep]:
    out = []
    for instance, info in run.engines.items():
        phases = [p for p in run.phases_of(instance) if p.scenario not in TABLE_SCENARIOS]
        for scenario in dict.fromkeys(p.scenario for p in phases):
            levels_by_c: dict[int, list] = {}
            for p in phases:
                if p.scenario == scenario:
                    levels_by_c.setdefault(p.concurrency, []).append(p)
            if len(levels_by_c) < 2:
                continue
            levels = []
            for c in sorted(levels_by_c):
                names = [p.phase for p in levels_by_c[c]]
                where = f"instance = ? AND phase IN ({', '.join('?' * len(names))})"
                params = [instance, *names]
                n, n_ok, tokens = run.con.execute(
                    "SELECT count(*), count(*) FILTER (WHERE ok), coalesce(sum(output_tokens) FILTER (WHERE ok), 0) "
                    f"FROM requests WHERE {where}",
                    params,
                ).fetchone()
                wall = sum(p.wall_s for p in levels_by_c[c])
                levels.append(
                    SweepLevel(
                        concurrency=c,
                        phases=names,
                        requests=n,
                        failed=n - n_ok,
                        wall_s=wall,
                        output_tokens=int(tokens),
                        tokens_per_s=tokens / wall if wall > 0 else None,
                        requests_per_s=n_ok / wall if wall > 0 else None,
                        ttft=stats.summary(query.column(run.con, "ttft_s", f"ok AND {where}", params, order=False)),
                        e2e=stats.summary(query.column(run.con, "e2e_s", f"ok AND {where}", params, order=False)),
                    )
                )
            knee, text = knee_of(levels)
            out.append(Sweep(instance, info.kind, scenario, levels, knee, text))
    return out


def knee_of(levels: list[SweepLevel]) -> tuple[int | None, str]:
    rated = [lv for lv in levels if lv.tokens_per_s is not None]
    if not rated:
        return None, "no throughput measured"
    best = max(lv.tokens_per_s for lv in rated)
    if best <= 0:
        return None, "no tokens generated"
    knee = next(lv for lv in rated if lv.tokens_per_s >= KNEE_FRACTION * best)
    if knee is rated[-1]:
        return None, f"not saturated within the sweep: throughput still rising at concurrency {knee.concurrency}"
    return knee.concurrency, (
        f"saturation knee at concurrency {knee.concurrency}: {knee.tokens_per_s:.1f} tok/s, "
        f"{knee.tokens_per_s / best:.0%} of the best {best:.1f} tok/s"
    )


def bursts(run: Run, gauges: GaugeReport | None = None) -> list[BurstDrain]:
    out = []
    for instance, info in run.engines.items():
        for p in run.phases_of(instance):
            if p.scenario != "burst":
                continue
            recs = run.requests_of(instance, p.phase)  # a burst is as large as its concurrency: few records
            ok = [r for r in recs if r.ok and r.ttft_s is not None]
            drain = max(r.started_at + r.ttft_s for r in ok) - p.started_at if ok else None
            ordered = sorted(
                recs, key=lambda r: (r.arrival_index if r.arrival_index is not None else 1 << 30, r.started_at)
            )
            by_arrival = [
                (r.arrival_index if r.arrival_index is not None else i, r.ttft_s if r.ok else None)
                for i, r in enumerate(ordered)
            ]
            out.append(
                BurstDrain(
                    instance,
                    info.kind,
                    p.phase,
                    p.concurrency,
                    p.wall_s,
                    drain,
                    _gauge_drain(gauges, instance, p.started_at, p.ended_at),
                    by_arrival,
                    *queueing(ok),
                    started_at=p.started_at,
                )
            )
    return out


def queueing(ok: list[RequestRecord]) -> tuple[int, int]:
    """(queued, served after another) among a burst's successful requests: what the clients saw of a queue."""
    if not ok:
        return 0, 0
    fastest = min(r.ttft_s for r in ok)
    late = max(thresholds.TTFT_QUEUED_RATIO * fastest, fastest + thresholds.TTFT_QUEUED_MIN_S)
    queued = sum(1 for r in ok if r.ttft_s >= late)
    served_after = sum(
        1
        for r in ok
        if r.ttft_s >= late
        and any(
            r.started_at + r.ttft_s >= other.started_at + other.e2e_s - thresholds.SERVED_AFTER_SLACK_S
            for other in ok
            if other is not r and other.e2e_s is not None
        )
    )
    return queued, served_after


def mean_ttft_by_arrival(drains: list[BurstDrain], instance: str) -> list[tuple[int, float]]:
    """TTFT per arrival index, averaged over an engine's bursts (successful requests only)."""
    by: dict[int, list[float]] = {}
    for d in drains:
        if d.instance == instance:
            for idx, ttft in d.ttft_by_arrival:
                if ttft is not None:
                    by.setdefault(idx, []).append(ttft)
    return [(i, statistics.fmean(v)) for i, v in sorted(by.items())]


def _gauge_drain(gauges: GaugeReport | None, instance: str, start: float, end: float) -> float | None:
    if gauges is None or not gauges.available or instance not in gauges.engines:
        return None
    eg = gauges.engines[instance]
    points = eg.series.get(series.REQUESTS_WAITING, [])
    step = eg.spacing_s or gauges.step_s or 0.0
    window = [(t, v) for t, v in points if start - step <= t <= end + 10 * step and v is not None]
    seen_wait = False
    for t, v in window:
        if v > 0:
            seen_wait = True
        elif seen_wait:
            return max(0.0, t - start)
    return None


def to_json(sw: list[Sweep], drains: list[BurstDrain]) -> dict:
    return {
        "knee_rule": KNEE_RULE,
        "drain_rule": DRAIN_RULE,
        "sweeps": [asdict(s) for s in sw],
        "bursts": [asdict(d) for d in drains],
    }
