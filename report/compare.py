"""Comparison mode: per-metric median deltas with bootstrap CIs, paired by prompt where both sides ran the same prompts."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from report import stats
from report.latency import samples, tpot
from report.load import Run
from servescope.runfolder import RequestRecord

PER_REQUEST = {
    "ttft_s": lambda r: r.ttft_s,
    "tpot_s": tpot,
    "e2e_s": lambda r: r.e2e_s,
    "output_tokens": lambda r: float(r.output_tokens) if r.output_tokens is not None else None,
}
METRICS = ("ttft_s", "itl_s", "tpot_s", "e2e_s", "output_tokens")
METHOD = (
    f"delta = median(current) - median(baseline), successful requests only; {stats.CONFIDENCE:.0%} percentile bootstrap "
    f"CI over {stats.BOOTSTRAP_RESAMPLES} resamples (seed {stats.BOOTSTRAP_SEED}). Paired when both sides ran the same "
    f"prompt set: each prompt's median on one side against the same prompt's on the other, whole pairs resampled. "
    f"ITL pools every gap, so it is never paired; a side above {stats.BOOTSTRAP_MAX_SAMPLES:,} samples is subsampled "
    f"once (seeded) before resampling, which can only widen the interval."
)


@dataclass
class Delta:
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


def pairs(current: list[RequestRecord], baseline: list[RequestRecord], metric: str) -> tuple[list[float], list[float]]:
    """Per-prompt medians on both sides, for prompts both sides ran (same prompt set hash)."""
    get = PER_REQUEST[metric]

    def by_prompt(records: list[RequestRecord]) -> dict[tuple[str, str], list[float]]:
        out: dict[tuple[str, str], list[float]] = {}
        for r in records:
            value = get(r) if r.ok else None
            if value is not None and r.prompt_id:
                out.setdefault((r.prompt_set_sha256, r.prompt_id), []).append(value)
        return out

    cur, base = by_prompt(current), by_prompt(baseline)
    common = sorted(set(cur) & set(base))
    return [statistics.median(cur[k]) for k in common], [statistics.median(base[k]) for k in common]


def compare_groups(
    current: list[RequestRecord], baseline: list[RequestRecord], cur_label: str, base_label: str, scenario: str
) -> list[Delta]:
    out = []
    for metric in METRICS:
        paired = False
        if metric in PER_REQUEST:
            a, b = pairs(current, baseline, metric)
            paired = len(a) >= 2
        if not paired:
            a, b = _unpaired(current, metric), _unpaired(baseline, metric)
        result = stats.bootstrap_median_delta(a, b, paired=paired)
        out.append(
            Delta(
                cur_label,
                base_label,
                scenario,
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
        )
    return out


def _unpaired(records: list[RequestRecord], metric: str) -> list[float]:
    if metric == "output_tokens":
        return [float(r.output_tokens) for r in records if r.ok and r.output_tokens is not None]
    return samples(records, metric)


def units(run: Run) -> dict[tuple[str, str], list[RequestRecord]]:
    out: dict[tuple[str, str], list[RequestRecord]] = {}
    for r in run.requests:
        out.setdefault((r.instance, r.scenario), []).append(r)
    return out


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
        deltas += compare_groups(cu[ck], bu[bk], f"{current.run_id}/{ck[0]}", f"{baseline.run_id}/{bk[0]}", ck[1])
    if not pairs_:
        how = "nothing in common: no engine instance and scenario appear in both runs"
    return deltas, how


def within_run(run: Run) -> tuple[list[Delta], str]:
    """Every other engine against the first engine in the manifest, per scenario both ran."""
    instances = list(run.engines)
    if len(instances) < 2:
        return [], "one engine and no baseline run: nothing to compare (make report BASELINE=<run-id>)"
    u = units(run)
    base = instances[0]
    deltas = []
    for other in instances[1:]:
        for (i, scenario), recs in u.items():
            if i == other and (base, scenario) in u:
                deltas += compare_groups(recs, u[(base, scenario)], other, base, scenario)
    return deltas, f"engines within run {run.run_id}, each against {base}"


def to_json(deltas: list[Delta], how: str) -> dict:
    return {
        "method": METHOD,
        "matching": how,
        "deltas": [{**asdict(d), "ci_excludes_zero": d.excludes_zero} for d in deltas],
    }
