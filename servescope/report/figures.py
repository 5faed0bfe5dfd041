"""What each figure shows, as plain data (lists, dicts, numbers) read from the run and the sections: servescope/report/plots.py draws it.

The split lets the drawing run in a process of its own (servescope/report/painter.py): what crosses to it is
data, never the run's database, so that process imports matplotlib and nothing of the run's reading.
Each function returns None when its figure would be empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from servescope.contracts import series
from servescope.judgements import stats
from servescope.report import latency
from servescope.report.compare import Delta
from servescope.report.crosscheck import COMPONENTS, CrossCheck
from servescope.report.gauges import GaugeReport, with_gaps
from servescope.report.load import Run
from servescope.report.sweep import BurstDrain, Sweep, mean_ttft_by_arrival
from servescope.report.table import TableRow
from servescope.report.workloads import WorkloadReport

# Each figure's file in the run folder, by the key the report's sections use.
FILES = {
    "tokens": "output_tokens.png",
    "table": "sequential_burst_table.png",
    "gauges": "gauges.png",
    "crosscheck": "crosscheck.png",
    "sweeps": "sweeps.png",
    "arrival": "ttft_by_arrival.png",
    "turns": "turns.png",
    "latency": "latency.png",
    "compare": "comparison.png",
}
MAX_FLIERS = 2000  # points drawn beyond the whiskers of a box whose values are not all fetched
LEVER_GAUGES = (series.REQUESTS_RUNNING, series.REQUESTS_WAITING, series.KV_CACHE_USAGE)


def sequential_burst_table(rows: list[TableRow]) -> dict | None:
    """Wall time per engine and mode, with each burst's scaling factor."""
    if not rows:
        return None
    return {"bars": [(r.title, r.mode, r.wall_s, r.scaling_factor) for r in rows]}


def latency_boxes(run: Run) -> dict | None:
    """One panel per latency metric, one box per row of the latency tables (an engine's scenario, or one load level of
    it) in ms, as matplotlib's bxp takes them."""
    units = [u for u in latency.latency_units(run) if _any_ok(run, u)]
    if not units:
        return None
    panels = [
        (latency.DEFINITIONS[metric].split(":")[0], [_box(run, u, metric) for u in units]) for metric in latency.METRICS
    ]
    labels = [f"{run.engines[u.instance].title}\n{u.scenario}" + (f", {u.level}" if u.level else "") for u in units]
    return {"labels": labels, "panels": panels}


def _any_ok(run: Run, unit: latency.Unit) -> bool:
    where, params = unit.where("ok")
    return bool(run.con.execute(f"SELECT count(*) FROM requests WHERE {where}", params).fetchone()[0])


def _box(run: Run, unit: latency.Unit, metric: str) -> dict | None:
    """One box's statistics in ms, as matplotlib's boxplot(whis=(p5, p95)) computes them (a pool too large to fetch:
    from exact order statistics); every box draws at most MAX_FLIERS fliers, evenly spread."""
    whis = (latency.BOX_QUANTILES[0], latency.BOX_QUANTILES[-1])
    if metric != "itl_s":
        data = latency.samples(run, unit.instance, unit.scenario, metric, phases=unit.phases) * 1000
        return _thin(stats.box_stats(data, whis)) if len(data) else None
    pool = latency.pool(run, unit.instance, unit.scenario, unit.phases)
    if not pool.n:
        return None
    if pool.whole:
        return _thin(stats.box_stats(pool.in_order() * 1000, whis))
    # The whiskers are data points: the smallest value >= p5 and the largest <= p95.
    low, high = (pool.percentile(q) for q in whis)
    lo5, hi5, _ = stats.rank_of(pool.n, whis[0])
    lo95, hi95, _ = stats.rank_of(pool.n, whis[1])
    whislo = pool.at(lo5) if pool.at(lo5) >= low else pool.at(hi5)
    whishi = pool.at(hi95) if pool.at(hi95) <= high else pool.at(lo95)
    return {
        "med": pool.percentile(50) * 1000,
        "q1": pool.percentile(25) * 1000,
        "q3": pool.percentile(75) * 1000,
        "whislo": whislo * 1000,
        "whishi": whishi * 1000,
        "mean": pool.total / pool.n * 1000,
        "fliers": pool.outside(whislo, whishi, MAX_FLIERS) * 1000,
    }


def _thin(box: dict) -> dict:
    """At most MAX_FLIERS fliers, evenly spread over them: 50,000 markers per box draw slowly and show no more."""
    fliers = box["fliers"]
    box["fliers"] = fliers[:: -(-len(fliers) // MAX_FLIERS)] if len(fliers) > MAX_FLIERS else fliers
    return box


def output_tokens(run: Run) -> dict | None:
    """Requests per output length, per engine: counts from the engine, the histogram of a million requests without
    a million numbers."""
    data = {}
    for i in run.engines:
        rows = run.con.execute(
            "SELECT output_tokens, count(*) FROM requests WHERE ok AND instance = ? AND output_tokens IS NOT NULL "
            "GROUP BY 1 ORDER BY 1",
            [i],
        ).fetchall()
        if rows:
            data[run.engines[i].title] = ([v for v, _ in rows], [n for _, n in rows])
    return data or None


def gauge_traces(run: Run, report: GaugeReport) -> dict[str, dict]:
    """What the gauge plot draws, in seconds since the run's start: phase bands and each gauge with its gaps as NaN.
    The run's targets that make a fleet (FLEET_SUMMARY_INSTANCES of one kind) are drawn once, as their derived sum."""
    if not report.available or report.window is None:
        return {}
    t0 = report.window[0]
    traces = {}

    def trace_of(series_: dict, spacing: float | None, instance: str) -> dict[str, Any]:
        trace: dict[str, Any] = {
            "bands": [(p.phase, p.started_at - t0, p.ended_at - t0) for p in run.phases_of(instance)]
        }
        for gauge in LEVER_GAUGES:
            points = with_gaps(series_.get(gauge, []), spacing)
            trace[gauge] = ([t - t0 for t, _ in points], [v for _, v in points])
        return trace

    for eg in report.engines.values():
        fleet = report.fleet_of(eg.instance)
        if not eg.series or (fleet is not None and fleet.behind is None):
            continue
        traces[eg.instance] = trace_of(eg.series, eg.spacing_s, eg.instance)
    for fleet in report.fleets:
        if fleet.behind is None and fleet.total:
            traces[fleet_key(fleet)] = trace_of(fleet.total, fleet.spacing_s, fleet.members[0].instance)
    return traces


def fleet_key(fleet) -> str:
    return f"fleet:{fleet.engine}"


def gauges(run: Run, report: GaugeReport) -> dict | None:
    """One panel per engine, or per fleet: its title (where the values came from) and its trace."""
    traces = gauge_traces(run, report)
    if not traces:
        return None
    panels = []
    fleets = {fleet_key(f): f for f in report.fleets if f.behind is None}
    for key, trace in traces.items():
        if key in fleets:
            f = fleets[key]
            title = (
                f"{len(f.members)} {f.engine} instances: lever gauges summed per read (derived; shaded: load phases)"
            )
        else:
            eg = report.engines[key]
            how = f"samples every {eg.spacing_s * 1000:g} ms" if eg.source == "samples" else "Prometheus"
            behind = report.fleet_of(key)
            if behind is not None:
                how += f", summed over {len(behind.members)} instances (derived)"
            title = f"{run.engines[key].title}: lever gauges ({how}; shaded: load phases)"
        panels.append((title, trace))
    return {"panels": panels}


def ttft_by_arrival(run: Run, drains: list[BurstDrain]) -> dict | None:
    """Mean TTFT per arrival index within the bursts, one line per engine (its colour: its place in the run)."""
    lines = []
    for k, instance in enumerate(run.engines):
        pts = mean_ttft_by_arrival(drains, instance)
        if pts:
            lines.append((k, run.engines[instance].title, [i + 1 for i, _ in pts], [v for _, v in pts]))
    return {"lines": lines} if lines else None


def sweeps(run: Run, sweeps_: list[Sweep]) -> dict | None:
    """Per sweep: concurrency levels, aggregate tokens/s, E2E p50 and p95, and the knee."""
    if not sweeps_:
        return None
    return {
        "lines": [
            {
                "label": f"{run.engines[sw.instance].title} ({sw.scenario})",
                "concurrency": [lv.concurrency for lv in sw.levels],
                "tokens_per_s": [lv.tokens_per_s or 0 for lv in sw.levels],
                "e2e_p50": [lv.e2e["p50"] for lv in sw.levels],
                "e2e_p95": [lv.e2e["p95"] for lv in sw.levels],
                "knee": sw.knee_concurrency,
            }
            for sw in sweeps_
        ]
    }


def crosscheck(run: Run, checks: list[CrossCheck]) -> dict | None:
    """Stacked mean seconds per component per engine, and the client's mean E2E beside them."""
    checks = [c for c in checks if c.available and c.components_mean_s]
    if not checks:
        return None
    return {
        "names": [run.engines[c.instance].title for c in checks],
        "components": [(comp, [c.components_mean_s.get(comp, 0.0) for c in checks]) for comp in COMPONENTS],
        "client_e2e_mean_s": [c.client_e2e_mean_s for c in checks],
    }


def compare(deltas: Sequence[Delta], what: str = "") -> dict | None:
    """Each delta as a percent change of the baseline's median, its CI's reach on each side, and whether it excludes 0."""
    rows = [d for d in deltas if d.delta is not None and d.median_baseline]
    if not rows:
        return None
    return {
        "what": what,
        # Run ids are in the table next to the plot; the instance names are enough to tell rows apart.
        "labels": [
            f"{d.current.rsplit('/', 1)[-1]} vs {d.baseline.rsplit('/', 1)[-1]}, {d.scenario}: "
            f"{latency.METRIC_TITLES.get(d.metric, d.metric)}"
            for d in rows
        ],
        "pct": [100 * d.delta / d.median_baseline for d in rows],
        # An interval from a subsample may not hold the exact delta: draw what it holds on each side, never less than 0.
        "below": [max(0.0, 100 * (d.delta - d.ci_low) / d.median_baseline) for d in rows],
        "above": [max(0.0, 100 * (d.ci_high - d.delta) / d.median_baseline) for d in rows],
        "excludes_zero": [d.excludes_zero for d in rows],
    }


def turns(run: Run, report: WorkloadReport) -> dict | None:
    """Per engine and scenario: TTFT p50 (ms) and prefix-cache reuse (per request, server) by conversation turn."""
    groups: dict[tuple[str, str], list] = {}
    for row in report.turns:
        groups.setdefault((row.instance, row.scenario), []).append(row)
    if not groups:
        return None
    lines = []
    for (instance, scenario), rows in groups.items():
        lines.append(
            {
                "label": f"{run.engines[instance].title if instance in run.engines else instance} {scenario}",
                "turns": [r.turn for r in rows],
                "ttft_p50_ms": [None if r.ttft["p50"] is None else r.ttft["p50"] * 1000 for r in rows],
                "reuse": {
                    source: [getattr(r, attr) for r in rows]
                    for attr, source in (("reuse_per_request", "per request"), ("reuse_server", "server"))
                },
            }
        )
    return {"lines": lines}
