"""Client-side latency percentiles (TTFT, ITL, TPOT, E2E) per engine and scenario, failures counted by reason."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from report import query, stats
from report.load import Run

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
    instance: str
    engine: str
    scenario: str
    requests: int
    ok: int
    failures: dict[str, int]
    metrics: dict[str, dict]  # metric -> stats.summary
    output_tokens: dict  # stats.summary of output tokens per successful request
    notes: list[str] = field(default_factory=list)


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


def samples(run: Run, instance: str, scenario: str, metric: str, ordered: bool = False) -> np.ndarray:
    """Raw samples of a per-request metric over one group's successful requests (in the report's order if asked:
    the bootstrap's resamples depend on it; percentiles do not)."""
    values = query.column(run.con, PER_REQUEST_SQL[metric], f"ok AND {GROUP}", [instance, scenario], order=ordered)
    return values[np.isfinite(values)]


def pool(run: Run, instance: str, scenario: str) -> query.Pool:
    """Every inter-token gap of one group's successful requests (kept per run: the selection is not free)."""
    key = ("itl", instance, scenario)
    if key not in run.cache:
        run.cache[key] = _pool(run.con, instance, scenario)
    found = run.cache[key]
    return found.result() if isinstance(found, Future) else found


def start_pools(run: Run) -> None:
    """Begin every group's pool on a thread of its own (on its own cursor): the engine's passes over the gaps then
    overlap with the Python work (and the Prometheus queries) the report does meanwhile."""
    pending = [g for g in groups(run) if ("itl", *g) not in run.cache]
    if not pending:
        return
    worker = ThreadPoolExecutor(1, thread_name_prefix="pools")
    for instance, scenario in pending:
        run.cache[("itl", instance, scenario)] = worker.submit(_pool, run.con.cursor(), instance, scenario)
    worker.shutdown(wait=False)


def _pool(con, instance: str, scenario: str) -> query.Pool:
    gaps = query.Pool(con, f"ok AND {GROUP}", [instance, scenario])
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
    for instance, scenario in groups(run):
        params = [instance, scenario]
        engine, total, ok, chunked = run.con.execute(
            f"SELECT first(engine ORDER BY {query.ORDER}), count(*), count(*) FILTER (WHERE ok), "
            f"count(*) FILTER (WHERE ok AND tokens_source = 'chunks') FROM requests WHERE {GROUP}",
            params,
        ).fetchone()
        metrics = {m: stats.summary(samples(run, instance, scenario, m)) for m in METRICS if m != "itl_s"}
        out.append(
            LatencyGroup(
                instance=instance,
                engine=engine,
                scenario=scenario,
                requests=total,
                ok=ok,
                failures=failures(run, GROUP, params),
                metrics={m: metrics.get(m) for m in METRICS},
                output_tokens=stats.summary(samples(run, instance, scenario, "output_tokens")),
                notes=["some output token counts come from counting chunks (fallback)"] if chunked else [],
            )
        )
    for g in out:  # the pooled gaps last: their passes may still be running
        g.metrics["itl_s"] = pool(run, g.instance, g.scenario).summary()
    return out


def to_json(groups: list[LatencyGroup]) -> list[dict]:
    return [asdict(g) for g in groups]
