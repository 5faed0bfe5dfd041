"""numpy's default percentile (its "linear" method, Hyndman-Fan type 7) in plain Python, bit for bit.

The load generator judges SLO terms at the end of every run: importing numpy for two percentiles was a large share of
a short run's start-up, which `quick`, the knee and the tune loop pay by the dozen."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence


def numpy_percentile_of(n: int, q: float, at: Callable[[int], float]) -> float:
    """np.percentile(values, q) (its "linear" method, bit for bit) from n and the value at any sorted rank."""
    v = (n - 1) * (q / 100)
    lo = math.floor(v)
    if v >= n - 1:
        return at(n - 1)
    a, b, g = at(lo), at(lo + 1), v - lo
    return b - (b - a) * (1 - g) if g >= 0.5 else a + (b - a) * g


def numpy_percentile(values: Sequence[float], q: float) -> float:
    """np.percentile(values, q) of a non-empty sequence."""
    ordered = sorted(values)
    return float(numpy_percentile_of(len(ordered), q, ordered.__getitem__))
