"""What the report asks the run's analytic engine: per-request columns, and pooled gaps in bounded memory.

Per-request columns (a 1 M-request run is 8 MB a column) come back as numpy arrays and are computed on exactly as
lists were. A pool of every inter-token gap (256 M values for 1 M requests) is never fetched whole past
FETCH_WHOLE values: its percentiles are exact order statistics found by selection (an even sample sets a narrow
bracket around each wanted rank; one pass, the engine fetching chunks of values and numpy counting them, counts what
lies below, on and inside each bracket and keeps only the inside), and the plots and the bootstrap get an even
sample of it.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from servescope.contracts import runreader
from servescope.judgements import stats
from servescope.judgements.numpy_on_use import numpy as np

# The report's order of requests: as sent, ties by arrival within a burst (the reader numbers them so: runreader.SEQ).
ORDER = runreader.SEQ
FETCH_WHOLE = 2_000_000  # a pool up to this many values (16 MB) is fetched and computed on like a list
# The even sample that places the brackets: its size sets how much each pass fetches (about 12 / sqrt of it of the
# pool per bracket), never the result.
SAMPLE_VALUES = 1_000_000
CHUNK_VALUES = 2_000_000  # what one fetch of a counting pass holds (16 MB)
CACHE_VALUES = 1 << 17  # what numpy counts at a time (1 MB of doubles)
# A double's sign, exponent and top 8 mantissa bits: buckets 1/256 of an octave wide that order like the values.
BUCKET_SHIFT = 44
_NEGATIVE_ZERO = 1 << (63 - BUCKET_SHIFT)  # -0.0's bits shifted (sign bit only)


def column(con, expr: str, where: str = "TRUE", params: Sequence[Any] = (), order: bool = True) -> np.ndarray:
    """One per-request expression over the accepted requests, in the report's order; NULL reads as NaN (numbers)."""
    sql = f"SELECT {expr} AS x FROM requests WHERE {where}" + (f" ORDER BY {ORDER}" if order else "")
    return plain(con.execute(sql, list(params)).fetchnumpy()["x"])


def plain(data: np.ndarray) -> np.ndarray:
    """A fetched column as a plain array: NULL read as NaN (numbers) or None (anything else).
    DuckDB hands back a masked array only where a NULL came back, and imports numpy.ma itself to make it: asked here
    through sys.modules, a run without a NULL never loads numpy.ma (a fortieth of a short run's CPU)."""
    ma = sys.modules.get("numpy.ma")
    if ma is not None and isinstance(data, ma.MaskedArray):
        if data.dtype.kind in "iuf":
            return data.astype(float).filled(np.nan)
        values = np.asarray(data.data, dtype=object)
        values[ma.getmaskarray(data)] = None  # filled(None) would write numpy's default fill ('?' for text)
        return values
    return np.asarray(data)


class Pool:
    """Every value of the requests' itl_s lists under one condition, pooled (the ITL distribution)."""

    def __init__(self, con, where: str, params: Sequence[Any] = ()):
        self.con = con
        self.where = where
        self.params = list(params)
        self._lock = threading.RLock()  # one query at a time on the pool's cursor (its pass runs on its own thread)
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
        with self._lock:
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
        with self._lock:
            return self._even_locked()

    def _even_locked(self) -> np.ndarray:
        if self._sample is None:
            rows = self.n / runreader.LIST_SAMPLE_EVERY
            keep = max(1, round(rows / SAMPLE_VALUES))
            sql = (
                f"SELECT unnest(itl_s_sample) AS v FROM requests WHERE ({self.where}) AND hash(seq) % {keep} = 0 "
                f"ORDER BY seq"
            )
            self._sample = np.asarray(self.con.execute(sql, self.params).fetchnumpy()["v"], dtype=float)
        return self._sample

    # ------------------------------------------------------------ exact selection in bounded memory

    def select(self, ranks: Iterable[int]) -> None:
        """Find the values at these 0-based ranks of the sorted pool, exactly, in one pass over the pool (more only
        when the even sample that places the brackets misplaced one)."""
        with self._lock:
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
        counts, values = self._count_pass(np.array(sorted(bounds)), brackets)
        values = np.sort(values)
        missed = []
        for low, high, targets in brackets:
            below = sum(c for b, c in counts.items() if b < low)
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

    def _count_pass(self, bounds: np.ndarray, brackets: list) -> tuple[dict[float, int], np.ndarray]:
        """One pass over the pool in chunks of lines: {bound: values in (the bound before, this bound]} and the values
        strictly inside a bracket.

        Most values lie far from every bound: a value's coarse bucket (the top bits of its double, which order like the
        values) says how many bounds lie below it, looked up in a table; only values in a bucket that holds a bound or
        lies inside a bracket are compared one by one. Numpy does this at a few ns a value, where the engine's
        histogram over the bounds plus the brackets' filter cost 90."""
        ends = np.array([e for low, high, _ in brackets for e in (low, high)])  # disjoint, ascending
        # The table spans every bucket a non-negative double can fall in (the contract's range for gaps: a value's
        # bucket is then its bits shifted, and -0.0 lands one past the last, with 0.0's count), else the pool's.
        signed = self.min < 0
        lo_key = int(_bucket(np.array([self.min]))[0]) if signed else 0
        size = int(_bucket(np.array([self.max]))[0]) - lo_key + 1 if signed else _NEGATIVE_ZERO + 1
        bound_keys = _bucket(bounds) - lo_key
        # Per bucket: how many bounds lie below every value in it, or CLOSE for a bucket that holds a bound or lies
        # inside a bracket (its values are compared one by one).
        close = len(bounds) + 1
        table = np.searchsorted(bound_keys, np.arange(size), side="left").astype(np.int32)
        table[np.clip(bound_keys, 0, size - 1)] = close
        for low, high in ends.reshape(-1, 2):
            first, last = np.clip(_bucket(np.array([low, high])) - lo_key, 0, size - 1)
            table[first : last + 1] = close
        if not signed:
            table[_NEGATIVE_ZERO] = table[0]
        counts = np.zeros(close + 1, dtype=np.int64)
        inside = []
        for fetched in self._chunks():
            # In slices small enough for each step's arrays to stay in the CPU's cache: faster than the whole at once.
            for start in range(0, len(fetched), CACHE_VALUES):
                chunk = fetched[start : start + CACHE_VALUES]
                keys = _bucket(chunk) - lo_key if signed else chunk.view(np.uint64) >> BUCKET_SHIFT
                where = table.take(keys)
                counts += np.bincount(where, minlength=close + 1)
                sub = chunk[where == close]
                counts += np.bincount(np.searchsorted(bounds, sub, side="left"), minlength=close + 1)
                j = np.searchsorted(ends, sub, side="right")  # odd: at or past a bracket's low, before its high
                odd = j % 2 == 1
                inside.append(sub[odd][sub[odd] != ends[j[odd] - 1]])
        return dict(zip(bounds.tolist(), counts[: len(bounds)].tolist(), strict=True)), np.concatenate(inside or [[]])

    def _chunks(self) -> Iterator[np.ndarray]:
        """The pool's values, CHUNK_VALUES or so at a time (whole requests, in line order); the engine fetches the next
        chunk while the caller works on this one (both let go of the GIL)."""
        first, last, lines = self.con.execute(
            f"SELECT min(seq), max(seq), count(*) FROM requests WHERE {self.where}", self.params
        ).fetchone()
        if not lines:
            return
        step = max(1, math.ceil((last - first + 1) * CHUNK_VALUES / max(1, self.n)))
        cursor = self.con.cursor()

        def fetch(start: int) -> np.ndarray:
            # The lists as they are stored (one array each), joined here: faster than unnesting them in the engine
            # and converting its column.
            lists = cursor.execute(
                f"SELECT itl_s FROM requests WHERE ({self.where}) AND seq >= {start} AND seq < {start + step}",
                self.params,
            ).fetchnumpy()["itl_s"]
            return np.concatenate([*lists, np.zeros(0)]).astype(float, copy=False)

        with ThreadPoolExecutor(1, thread_name_prefix="chunks") as ahead:
            starts = iter(range(first, last + 1, step))
            pending = ahead.submit(fetch, next(starts))
            for start in starts:
                chunk, pending = pending.result(), ahead.submit(fetch, start)
                yield chunk
            yield pending.result()

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


def _bucket(values: np.ndarray) -> np.ndarray:
    """Each value's coarse bucket: its double's bits as an integer that orders like the values (+0.0 and -0.0 alike),
    shifted down to the top bits."""
    bits = values.view(np.int64) >> BUCKET_SHIFT
    if bits.min() < 0:  # negative numbers (or -0.0)
        bits = values.view(np.int64).copy()
        negative = bits < 0
        bits[negative] ^= 0x7FFF_FFFF_FFFF_FFFF
        bits[values == 0] = 0
        bits >>= BUCKET_SHIFT
    return bits
