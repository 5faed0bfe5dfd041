"""The engine's speed as its own knee saw it move: each measurement's time per output token and prefill against its
level's, the host's noise beside them, and the band the plan predicts over: where a later run's speed should fall.

Why measurements of one level: a knee measures the levels around its answer more than once (LOADGEN_KNEE_REPEATS),
minutes apart, with the same load; what differs between them is the engine's speed (the machine, its neighbours),
not the queueing. A level measured once says nothing of it (its ratio to itself is 1), and levels differ by their load
as much as by speed, so neither is counted. A knee with no level measured twice has no measured spread: the plan
then predicts at the knee's speed alone and says so (PLAN_SLOWER sets a spread by hand).

Why a prediction interval, not the measurements' own percentiles: the plan is for later traffic, and a later run's
speed is one more draw, around a level's speed that the knee itself only estimated from a few draws. The percentiles
of four or six ratios are narrower than that (measured: the knee's repeats spread 1.4-8.8%, the rows run after it
were 0-14% away), and each ratio is taken against its own level's pooled median, which hides part of the spread
(two measurements of a level sit half their difference from their median). So the band is the 10th-90th percentile
of a later measurement under a normal model of the log speed: within-level spread pooled over levels (N - L degrees of
freedom), widened by Student's t for those few degrees and by sqrt(1 + 1/k) for the level's own estimate (k
measurements a level).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from servescope.contracts.runfolder import RequestRecord
from servescope.host import hostnoise
from servescope.judgements import slo, stats
from servescope.judgements.pace import known_values
from servescope.report import workloads

LOW_PCT, HIGH_PCT = 10, 90  # the band's fast and slow edges: percentiles of a later measurement's speed
# Student's t at the 90th percentile by degrees of freedom (the band's edges are the 10th and 90th); beyond 30, the
# normal's 1.2816 is within 2%. Tabled: numpy has no t quantile and one constant table beats a scipy dependency.
T90 = {1: 3.078, 2: 1.886, 3: 1.638, 4: 1.533, 5: 1.476, 6: 1.440, 7: 1.415, 8: 1.397, 9: 1.383, 10: 1.372}
T90_FAR = ((15, 1.341), (20, 1.325), (30, 1.310))
Z90 = 1.2816
MEASURED = "measured"
OVERRIDE = "PLAN_SLOWER"
NONE = "none"


@dataclass(frozen=True)
class Edge:
    """A speed as factors on the knee's latencies: prefill (every TTFT) and time per output token (1: the knee's)."""

    ttft: float
    tpot: float


KNEE_SPEED = Edge(1.0, 1.0)


@dataclass(frozen=True)
class Measurement:
    """One trusted measurement of a level the knee measured more than once."""

    phase: str
    level: float
    tpot: float | None  # its median time per output token over its level's (every measurement of it pooled)
    prefill: float | None  # the same for prefill: the engine's own timing where it times each request, else TTFT
    slowdown: float | None = None  # hostnoise.slowdown_bound: the most other programs' CPU could have stretched it
    load1: float | None = None  # the load average as it ended
    busy: bool = False  # the knee's noise rule (hostnoise.flags) found other programs taking the CPU meanwhile


@dataclass(frozen=True)
class Spread:
    """The speeds a plan predicts over: `fast` and `slow` edges around the knee's own (fast <= 1 <= slow)."""

    fast: Edge
    slow: Edge
    source: str  # MEASURED, OVERRIDE or NONE
    measurements: tuple[Measurement, ...] = ()
    why: str = ""  # where it is a point: why no spread

    @property
    def point(self) -> bool:
        return self.fast == KNEE_SPEED and self.slow == KNEE_SPEED

    def describe(self) -> str:
        """One line: what the band spans and what it rests on."""
        if self.point:
            return f"speed spread: none ({self.why}); attainment at the knee's speed only"
        span = (
            f"time per token x{self.fast.tpot:.3f}-x{self.slow.tpot:.3f}, prefill x{self.fast.ttft:.3f}-"
            f"x{self.slow.ttft:.3f} of the knee's"
        )
        if self.source == OVERRIDE:
            return f"speed spread: {span} (PLAN_SLOWER, set by hand: not measured)"
        levels = len({m.level for m in self.measurements})
        text = (
            f"speed spread: {span} ({LOW_PCT}th-{HIGH_PCT}th percentile of a later run's speed, predicted from "
            f"{len(self.measurements)} measurements of {levels} level(s) the knee measured more than once)"
        )
        slow = [m.slowdown for m in self.measurements if m.slowdown is not None]
        loads = [m.load1 for m in self.measurements if m.load1 is not None]
        host = []
        if slow:
            host.append(f"others' CPU could have stretched them up to x{max(slow):.2f}")
        if loads:
            host.append(f"load average {min(loads):.1f}-{max(loads):.1f}")
        text += f"; host beside them: {', '.join(host)}" if host else "; host noise not recorded"
        busy = sum(m.busy for m in self.measurements)
        if busy:
            # A spread measured while other work came and went is that work's: it bounds neither a quieter host nor a
            # busier one, so the band is no promise there.
            text += (
                f"; {busy} of {len(self.measurements)} measured on a busy host (the knee's noise rule): the band holds "
                "only while the host stays as busy"
            )
        return text

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "fast": {"ttft": self.fast.ttft, "tpot": self.fast.tpot},
            "slow": {"ttft": self.slow.ttft, "tpot": self.slow.tpot},
            "percentiles": [LOW_PCT, HIGH_PCT],
            "measurements": [vars(m) for m in self.measurements],
            "text": self.describe(),
        }


def none(why: str) -> Spread:
    return Spread(KNEE_SPEED, KNEE_SPEED, NONE, why=why)


def override(slower: float) -> Spread:
    """PLAN_SLOWER's spread: every latency `slower` longer at the slow edge, as much shorter (1 / (1 + slower)) at
    the fast one; 0: the knee's speed alone."""
    if slower <= 0:
        return none("PLAN_SLOWER=0")
    return Spread(_both(1 / (1 + slower)), _both(1 + slower), OVERRIDE)


def _both(factor: float) -> Edge:
    return Edge(factor, factor)


def _median(values: Iterable[float | None]) -> float | None:
    return stats.median(known_values(values))  # none known: None


def _prefill_s(record: RequestRecord, engine_timed: bool) -> float | None:
    if engine_timed:
        ms = workloads.engine_prefill_ms(record)
        return None if ms is None else ms / 1000
    return None if record.ttft_s is None else record.ttft_s + slo.schedule_lag(record)


def measurements(level: float, phases: Sequence[tuple[str, list[RequestRecord], dict | None]]) -> list[Measurement]:
    """Each measurement of one level (phase name, its records, its host noise) against the level pooled: [] for a
    level measured once, or whose requests all failed. A ratio of medians, where a profile is scaled to a mean
    (pace.pace): between measurements a stall in one of them is noise, not pace."""
    if len(phases) < 2:
        return []
    ok = [[r for r in records if r.ok] for _, records, _ in phases]
    pooled = [r for rs in ok for r in rs]
    engine_timed = any(workloads.engine_prefill_ms(r) is not None for r in pooled)
    tpot_all = _median(map(slo.tpot, pooled))
    prefill_all = _median(_prefill_s(r, engine_timed) for r in pooled)
    out = []
    for (phase, _, noise), records in zip(phases, ok, strict=True):
        tpot = _median(map(slo.tpot, records))
        prefill = _median(_prefill_s(r, engine_timed) for r in records)
        if tpot is None and prefill is None:
            continue
        load1 = noise.get("load1_end") if isinstance(noise, dict) else None
        out.append(
            Measurement(
                phase,
                level,
                tpot / tpot_all if tpot is not None and tpot_all else None,
                prefill / prefill_all if prefill is not None and prefill_all else None,
                hostnoise.slowdown_bound(noise),
                float(load1) if isinstance(load1, (int, float)) and math.isfinite(load1) else None,
                bool(hostnoise.flags(noise, "the engine")),
            )
        )
    return out if len(out) >= 2 else []


def t90(df: int) -> float:
    """Student's t at its 90th percentile for `df` degrees of freedom (df >= 1)."""
    if df in T90:
        return T90[df]
    for limit, value in T90_FAR:
        if df <= limit:
            return value
    return Z90


def next_run_half_width(sd: float, df: int, k: float) -> float:
    """How far one more run lands from the mean of k measurements, at the 10th or 90th percentile: Student's t for
    `df` degrees of freedom times their spread, widened by sqrt(1 + 1/k) for the mean's own error."""
    return t90(df) * sd * math.sqrt(1 + 1 / k)


def band(ratios: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """The 10th and 90th percentiles of a later measurement's speed ratio, from (level, ratio) pairs: the log ratios'
    spread within their levels, pooled (N - L degrees of freedom), times t and sqrt(1 + 1/k) (module docstring);
    None when no level has two measurements."""
    by_level: dict[float, list[float]] = {}
    for level, ratio in ratios:
        if ratio > 0 and math.isfinite(ratio):
            by_level.setdefault(level, []).append(math.log(ratio))
    repeated = [logs for logs in by_level.values() if len(logs) >= 2]
    n, levels = sum(map(len, repeated)), len(repeated)
    if not repeated:
        return None
    squares = sum(float(np.sum((np.asarray(logs) - np.mean(logs)) ** 2)) for logs in repeated)
    sd = math.sqrt(squares / (n - levels))
    half = next_run_half_width(sd, n - levels, n / levels)  # k = n / levels measurements a level
    return math.exp(-half), math.exp(half)


def of(found: Sequence[Measurement]) -> Spread:
    """The band a later run's speed should fall in (`band`), prefill and time per token apart (on a shared machine
    they do not move together). Where a knee measured only one of them (one-token answers: no time per token), the
    other's spread stands for it."""
    tpot = band([(m.level, m.tpot) for m in found if m.tpot is not None])
    prefill = band([(m.level, m.prefill) for m in found if m.prefill is not None])
    if tpot is None and prefill is None:
        return none("no level of the knee measured twice")
    tpot = tpot or prefill
    prefill = prefill or tpot
    (tf, ts), (pf, ps) = tpot, prefill
    return Spread(Edge(pf, tf), Edge(ps, ts), MEASURED, tuple(found))
