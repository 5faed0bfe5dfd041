"""Percentiles, summaries and seeded bootstrap confidence intervals on medians and percentiles, computed from raw samples."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from servescope.judgements.numpy_on_use import numpy as np

QUANTILES = (50, 90, 95, 99)
PERCENTILE_METHOD = "linear interpolation between closest ranks (numpy's default, Hyndman-Fan type 7)"
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261130
CONFIDENCE = 0.95
# Pooled ITL can hold hundreds of thousands of gaps: resampling all of them 2000 times would take
# minutes. Above this size each side is subsampled once (seeded) first, which only widens the CI (its width goes as
# 1 / sqrt(samples)): conservative, and quick at that size.
BOOTSTRAP_MAX_SAMPLES = 10_000
# A list this short is sorted as Python floats, not made an array: quick at this size, and numpy is not imported
# for it (a short run's summary: servescope/judgements/numpy_on_use.py). Same ranks either way, so the same median.
SORTED_IN_PYTHON = 512


def rank_of(n: int, q: float) -> tuple[int, int, float]:
    """Type 7 for n sorted values: (lower rank, upper rank, weight of the upper), ranks 0-based."""
    h = (n - 1) * q / 100.0
    lo = math.floor(h)
    return lo, min(lo + 1, n - 1), h - lo


def interpolate(lo_value: float, hi_value: float, weight: float) -> float:
    return lo_value + weight * (hi_value - lo_value)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), type 7: rank h = (n-1)·q/100, interpolated between floor and ceil."""
    data = sorted(values)
    if not data:
        return None
    lo, hi, w = rank_of(len(data), q)
    return interpolate(data[lo], data[hi], w)


def numpy_lerp_sql(a: str, b: str, g: str) -> str:
    """SQL: numpy's interpolation between neighbours a <= b at fraction g (its two formulas, for the same rounding)."""
    return f"(CASE WHEN {g} >= 0.5 THEN {b} - ({b} - {a}) * (1 - {g}) ELSE {a} + ({b} - {a}) * {g} END)"


def finite(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """The finite values as a float array (None and NaN dropped)."""
    data = np.asarray([np.nan if v is None else v for v in values] if not isinstance(values, np.ndarray) else values)
    data = data.astype(float, copy=False)
    return data[np.isfinite(data)]


def summary(values: Sequence[float] | np.ndarray) -> dict[str, float | int | None]:
    """n, p50/p90/p95/p99, mean, min, max of one sample set; None where there are no samples."""
    data = np.sort(finite(values))
    return summary_of(len(data), lambda r: float(data[r]), math.fsum(data.tolist()) if len(data) else 0.0)


def summary_of(n: int, at: Callable[[int], float], total: float) -> dict[str, float | int | None]:
    """The summary from a count, the value at any 0-based rank of the sorted samples, and their exact sum."""
    out: dict[str, float | int | None] = {"n": n}
    for q in QUANTILES:
        out[f"p{q}"] = None
        if n:
            lo, hi, w = rank_of(n, q)
            out[f"p{q}"] = interpolate(at(lo), at(hi), w)
    out["mean"] = total / n if n else None  # statistics.fmean: the exact sum (fsum) over n
    out["min"] = at(0) if n else None
    out["max"] = at(n - 1) if n else None
    return out


def summary_ranks(n: int, quantiles: tuple[float, ...] = QUANTILES) -> set[int]:
    """The ranks summary_of reads (and those of any other percentiles): what to select from a pool too large to sort."""
    ranks = {0, n - 1} if n else set()
    for q in quantiles if n else ():
        ranks |= set(rank_of(n, q)[:2])
    return ranks


def median(values: Sequence[float] | np.ndarray) -> float | None:
    """statistics.median on any sequence or array: the middle value, or the mean of the two middle values (None read
    as NaN, NaN ranked last, as numpy ranks them)."""
    n = len(values)
    if not n:
        return None
    mid = n // 2
    if isinstance(values, (list, tuple)) and n <= SORTED_IN_PYTHON:
        floats = [math.nan if v is None else float(v) for v in values]
        ranked = sorted(v for v in floats if v == v) + [v for v in floats if v != v]
    else:
        ranked = np.partition(np.asarray(values, dtype=float), [mid - 1, mid] if n > 1 else [mid])
    return float(ranked[mid]) if n % 2 else (float(ranked[mid - 1]) + float(ranked[mid])) / 2


def box_stats(values: np.ndarray, whis: tuple[float, float]) -> dict:
    """One box as matplotlib's cbook.boxplot_stats(values, whis=whis) gives it (mean, quartiles, whiskers at the
    percentiles `whis`, fliers beyond them), without importing matplotlib: the report computes, a painter draws."""
    x = np.asarray(values, dtype=float).ravel()
    q1, med, q3 = np.percentile(x, [25, 50, 75])
    loval, hival = np.percentile(x, whis)
    high, low = x[x <= hival], x[x >= loval]
    # A whisker is a data point, never inside the box.
    whishi = q3 if not len(high) or np.max(high) < q3 else np.max(high)
    whislo = q1 if not len(low) or np.min(low) > q1 else np.min(low)
    fliers = np.concatenate([x[x < whislo], x[x > whishi]])
    return {"mean": np.mean(x), "med": med, "q1": q1, "q3": q3, "whislo": whislo, "whishi": whishi, "fliers": fliers}


def bootstrap_median_delta(
    current: Sequence[float] | np.ndarray,
    baseline: Sequence[float] | np.ndarray,
    *,
    paired: bool,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
    pools: tuple[tuple[int, float | None], tuple[int, float | None]] | None = None,
) -> dict[str, float | int | bool | None]:
    """median(current) - median(baseline) with a percentile bootstrap CI.

    Paired: current[i] and baseline[i] are the same prompt; whole pairs are resampled so the
    prompt-to-prompt spread cancels. Unpaired: each side is resampled on its own. pools: (n, exact median)
    of each side when current and baseline are already uniform subsamples of pools too large to pass whole.
    """
    return _bootstrap_delta(
        current,
        baseline,
        "median",
        median,
        _Ranked.medians,
        _Ranked.drawn_medians,
        paired,
        resamples,
        seed,
        confidence,
        pools,
    )


def bootstrap_percentile_delta(
    current: Sequence[float] | np.ndarray,
    baseline: Sequence[float] | np.ndarray,
    q: float,
    *,
    paired: bool = False,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
    pools: tuple[tuple[int, float | None], tuple[int, float | None]] | None = None,
) -> dict[str, float | int | bool | None]:
    """percentile(current, q) - percentile(baseline, q) (type 7, as `percentile`) with bootstrap_median_delta's
    resampling; keys as its, "percentile_current" / "percentile_baseline" for the medians'. pools: (n, exact q-th
    percentile) of each side, as there."""

    def point(values: np.ndarray) -> float | None:
        data = np.sort(values)
        if not len(data):
            return None
        lo, hi, w = rank_of(len(data), q)
        return interpolate(float(data[lo]), float(data[hi]), w)

    def resampled(ranked: _Ranked, idx: np.ndarray) -> np.ndarray:
        return ranked.percentiles(idx, q)

    def drawn(ranked: _Ranked, rng: np.random.Generator, k: int) -> np.ndarray:
        return ranked.drawn_percentiles(rng, k, q)

    out = _bootstrap_delta(
        current, baseline, "percentile", point, resampled, drawn, paired, resamples, seed, confidence, pools
    )
    out["q"] = q
    return out


def _bootstrap_delta(
    current: Sequence[float] | np.ndarray,
    baseline: Sequence[float] | np.ndarray,
    name: str,
    point: Callable[[np.ndarray], float | None],
    resampled: Callable[[_Ranked, np.ndarray], np.ndarray],
    drawn: Callable[[_Ranked, np.random.Generator, int], np.ndarray],
    paired: bool,
    resamples: int,
    seed: int,
    confidence: float,
    pools: tuple[tuple[int, float | None], tuple[int, float | None]] | None,
) -> dict[str, float | int | bool | None]:
    """point(current) - point(baseline) with a percentile bootstrap CI. Paired: point's value of each resample computed
    by `resampled` from the resample's indices into the sample (sorted once). Unpaired: `drawn` gives each side's
    resampled values directly (the same distribution as resampling the side's values, fewer random numbers)."""
    cur, base = np.asarray(current, dtype=float), np.asarray(baseline, dtype=float)
    (n_cur, m_cur), (n_base, m_base) = pools or ((len(cur), point(cur)), (len(base), point(base)))
    out: dict[str, float | int | bool | None] = {
        "paired": paired,
        "n_current": n_cur,
        "n_baseline": n_base,
        "resamples": resamples,
        "seed": seed,
        f"{name}_current": m_cur,
        f"{name}_baseline": m_base,
        "delta": None,
        "ci_low": None,
        "ci_high": None,
        "delta_pct": None,
    }
    if not len(cur) or not len(base):
        return out
    if paired and len(cur) != len(base):
        raise ValueError("paired bootstrap needs equally long samples")
    delta = m_cur - m_base
    out["delta"] = delta
    if m_base:
        out["delta_pct"] = 100.0 * delta / float(m_base)
    rng = np.random.default_rng(seed)
    cur_a, base_a = cur, base
    if not paired:
        out["subsampled"] = max(n_cur, n_base) > BOOTSTRAP_MAX_SAMPLES
        if len(cur_a) > BOOTSTRAP_MAX_SAMPLES:
            cur_a = rng.choice(cur_a, BOOTSTRAP_MAX_SAMPLES, replace=False)
        if len(base_a) > BOOTSTRAP_MAX_SAMPLES:
            base_a = rng.choice(base_a, BOOTSTRAP_MAX_SAMPLES, replace=False)
    # A subsample's statistic differs a little from the whole's: its resampled deltas are moved by that much, so the
    # interval sits around the exact delta rather than around the subsample's.
    shift = delta - (point(cur_a) - point(base_a)) if (len(cur_a), len(base_a)) != (n_cur, n_base) else 0.0
    cur_r, base_r = _Ranked(cur_a), _Ranked(base_a)
    if paired:
        deltas: list[float] = []
        # Chunks keep memory bounded when many prompts pair.
        chunk = max(1, min(resamples, 2_000_000 // len(cur_a)))
        while len(deltas) < resamples:
            k = min(chunk, resamples - len(deltas))
            idx = rng.integers(0, len(cur_a), size=(k, len(cur_a)))
            d = resampled(cur_r, idx) - resampled(base_r, idx)
            deltas.extend((d + shift).tolist() if shift else d.tolist())
    else:
        # Each side on its own: a resample's statistic read from the order statistics it would have, drawn directly
        # (_Ranked.drawn), rather than from n drawn indices partitioned (10,000 per resample and side for ITL).
        d = drawn(cur_r, rng, resamples) - drawn(base_r, rng, resamples)
        deltas = (d + shift).tolist() if shift else d.tolist()
    alpha = (1.0 - confidence) / 2.0
    out["ci_low"] = percentile(deltas, 100.0 * alpha)
    out["ci_high"] = percentile(deltas, 100.0 * (1.0 - alpha))
    return out


def resampled_medians(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """np.median(values[idx], axis=1), same bits: each row's middle ranks found by partitioning small integers."""
    return _Ranked(values).medians(idx)


class _Ranked:
    """A sample sorted once, so that each resample's median is a partition of 4-byte ranks rather than of values."""

    def __init__(self, values: np.ndarray):
        order = np.argsort(values, kind="stable")
        self.ranks = np.empty(len(values), dtype=np.int32 if len(values) < 2**31 else np.int64)
        self.ranks[order] = np.arange(len(values))
        self.ordered = values[order]

    def medians(self, idx: np.ndarray) -> np.ndarray:
        size = idx.shape[1]
        lo, hi = (size - 1) // 2, size // 2
        part = np.partition(self.ranks[idx], [lo, hi] if hi != lo else [lo], axis=1)
        return (self.ordered[part[:, lo]] + self.ordered[part[:, hi]]) / 2  # odd sizes: (x + x) / 2 is x exactly

    def percentiles(self, idx: np.ndarray, q: float) -> np.ndarray:
        """Each row's q-th percentile (type 7, as `percentile`), its two neighbouring ranks found by partitioning."""
        lo, hi, w = rank_of(idx.shape[1], q)
        part = np.partition(self.ranks[idx], [lo, hi] if hi != lo else [lo], axis=1)
        return interpolate(self.ordered[part[:, lo]], self.ordered[part[:, hi]], w)

    def drawn_medians(self, rng: np.random.Generator, k: int) -> np.ndarray:
        """The medians of k resamples (n values drawn with replacement), as `medians` gives them, drawn directly."""
        n = len(self.ordered)
        lo, hi = self._order_statistics(rng, k, (n - 1) // 2, n // 2 != (n - 1) // 2)
        return (self.ordered[lo] + self.ordered[hi]) / 2

    def drawn_percentiles(self, rng: np.random.Generator, k: int, q: float) -> np.ndarray:
        """The q-th percentiles of k resamples, as `percentiles` gives them, drawn directly."""
        lo, hi, w = rank_of(len(self.ordered), q)
        lo_i, hi_i = self._order_statistics(rng, k, lo, hi != lo)
        return interpolate(self.ordered[lo_i], self.ordered[hi_i], w)

    def _order_statistics(self, rng: np.random.Generator, k: int, rank: int, next_too: bool):
        """For k resamples of n indices drawn uniformly with replacement: each one's index at 0-based sorted rank
        `rank` and at rank + 1 (the same index when not next_too).

        An index drawn uniformly is floor(n U), U uniform on [0, 1), and floor keeps the order: a resample's sorted
        indices are floor(n U_(r)) for the order statistics U_(r) of n uniforms. U_(r + 1) (1-based) is Beta(r + 1,
        n - r); the next one lies above it as the least of the n - r - 1 uniforms left above it: U_(r + 1) +
        (1 - U_(r + 1)) Beta(1, n - r - 1). Two draws per resample instead of n, the same distribution exactly."""
        n = len(self.ordered)
        u = rng.beta(rank + 1, n - rank, size=k)
        first = np.minimum((u * n).astype(np.int64), n - 1)
        if not next_too:
            return first, first
        u_next = u + (1 - u) * rng.beta(1, n - rank - 1, size=k)
        return first, np.minimum((u_next * n).astype(np.int64), n - 1)


def bootstrap_median_ci(
    values: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> tuple[float | None, float | None, float | None]:
    """(median, CI low, CI high) of one small sample (e.g. one value per repetition), percentile bootstrap.

    With n values every resampled median is one of them or the mean of two, so the CI never leaves
    [min, max]; with 3 repetitions it is close to that range: a wide CI says "repeat more", not "certain".
    """
    known = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not known:
        return None, None, None
    if len(known) == 1:  # every resample is that one value: no draws (and numpy, 0.05 CPU-s, left unloaded)
        return known[0], known[0], known[0]
    data = np.asarray(known, dtype=float)
    rng = np.random.default_rng(seed)
    medians = resampled_medians(data, rng.integers(0, len(data), size=(resamples, len(data)))).tolist()
    alpha = (1.0 - confidence) / 2.0
    return median(data), percentile(medians, 100.0 * alpha), percentile(medians, 100.0 * (1.0 - alpha))


def bootstrap_ratio_delta(
    current: tuple[Sequence[float], Sequence[float], float],
    baseline: tuple[Sequence[float], Sequence[float], float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> dict[str, float | int | None]:
    """Difference of two ratio estimates, scale x sum(num) / sum(den), with a percentile bootstrap CI.

    Each side is (numerators, denominators, scale), one pair per unit (a request); pairs are resampled
    together within each side. Goodput is such a ratio: a closed loop of N users completes good requests
    at N x sum(good) / sum(request time) (Little's law), an open loop at its arrival rate x their share.
    """
    sides = []
    for num, den, scale in (current, baseline):
        num_a, den_a = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
        if len(num_a) != len(den_a):
            raise ValueError("a ratio needs as many denominators as numerators")
        sides.append((num_a, den_a, float(scale)))

    def estimate(num_a, den_a, scale) -> float | None:
        return scale * float(num_a.sum()) / float(den_a.sum()) if len(num_a) and den_a.sum() > 0 else None

    cur_est, base_est = estimate(*sides[0]), estimate(*sides[1])
    out: dict[str, float | int | None] = {
        "n_current": len(sides[0][0]),
        "n_baseline": len(sides[1][0]),
        "resamples": resamples,
        "seed": seed,
        "current": cur_est,
        "baseline": base_est,
        "delta": None,
        "ci_low": None,
        "ci_high": None,
    }
    if cur_est is None or base_est is None:
        return out
    out["delta"] = cur_est - base_est
    rng = np.random.default_rng(seed)
    boot = []
    for num_a, den_a, scale in sides:
        idx = rng.integers(0, len(num_a), size=(resamples, len(num_a)))
        dens = den_a[idx].sum(axis=1)
        boot.append(scale * num_a[idx].sum(axis=1) / np.where(dens > 0, dens, np.nan))
    deltas = [d for d in (boot[0] - boot[1]).tolist() if math.isfinite(d)]
    alpha = (1.0 - confidence) / 2.0
    out["ci_low"] = percentile(deltas, 100.0 * alpha)
    out["ci_high"] = percentile(deltas, 100.0 * (1.0 - alpha))
    return out
