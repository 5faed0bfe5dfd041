"""What the report asks the run's analytic engine: per-request columns, and pooled gaps in bounded memory.

Per-request columns (a 1 M-request run is 8 MB a column) come back as numpy arrays and are computed on exactly as
lists were. A pool of every inter-token gap (256 M values for 1 M requests) is never fetched whole past
FETCH_WHOLE values: its percentiles are exact order statistics found by selection in the engine (an even sample
sets a narrow bracket around each wanted rank; one pass counts what lies below, on and inside each bracket and
fetches only the inside), and the plots and the bootstrap get an even sample of it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from report import stats
from servescope import runreader

# The report's order of requests: as sent, ties by arrival within a burst, then as written.
ORDER = "started_at, coalesce(arrival_index, 0), line_no"
FETCH_WHOLE = 2_000_000  # a pool up to this many values (16 MB) is fetched and computed on like a list
# The even sample that places the brackets: its size sets how much each pass fetches (about 12 / sqrt of it of the
# pool per bracket), never the result.
SAMPLE_VALUES = 1_000_000


def column(con, expr: str, where: str = "TRUE", params: Sequence[Any] = (), order: bool = True) -> np.ndarray:
    """One per-request expression over the accepted requests, in the report's order; NULL reads as NaN (numbers)."""
    sql = f"SELECT {expr} AS x FROM requests WHERE {where}" + (f" ORDER BY {ORDER}" if order else "")
    data = con.execute(sql, list(params)).fetchnumpy()["x"]
    if isinstance(data, np.ma.MaskedArray):
        data = data.astype(float).filled(np.nan) if data.dtype.kind in "iuf" else data.filled(None)
    return np.asarray(data)


class Pool:
    """Every value of the requests' itl_s lists under one condition, pooled (the ITL distribution)."""

    def __init__(self, con, where: str, params: Sequence[Any] = ()):
        self.con = con
        self.where = where
        self.params = list(params)
        self.source = f"SELECT unnest(itl_s) AS v FROM requests WHERE {where}"
        # Totals from each list's count, sum, min and max (kept beside the list when it was read).
        n, total, low, high = con.execute(
            f"SELECT coalesce(sum(itl_s_n), 0), fsum(itl_s_sum), min(itl_s_min), max(itl_s_max) FROM requests "
            f"WHERE {where}",
            self.params,
        ).fetchone()
        self.n = int(n)
        self._whole: np.ndarray | None = None  # sorted, when the pool is small enough to hold
        if self.n <= FETCH_WHOLE:
            self._whole = np.sort(self.in_order())
            self.total = math.fsum(self._whole.tolist())
        else:
            self.total = float(total)  # compensated (Kahan-Babuska) sum of the lists' sums: to within rounding
        self.min, self.max = (low, high) if self.n else (None, None)
        self._known: dict[int, float] = {}
        self._sample: np.ndarray | None = None

    @property
    def whole(self) -> bool:
        return self._whole is not None

    def in_order(self) -> np.ndarray:
        """Every value in the report's order (requests as sent, each one's gaps in order): small pools only."""
        if self.n > FETCH_WHOLE:
            raise ValueError(f"a pool of {self.n:,} values is not fetched whole")
        rows = self.con.execute(
            f"SELECT unnest(itl_s) AS v FROM (SELECT itl_s FROM requests WHERE {self.where} ORDER BY {ORDER})",
            self.params,
        ).fetchnumpy()["v"]
        return np.asarray(rows, dtype=float)

    def summary(self) -> dict[str, float | int | None]:
        self.select(stats.summary_ranks(self.n))
        return stats.summary_of(self.n, self.at, self.total)

    def at(self, rank: int) -> float:
        if self._whole is not None:
            return float(self._whole[rank])
        if rank not in self._known:
            self.select([rank])
        return self._known[rank]

    def percentile(self, q: float) -> float | None:
        if not self.n:
            return None
        lo, hi, w = stats.rank_of(self.n, q)
        self.select([lo, hi])
        return stats.interpolate(self.at(lo), self.at(hi), w)

    def median(self) -> float | None:
        """statistics.median's convention: the middle value, or the mean of the two middle values."""
        if not self.n:
            return None
        mid = self.n // 2
        if self.n % 2:
            return self.at(mid)
        self.select([mid - 1, mid])
        return (self.at(mid - 1) + self.at(mid)) / 2

    def sample(self, k: int) -> np.ndarray:
        """About k values (never more) spread evenly over the pool; all of them when they are k at most."""
        if self.n <= min(k, FETCH_WHOLE):
            return self.in_order()
        sample = self._even()
        return sample[:: max(1, math.ceil(len(sample) / k))][:k]

    def outside(self, low: float, high: float, k: int) -> np.ndarray:
        """Values below low or above high (a box plot's fliers): all of them in a small pool, else at most k of an
        even sample (an even sample of the pool, kept where it lies outside, is an even sample of the outside)."""
        if self._whole is not None:
            data = self._whole
            return data[(data < low) | (data > high)]
        sample = self._even()
        out = sample[(sample < low) | (sample > high)]
        return out[:: max(1, math.ceil(len(out) / k))]

    def _even(self) -> np.ndarray:
        """The even sample the reader kept beside each list (every 64th gap from an offset moving with the line),
        thinned to about SAMPLE_VALUES by whole requests (a hash of the line), in the order of the lines."""
        if self._sample is None:
            rows = self.n / runreader.LIST_SAMPLE_EVERY
            keep = max(1, round(rows / SAMPLE_VALUES))
            sql = (
                f"SELECT unnest(itl_s_sample) AS v FROM requests WHERE ({self.where}) AND hash(line_no) % {keep} = 0 "
                f"ORDER BY line_no"
            )
            self._sample = np.asarray(self.con.execute(sql, self.params).fetchnumpy()["v"], dtype=float)
        return self._sample

    # ------------------------------------------------------------ exact selection in bounded memory

    def select(self, ranks: Iterable[int]) -> None:
        """Find the values at these 0-based ranks of the sorted pool, exactly, in one pass over the pool (more only
        when the even sample that places the brackets misplaced one)."""
        wanted = sorted({r for r in ranks if r not in self._known and 0 <= r < self.n})
        if self._whole is not None or not wanted:
            return
        sample = np.sort(self._even())
        widen = 1.0
        while wanted:
            wanted = self._select_once(wanted, sample, widen)
            widen *= 8  # a bracket missed its rank: wider ones, counted again

    def _select_once(self, ranks: list[int], sample: np.ndarray, widen: float) -> list[int]:
        """One pass: count the values below, at and inside each bracket and fetch the inside; the missed ranks."""
        brackets = self._brackets(ranks, sample, widen)
        bounds: set[float] = set()
        for low, high, _ in brackets:
            # Ties sit on a bracket's ends, counted and never fetched: (.., low), [low], (low, high), [high].
            bounds |= {float(np.nextafter(low, -np.inf)), low, float(np.nextafter(high, -np.inf)), high}
        inside = " OR ".join(f"(v > {_sql_float(low)} AND v < {_sql_float(high)})" for low, high, _ in brackets)
        counts, values = self.con.execute(
            f"SELECT histogram(v, [{', '.join(map(_sql_float, sorted(bounds)))}]), list(v) FILTER (WHERE {inside}) "
            f"FROM ({self.source})",
            self.params,
        ).fetchone()
        counts = dict(counts)
        values = np.sort(np.asarray(values or [], dtype=float))
        ends = sorted(b for b in counts if b in bounds)  # each key: the values in (the bound before, this bound]
        missed = []
        for low, high, targets in brackets:
            below = sum(counts[b] for b in ends if b < low)
            at_low = counts.get(low, 0)
            between = values[(values > low) & (values < high)]
            at_high = counts.get(high, 0) if high > low else 0
            for r in targets:
                offset = r - below
                if 0 <= offset < at_low:
                    self._known[r] = float(low)
                elif 0 <= offset - at_low < len(between):
                    self._known[r] = float(between[offset - at_low])
                elif 0 <= offset - at_low - len(between) < at_high:
                    self._known[r] = float(high)
                else:
                    missed.append(r)
        return missed

    def _brackets(self, ranks: list[int], sample: np.ndarray, widen: float) -> list[tuple[float, float, list[int]]]:
        """Disjoint value ranges, each expected to hold some of the ranks, with a margin of many standard errors."""
        m = len(sample)
        spans = []
        for r in ranks:
            p = r / max(1, self.n - 1)
            margin = widen * (6 * math.sqrt(m * p * (1 - p)) + 16)
            lo_i, hi_i = math.floor(p * (m - 1) - margin), math.ceil(p * (m - 1) + margin)
            low = float(sample[lo_i]) if m and lo_i > 0 else float(self.min)
            high = float(sample[hi_i]) if m and hi_i < m - 1 else float(self.max)
            spans.append([low, high, [r]])
        spans.sort(key=lambda s: (s[0], s[1]))
        merged: list[list] = []
        for span in spans:
            if merged and span[0] <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], span[1])
                merged[-1][2] += span[2]
            else:
                merged.append(span)
        return [(low, high, targets) for low, high, targets in merged]


def _sql_float(value: float) -> str:
    return "'inf'::DOUBLE" if value == math.inf else "'-inf'::DOUBLE" if value == -math.inf else f"{value!r}::DOUBLE"
