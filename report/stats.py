"""Percentiles, summaries and seeded bootstrap confidence intervals on medians, computed from raw samples."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np

QUANTILES = (50, 90, 95, 99)
PERCENTILE_METHOD = "linear interpolation between closest ranks (numpy's default, Hyndman-Fan type 7)"
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261130
CONFIDENCE = 0.95
# Pooled ITL can hold hundreds of thousands of gaps: resampling all of them 2000 times would take
# minutes. Above this size each side is subsampled once (seeded) first, which only widens the CI.
BOOTSTRAP_MAX_SAMPLES = 20_000


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), type 7: rank h = (n-1)·q/100, interpolated between floor and ceil."""
    data = sorted(values)
    if not data:
        return None
    h = (len(data) - 1) * q / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (h - lo) * (data[hi] - data[lo])


def summary(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, p50/p90/p95/p99, mean, min, max of one sample set; None where there are no samples."""
    data = [float(v) for v in values if v is not None and math.isfinite(v)]
    out: dict[str, float | int | None] = {"n": len(data)}
    for q in QUANTILES:
        out[f"p{q}"] = percentile(data, q)
    out["mean"] = statistics.fmean(data) if data else None
    out["min"] = min(data) if data else None
    out["max"] = max(data) if data else None
    return out


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def bootstrap_median_delta(
    current: Sequence[float],
    baseline: Sequence[float],
    *,
    paired: bool,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> dict[str, float | int | bool | None]:
    """median(current) - median(baseline) with a percentile bootstrap CI.

    Paired: current[i] and baseline[i] are the same prompt; whole pairs are resampled so the
    prompt-to-prompt spread cancels. Unpaired: each side is resampled on its own.
    """
    cur, base = list(current), list(baseline)
    out: dict[str, float | int | bool | None] = {
        "paired": paired,
        "n_current": len(cur),
        "n_baseline": len(base),
        "resamples": resamples,
        "seed": seed,
        "median_current": median(cur),
        "median_baseline": median(base),
        "delta": None,
        "ci_low": None,
        "ci_high": None,
        "delta_pct": None,
    }
    if not cur or not base:
        return out
    if paired and len(cur) != len(base):
        raise ValueError("paired bootstrap needs equally long samples")
    delta = statistics.median(cur) - statistics.median(base)
    out["delta"] = delta
    if out["median_baseline"]:
        out["delta_pct"] = 100.0 * delta / float(out["median_baseline"])
    rng = np.random.default_rng(seed)
    cur_a, base_a = np.asarray(cur, dtype=float), np.asarray(base, dtype=float)
    if not paired:
        out["subsampled"] = len(cur) > BOOTSTRAP_MAX_SAMPLES or len(base) > BOOTSTRAP_MAX_SAMPLES
        if len(cur_a) > BOOTSTRAP_MAX_SAMPLES:
            cur_a = rng.choice(cur_a, BOOTSTRAP_MAX_SAMPLES, replace=False)
        if len(base_a) > BOOTSTRAP_MAX_SAMPLES:
            base_a = rng.choice(base_a, BOOTSTRAP_MAX_SAMPLES, replace=False)
    deltas: list[float] = []
    # Chunks keep memory bounded when ITL pools thousands of gaps per side.
    chunk = max(1, min(resamples, 2_000_000 // max(len(cur_a), len(base_a))))
    while len(deltas) < resamples:
        k = min(chunk, resamples - len(deltas))
        if paired:
            idx = rng.integers(0, len(cur_a), size=(k, len(cur_a)))
            d = np.median(cur_a[idx], axis=1) - np.median(base_a[idx], axis=1)
        else:
            ci = rng.integers(0, len(cur_a), size=(k, len(cur_a)))
            bi = rng.integers(0, len(base_a), size=(k, len(base_a)))
            d = np.median(cur_a[ci], axis=1) - np.median(base_a[bi], axis=1)
        deltas.extend(d.tolist())
    alpha = (1.0 - confidence) / 2.0
    out["ci_low"] = percentile(deltas, 100.0 * alpha)
    out["ci_high"] = percentile(deltas, 100.0 * (1.0 - alpha))
    return out


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
    data = np.asarray([float(v) for v in values if v is not None and math.isfinite(v)], dtype=float)
    if not len(data):
        return None, None, None
    rng = np.random.default_rng(seed)
    medians = np.median(data[rng.integers(0, len(data), size=(resamples, len(data)))], axis=1).tolist()
    alpha = (1.0 - confidence) / 2.0
    return float(np.median(data)), percentile(medians, 100.0 * alpha), percentile(medians, 100.0 * (1.0 - alpha))


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
