"""Client-side latency percentiles (TTFT, ITL, TPOT, E2E) per engine and scenario, and per load level where the
scenario ran at several (a knee's, a sweep's): failures counted by reason."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from servescope.judgements import stats
from servescope.report import query
from servescope.report.load import Run, knee_of
from servescope.text import words

METRICS = ("ttft_s", "itl_s", "tpot_s", "e2e_s")
METRIC_TITLES = {"ttft_s": "TTFT", "itl_s": "ITL", "tpot_s": "TPOT", "e2e_s": "E2E", "output_tokens": "output tokens"}
DEFINITIONS = {
    "ttft_s": "TTFT: request sent -> first chunk with non-empty content",
    "itl_s": "ITL: every gap between consecutive content chunks, pooled over the requests",
    "tpot_s": "TPOT: (E2E - TTFT) / (output tokens - 1), one value per request",
    "e2e_s": "E2E: request sent -> last content chunk",
}
FAILURE_POLICY = (
    "Only successful requests enter the latency statistics; failed requests are counted by reason and "
    "their partial timings are left out (a request cut off mid-stream would look fast)."
)


@dataclass
class LatencyGroup:
    """One row of the latency tables: an engine's scenario or load level, its percentiles and its failures."""

    instance: str
    engine: str
    scenario: str
    requests: int
    ok: int
    failures: dict[str, int]
    metrics: dict[str, dict]  # metric -> stats.summary
    output_tokens: dict  # stats.summary of output tokens per successful request
    notes: list[str] = field(default_factory=list)
    level: str = ""  # the load it ran at ("2 users", "0.5 req/s") where its scenario ran at several; "" otherwise
    phases: list[str] = field(default_factory=list)  # the phases at that load; [] : the whole scenario


@dataclass(frozen=True)
class Unit:
    """One row of the latency tables: an engine's scenario, or one load level of it (the phases run at that load).
    Pooling a knee's or a sweep's levels would give percentiles of no load that ran."""

    instance: str
    scenario: str
    level: str = ""
    phases: tuple[str, ...] = ()

    def where(self, prefix: str = "") -> tuple[str, list]:
        """Its requests: SQL after WHERE (prefix and'ed in front) and the parameters."""
        sql = f"{prefix} AND {GROUP}" if prefix else GROUP
        if self.phases:
            sql += f" AND phase IN ({', '.join('?' * len(self.phases))})"
        return sql, [self.instance, self.scenario, *self.phases]


# TPOT per request: the record's, else derived like the load generator does.
TPOT_SQL = (
    "coalesce(tpot_s, CASE WHEN e2e_s IS NOT NULL AND ttft_s IS NOT NULL AND output_tokens > 1 "
    "THEN (e2e_s - ttft_s) / (output_tokens - 1) END)"
)
PER_REQUEST_SQL = {"ttft_s": "ttft_s", "tpot_s": TPOT_SQL, "e2e_s": "e2e_s", "output_tokens": "output_tokens"}
GROUP = "instance = ? AND scenario = ?"  # one engine instance in one scenario
BOX_QUANTILES = (5, 25, 50, 75, 95)  # the latency plot's boxes (p25-p75) and whiskers (p5-p95)


def failure_reason(error: str | None, status: int) -> str:
    lines = (error or "").strip().splitlines()
    reason = lines[0] if lines else ""
    if status and status != 200:
        return f"HTTP {status}: {reason}" if reason else f"HTTP {status}"
    return reason or ("no response" if not status else "failed (no reason recorded)")


def units(run: Run) -> list[tuple[str, str]]:
    """(instance, scenario) pairs in the order they first appear in the run (asked once per run: a pass over every
    request)."""
    if "units" not in run.cache:
        rows = run.con.execute(f"SELECT instance, scenario FROM requests GROUP BY ALL ORDER BY min(({query.ORDER}))")
        run.cache["units"] = [tuple(r) for r in rows.fetchall()]
    return list(run.cache["units"])


def groups(run: Run) -> list[tuple[str, str]]:
    """(instance, scenario) pairs: engines in the run's order, each one's scenarios as they first appear."""
    by_instance: dict[str, list[str]] = {}
    for instance, scenario in units(run):
        by_instance.setdefault(instance, []).append(scenario)
    return [(i, s) for i in run.engines for s in by_instance.get(i, [])]


def levels(run: Run) -> dict[tuple[str, str], tuple[float, str]]:
    """(instance, phase) -> (load, the load in words) for the phases of a scenario run at several loads: a knee's
    measurements at the level knee.json says (users or req/s), else a scenario's phases at different concurrency (a
    sweep, a ramp). The sequential and burst phases of the comparison table never: each mode is one load."""
    if "levels" in run.cache:
        return run.cache["levels"]
    found: dict[tuple[str, str], tuple[float, str]] = {}
    knee = knee_of(run)
    if knee and isinstance(knee.get("probes"), list):
        unit = knee.get("unit") or "users"
        for probe in knee["probes"]:
            level = probe.get("level") if isinstance(probe, dict) else None
            if isinstance(level, (int, float)) and isinstance(probe.get("phase"), str):
                found[(knee.get("instance") or "", probe["phase"])] = (float(level), words.load(level, unit))
    by_scenario: dict[tuple[str, str], list] = {}
    for p in run.phases:
        if (p.instance, p.phase) not in found and p.scenario not in SINGLE_LOAD:
            by_scenario.setdefault((p.instance, p.scenario), []).append(p)
    for phases in by_scenario.values():
        if len({p.concurrency for p in phases}) > 1:
            found.update(
                {(p.instance, p.phase): (float(p.concurrency), words.load(p.concurrency, "users")) for p in phases}
            )
    run.cache["levels"] = found
    return found


SINGLE_LOAD = ("sequential", "burst")  # the comparison table's modes: one load each, whatever their phases


def latency_units(run: Run) -> list[Unit]:
    """The latency tables' rows: each engine's scenarios (groups), one row per load level where it ran at several,
    lowest load first."""
    if "latency_units" in run.cache:
        return list(run.cache["latency_units"])
    by_level = levels(run)
    out: list[Unit] = []
    for instance, scenario in groups(run):
        names = [p.phase for p in run.phases_of(instance) if p.scenario == scenario]
        loads: dict[tuple[float, str], list[str]] = {}
        for name in names:
            if (instance, name) in by_level:
                loads.setdefault(by_level[(instance, name)], []).append(name)
        if len(loads) < 2 or len(names) != sum(len(v) for v in loads.values()):
            out.append(Unit(instance, scenario))  # one load, or phases of no known load: the scenario whole
            continue
        out += [Unit(instance, scenario, label, tuple(loads[(v, label)])) for v, label in sorted(loads)]
    run.cache["latency_units"] = out
    return list(out)


def samples(
    run: Run, instance: str, scenario: str, metric: str, ordered: bool = False, phases: tuple[str, ...] = ()
) -> np.ndarray:
    """Raw samples of a per-request metric over one group's successful requests (in the report's order if asked:
    the bootstrap's resamples depend on it; percentiles do not); phases: only those phases' (one load level)."""
    where, params = Unit(instance, scenario, phases=phases).where("ok")
    values = query.column(run.con, PER_REQUEST_SQL[metric], where, params, order=ordered)
    return values[np.isfinite(values)]


def pool(run: Run, instance: str, scenario: str, phases: tuple[str, ...] = ()) -> query.Pool:
    """Every inter-token gap of one group's successful requests (kept per run: the selection is not free); phases:
    only those phases' (one load level)."""
    key = ("itl", instance, scenario, *phases)
    if key not in run.cache:
        run.cache[key] = _pool(run.con, Unit(instance, scenario, phases=phases))
    found = run.cache[key]
    return found.result() if isinstance(found, Future) else found


def start_pools(run: Run) -> None:
    """Begin every row's pool on a thread of its own (on its own cursor): the engine's passes over the gaps then
    overlap with the Python work (and the Prometheus queries) the report does meanwhile."""
    pending = [u for u in latency_units(run) if ("itl", u.instance, u.scenario, *u.phases) not in run.cache]
    if not pending:
        return
    worker = ThreadPoolExecutor(1, thread_name_prefix="pools")
    for u in pending:
        run.cache[("itl", u.instance, u.scenario, *u.phases)] = worker.submit(_pool, run.con.cursor(), u)
    worker.shutdown(wait=False)


def _pool(con, unit: Unit) -> query.Pool:
    gaps = query.Pool(con, *unit.where("ok"))
    # Every rank the report reads (its percentiles, the median, the box plot's), found in one search.
    gaps.select(stats.summary_ranks(gaps.n, stats.QUANTILES + BOX_QUANTILES) | {gaps.n // 2 - 1, gaps.n // 2})
    return gaps


def failures(run: Run, where: str, params: list) -> dict[str, int]:
    """Failed requests counted by reason, most frequent first (ties: as they first happened)."""
    rows = run.con.execute(
        f"SELECT error, status, count(*) FROM requests WHERE NOT ok AND {where} GROUP BY error, status "
        f"ORDER BY min(({query.ORDER}))",
        params,
    ).fetchall()
    counts: Counter[str] = Counter()
    for error, status, n in rows:
        counts[failure_reason(error, status)] += n
    return dict(counts.most_common())


def build(run: Run) -> list[LatencyGroup]:
    out: list[LatencyGroup] = []
    for u in latency_units(run):
        where, params = u.where()
        engine, total, ok, chunked = run.con.execute(
            f"SELECT first(engine ORDER BY {query.ORDER}), count(*), count(*) FILTER (WHERE ok), "
            f"count(*) FILTER (WHERE ok AND tokens_source = 'chunks') FROM requests WHERE {where}",
            params,
        ).fetchone()
        metrics = {
            m: stats.summary(samples(run, u.instance, u.scenario, m, phases=u.phases)) for m in METRICS if m != "itl_s"
        }
        out.append(
            LatencyGroup(
                instance=u.instance,
                engine=engine,
                scenario=u.scenario,
                requests=total,
                ok=ok,
                failures=failures(run, where, params),
                metrics={m: metrics.get(m) for m in METRICS},
                output_tokens=stats.summary(samples(run, u.instance, u.scenario, "output_tokens", phases=u.phases)),
                notes=["some output token counts come from counting chunks (fallback)"] if chunked else [],
                level=u.level,
                phases=list(u.phases),
            )
        )
    for g in out:  # the pooled gaps last: their passes may still be running
        g.metrics["itl_s"] = pool(run, g.instance, g.scenario, tuple(g.phases)).summary()
    return out


def to_json(groups: list[LatencyGroup]) -> list[dict]:
    return [asdict(g) for g in groups]
