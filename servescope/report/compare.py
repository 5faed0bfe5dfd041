"""Comparison mode: per-metric median deltas with bootstrap CIs, paired by prompt where both sides ran the same prompts."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from servescope.contracts.runfolder import PhaseRecord
from servescope.judgements import stats
from servescope.report import gauges, latency, query
from servescope.report.load import Run

METRICS = ("ttft_s", "itl_s", "tpot_s", "e2e_s", "output_tokens")
METHOD = (
    f"delta = median(current) - median(baseline), successful requests only; {stats.CONFIDENCE:.0%} percentile bootstrap "
    f"CI over {stats.BOOTSTRAP_RESAMPLES} resamples (seed {stats.BOOTSTRAP_SEED}). Paired when both sides ran the same "
    f"prompt set: each prompt's median on one side against the same prompt's on the other, whole pairs resampled. "
    f"ITL pools every gap, so it is never paired; a side above {stats.BOOTSTRAP_MAX_SAMPLES:,} samples is subsampled "
    f"once (seeded) before resampling, which can only widen the interval, and the interval is moved to sit around the "
    f"exact delta. Past {query.FETCH_WHOLE:,} gaps the subsample is an even one drawn in the engine (every j-th gap "
    f"of each request); the medians stay exact."
)


@dataclass
class Delta:
    """One metric's median change from a baseline to the current run in one scenario, with its bootstrap CI."""

    current: str  # "<run>/<instance>"
    baseline: str
    scenario: str
    metric: str
    paired: bool
    n_current: int
    n_baseline: int
    median_current: float | None
    median_baseline: float | None
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    delta_pct: float | None

    @property
    def excludes_zero(self) -> bool:
        return self.ci_low is not None and self.ci_high is not None and (self.ci_low > 0 or self.ci_high < 0)


@dataclass(frozen=True)
class Side:
    """One engine instance's requests in one scenario of one run: what a delta compares."""

    run: Run
    instance: str
    scenario: str
    label: str


def by_prompt(side: Side, metric: str) -> dict[tuple[str, str], float]:
    """A per-request metric's median over successful requests, by (prompt set hash, prompt id): statistics.median's
    (the middle value, or the mean of the two middle values), the values sorted in the engine."""
    value = latency.PER_REQUEST_SQL[metric]
    rows = side.run.con.execute(
        f"SELECT sha, pid, n, v[(n + 1) // 2], v[n // 2 + 1] FROM (SELECT prompt_set_sha256 AS sha, prompt_id AS pid, "
        f"count(*) AS n, list(({value})::DOUBLE ORDER BY ({value})::DOUBLE) AS v FROM requests "
        f"WHERE ok AND {latency.GROUP} AND ({value}) IS NOT NULL AND prompt_id <> '' GROUP BY ALL)",
        [side.instance, side.scenario],
    ).fetchall()
    return {(sha, pid): (low if n % 2 else (low + high) / 2) for sha, pid, n, low, high in rows}


def pairs(current: Side, baseline: Side, metric: str) -> tuple[list[float], list[float]]:
    """Per-prompt medians on both sides, for prompts both sides ran (same prompt set hash)."""
    cur, base = by_prompt(current, metric), by_prompt(baseline, metric)
    common = sorted(set(cur) & set(base))
    return [cur[k] for k in common], [base[k] for k in common]


def prompt_set_kinds(run: Run) -> dict[str, dict]:
    """The manifest's word on each prompt set by name (kind, tokens, seed; loadgen/manifest.py), old lists too."""
    sets = run.manifest.get("prompt_sets")
    if isinstance(sets, list):
        sets = {s.get("name"): s for s in sets if isinstance(s, dict)}
    return {str(k): v for k, v in sets.items() if isinstance(v, dict)} if isinstance(sets, dict) else {}


def work(run: Run, phases: list[PhaseRecord]) -> set[tuple]:
    """What a group of phases asked: (prompt set sha256, max_tokens) per phase; a fresh set (a new prompt per request,
    drawn from a seed of the run's own) as ("fresh", its prompt length, max_tokens): two runs of one are two draws
    of the same workload, never the same prompts."""
    kinds = prompt_set_kinds(run)
    out = set()
    for p in phases:
        described = kinds.get(p.prompt_set, {})
        if described.get("kind") == "fresh":
            out.add(("fresh", described.get("tokens"), p.max_tokens))
        else:
            out.add((p.prompt_set_sha256, p.max_tokens))
    return out


def matched_set(current: tuple[Run, list[PhaseRecord]], baseline: tuple[Run, list[PhaseRecord]]) -> str | None:
    """The reference page's matched-set rule between two runs' groups of phases: the same prompt sets (sha256) with
    the same max_tokens, or fresh sets of the same prompt length; None when they match, else what differs (one line)."""
    if work(*current) == work(*baseline):
        return None

    def said(run: Run, phases: list[PhaseRecord]) -> str:
        shown = {(p.prompt_set or "?", p.prompt_set_sha256[:12] or "no hash", p.max_tokens) for p in phases}
        return ", ".join(f"{n} ({h}, max_tokens {m})" for n, h, m in sorted(shown))

    return f"{baseline[0].run_id} ran {said(*baseline)}; {current[0].run_id} ran {said(*current)}"


def compare_groups(current: Side, baseline: Side) -> list[Delta]:
    by_metric: dict[str, Delta] = {}
    # ITL last: it reads the pools of gaps, whose passes may still be running while the others are resampled.
    for metric in sorted(METRICS, key=lambda m: m == "itl_s"):
        paired = False
        if metric in latency.PER_REQUEST_SQL:
            a, b = pairs(current, baseline, metric)
            paired = len(a) >= 2
        if paired:
            result = stats.bootstrap_median_delta(a, b, paired=True)
        elif metric == "itl_s":
            result = _pooled(current, baseline)
        else:
            result = stats.bootstrap_median_delta(_unpaired(current, metric), _unpaired(baseline, metric), paired=False)
        by_metric[metric] = Delta(
            current.label,
            baseline.label,
            current.scenario,
            metric,
            paired,
            result["n_current"],
            result["n_baseline"],
            result["median_current"],
            result["median_baseline"],
            result["delta"],
            result["ci_low"],
            result["ci_high"],
            result["delta_pct"],
        )
    return [by_metric[m] for m in METRICS]


def _unpaired(side: Side, metric: str) -> np.ndarray:
    return latency.samples(side.run, side.instance, side.scenario, metric, ordered=True)


def _pooled(current: Side, baseline: Side) -> dict:
    """ITL: every gap of each side; a pool too large to fetch gives its exact median and an even sample."""
    pc, pb = (latency.pool(s.run, s.instance, s.scenario) for s in (current, baseline))
    if pc.whole and pb.whole:
        return stats.bootstrap_median_delta(pc.in_order(), pb.in_order(), paired=False)
    a, b = (p.in_order() if p.whole else p.sample(stats.BOOTSTRAP_MAX_SAMPLES) for p in (pc, pb))
    return stats.bootstrap_median_delta(a, b, paired=False, pools=((pc.n, pc.median()), (pb.n, pb.median())))


units = latency.units  # (instance, scenario) pairs in the order they first appear in the run


def between_runs(current: Run, baseline: Run) -> tuple[list[Delta], str]:
    """Same engine instance and scenario in both runs; or, one engine each, the same scenario."""
    cu, bu = units(current), units(baseline)
    common = [k for k in cu if k in bu]
    how = "same engine instance and scenario in both runs"
    if not common and len(current.engines) == 1 and len(baseline.engines) == 1:
        (ci,), (bi,) = list(current.engines), list(baseline.engines)
        common = [(ci, s) for (i, s) in cu if (bi, s) in bu]
        how = f"one engine per run ({ci} vs {bi}), same scenario"
        pairs_ = [((ci, s), (bi, s)) for _, s in common]
    else:
        pairs_ = [(k, k) for k in common]
    deltas = []
    for ck, bk in pairs_:
        deltas += compare_groups(
            Side(current, *ck, f"{current.run_id}/{ck[0]}"), Side(baseline, *bk, f"{baseline.run_id}/{bk[0]}")
        )
    if not pairs_:
        how = "nothing in common: no engine instance and scenario appear in both runs"
    return deltas, how


def within_run(run: Run) -> tuple[list[Delta], str]:
    """Every other engine against the first engine in the manifest, per scenario both ran. The targets of a fleet
    (FLEET_SUMMARY_INSTANCES or more of one kind) are left out: replica k against replica 0 says nothing about an
    engine, and at a hundred replicas its bootstraps would be most of the report's time."""
    fleets = gauges.fleet_kinds(run)
    instances = [i for i, info in run.engines.items() if info.kind not in fleets]
    if fleets:
        targets = sum(info.kind in fleets for info in run.engines.values())
        left_out = f"; not compared one by one: the {targets} targets of the {', '.join(sorted(fleets))} fleet"
        if len(instances) < 2:
            return [], "no engine outside a fleet to compare (make report BASELINE=<run-id>)" + left_out
    else:
        left_out = ""
    if len(instances) < 2:
        return [], "one engine and no baseline run: nothing to compare (make report BASELINE=<run-id>)"
    u = units(run)
    base = instances[0]
    deltas = []
    for other in instances[1:]:
        for i, scenario in u:
            if i == other and (base, scenario) in u:
                deltas += compare_groups(Side(run, i, scenario, other), Side(run, base, scenario, base))
    return deltas, f"engines within run {run.run_id}, each against {base}{left_out}"


def to_json(deltas: list[Delta], how: str) -> dict:
    return {
        "method": METHOD,
        "matching": how,
        "deltas": [{**asdict(d), "ci_excludes_zero": d.excludes_zero} for d in deltas],
    }
