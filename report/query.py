"""What the report asks the run's analytic engine: per-request columns, and pooled gaps in bounded memory.

Per-request columns (a 1 M-request run is 8 MB a column) come back as numpy arrays and are computed on exactly as
lists were. A pool of every inter-token gap (256 M values for 1 M requests) is never fetched whole past
FETCH_WHOLE values: its percentiles are exact order statistics found by selection in the engine (a sample sets a
bracket around each wanted rank, one pass counts what lies below and inside it, only the inside is fetched), and
the plots and the bootstrap get seeded uniform samples drawn in the engine.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from report import stats

# The report's order of requests: as sent, ties by arrival within a burst, then as written.
ORDER = "started_at, coalesce(arrival_index, 0), line_no"
FETCH_WHOLE = 2_000_000  # a pool up to this many values (16 MB) is fetched and computed on like a list
FETCH_BRACKET = 4_000_000  # the most values one step of the selection brings back (32 MB)
SAMPLE_VALUES = 1_000_000  # the sample that places the brackets (its size only sets the speed, never the result)
SPLIT = 4096  # a bracket still too full is split into this many equal-width buckets, and the search goes on
SEED = stats.BOOTSTRAP_SEED


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
        n, total, low, high = con.execute(
            f"SELECT count(v), fsum(v), min(v), max(v) FROM ({self.source})", self.params
        ).fetchone()
        self.n = int(n)
        self._whole: np.ndarray | None = None  # sorted, when the pool is small enough to hold
        if self.n <= FETCH_WHOLE:
            self._whole = np.sort(self.in_order())
            self.total = math.fsum(self._whole.tolist())
        else:
            self.total = float(total)  # compensated (Kahan-Babuska) sum: the mean to within rounding
        self.min, self.max = (low, high) if self.n else (None, None)
        self._known: dict[int, float] = {}

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

    def sample(self, k: int, seed: int = SEED) -> np.ndarray:
        """k values drawn uniformly without replacement, the same on every run (all of them when n <= k)."""
        if self.n <= k:
            return self.in_order() if self.n <= FETCH_WHOLE else self._fetch("TRUE")
        return self._fetch("TRUE", limit=k, seed=seed)

    def outside(self, low: float, high: float, k: int, seed: int = SEED) -> np.ndarray:
        """Values below low or above high (a box plot's fliers): all when there are few, else a seeded sample of k."""
        if self._whole is not None:
            data = self._whole
            return data[(data < low) | (data > high)]
        return self._fetch(f"v < {low!r} OR v > {high!r}", limit=k, seed=seed)

    def _fetch(self, condition: str, limit: int | None = None, seed: int = SEED) -> np.ndarray:
        if limit is None:
            sql = f"SELECT v FROM ({self.source}) WHERE {condition}"
        else:
            # Seeded hash order of (request, position): a uniform sample without replacement, in one pass.
            sql = (
                f"SELECT v FROM (SELECT unnest(itl_s) AS v, generate_subscripts(itl_s, 1) AS i, line_no "
                f"FROM requests WHERE {self.where}) WHERE {condition} ORDER BY hash(line_no, i, {int(seed)}) "
                f"LIMIT {int(limit)}"
            )
        return np.asarray(self.con.execute(sql, self.params).fetchnumpy()["v"], dtype=float)

    # ------------------------------------------------------------ exact selection in bounded memory

    def select(self, ranks: Iterable[int]) -> None:
        """Find the values at these 0-based ranks of the sorted pool, exactly, fetching a few brackets at most."""
        wanted = sorted({r for r in ranks if r not in self._known and 0 <= r < self.n})
        if self._whole is not None or not wanted:
            return
        sample = np.sort(self._sample_for_brackets())
        widen = 1.0
        while wanted:
            brackets = self._brackets(wanted, sample, widen)
            counts = self._region_counts([b[:2] for b in brackets])
            missed = []
            for j, (low, high, targets) in enumerate(brackets):
                below, inside = sum(counts[: 2 * j + 1]), counts[2 * j + 1]
                hit = [r for r in targets if below <= r < below + inside]
                missed += [r for r in targets if r not in hit]
                if hit:
                    self._resolve(f"v BETWEEN {_sql_float(low)} AND {_sql_float(high)}", below, inside, hit)
            wanted = missed  # the sample misplaced a bracket: widen it and count again
            widen *= 8

    def _sample_for_brackets(self) -> np.ndarray:
        """Every gap of about one request in k (by a hash of the line): cheap, and enough to aim the brackets."""
        rows = self.con.execute(f"SELECT count(*) FROM requests WHERE {self.where}", self.params).fetchone()[0]
        every = max(1, round(self.n / SAMPLE_VALUES))
        sql = f"SELECT unnest(itl_s) AS v FROM requests WHERE ({self.where}) AND hash(line_no) % {every} = 0"
        data = np.asarray(self.con.execute(sql, self.params).fetchnumpy()["v"], dtype=float)
        return data if len(data) or not rows else self._fetch("TRUE", limit=SAMPLE_VALUES)

    def _brackets(self, ranks: list[int], sample: np.ndarray, widen: float) -> list[tuple[float, float, list[int]]]:
        """Disjoint value ranges, each expected to hold some of the ranks, with a margin of many standard errors."""
        m = len(sample)
        spans = []
        for r in ranks:
            p = r / max(1, self.n - 1)
            margin = widen * (6 * math.sqrt(m * p * (1 - p)) + 0.002 * m + 16)
            lo_i, hi_i = math.floor(p * (m - 1) - margin), math.ceil(p * (m - 1) + margin)
            low = float(sample[lo_i]) if m and lo_i > 0 else -math.inf
            high = float(sample[hi_i]) if m and hi_i < m - 1 else math.inf
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

    def _region_counts(self, brackets: list[tuple[float, float]]) -> list[int]:
        """Counts of values below the first bracket, in it, between it and the next, ... (2k + 1 regions)."""
        cases = []
        for j, (low, high) in enumerate(brackets):
            cases.append(f"WHEN v < {_sql_float(low)} THEN {2 * j}")
            cases.append(f"WHEN v <= {_sql_float(high)} THEN {2 * j + 1}")
        sql = (
            f"SELECT region, count(*) FROM (SELECT CASE {' '.join(cases)} ELSE {2 * len(brackets)} END AS region "
            f"FROM ({self.source})) GROUP BY region"
        )
        found = dict(self.con.execute(sql, self.params).fetchall())
        return [int(found.get(i, 0)) for i in range(2 * len(brackets) + 1)]

    def _resolve(self, condition: str, below: int, inside: int, ranks: list[int], depth: int = 0) -> None:
        """The values at ranks, all of which lie among the `inside` values meeting condition (`below` lie under)."""
        if inside <= FETCH_BRACKET or depth >= 8:
            values = np.sort(self._fetch(condition))
            for r in ranks:
                self._known[r] = float(values[r - below])
            return
        low, high = self.con.execute(
            f"SELECT min(v), max(v) FROM ({self.source}) WHERE {condition}", self.params
        ).fetchone()
        if low == high:
            for r in ranks:
                self._known[r] = float(low)
            return
        # Equal-width buckets; the bucket of a value only grows with the value (IEEE arithmetic is monotone), so
        # counts of lower buckets are counts of smaller values.
        key = f"least(floor((v - {low!r}) * {SPLIT / (high - low)!r}), {SPLIT - 1})::INTEGER"
        hist = self.con.execute(
            f"SELECT {key} AS b, count(*) FROM ({self.source}) WHERE {condition} GROUP BY b ORDER BY b", self.params
        ).fetchall()
        start = below
        for b, count in hist:
            inner = [r for r in ranks if start <= r < start + count]
            if inner:
                self._resolve(f"({condition}) AND {key} = {b}", start, count, inner, depth + 1)
            start += count


def _sql_float(value: float) -> str:
    return "'inf'::DOUBLE" if value == math.inf else "'-inf'::DOUBLE" if value == -math.inf else repr(value)
