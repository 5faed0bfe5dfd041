"""The engine's speed as its own knee saw it move: each measurement's time per output token and prefill against its
level's, the host's noise beside them, and the band (10th to 90th percentile) the plan predicts over.

Why measurements of one level: a knee measures the levels around its answer more than once (LOADGEN_KNEE_REPEATS),
minutes apart, with the same load; what differs between them is the engine's speed (the machine, its neighbours),
not the queueing. A level measured once says nothing of it (its ratio to itself is 1), and levels differ by their load
as much as by speed, so neither is counted. A knee with no level measured twice has no measured spread: the plan
then predicts at the knee's speed alone and says so (PLAN_SLOWER sets a spread by hand).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from servescope.contracts.runfolder import RequestRecord
from servescope.host import hostnoise
from servescope.judgements import slo
from servescope.report import workloads

LOW_PCT, HIGH_PCT = 10, 90  # the band's fast and slow edges, percentiles of the measurements' speed
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
            f"speed spread: {span} ({LOW_PCT}th-{HIGH_PCT}th percentile of {len(self.measurements)} measurements of "
            f"{levels} level(s) the knee measured more than once)"
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
    known = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.median(known)) if known else None


def _prefill_s(record: RequestRecord, engine_timed: bool) -> float | None:
    if engine_timed:
        ms = workloads.engine_prefill_ms(record)
        return None if ms is None else ms / 1000
    return None if record.ttft_s is None else record.ttft_s + slo.schedule_lag(record)


def measurements(level: float, phases: Sequence[tuple[str, list[RequestRecord], dict | None]]) -> list[Measurement]:
    """Each measurement of one level (phase name, its records, its host noise) against the level pooled: [] for a
    level measured once, or whose requests all failed."""
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


def of(found: Sequence[Measurement]) -> Spread:
    """The band over the measurements' speeds: their 10th and 90th percentiles, prefill and time per token apart (on a
    shared machine they do not move together), each widened to hold the knee's own speed. Where a knee measured only
    one of them (one-token answers: no time per token), the other's spread stands for it."""
    tpot = [m.tpot for m in found if m.tpot is not None]
    prefill = [m.prefill for m in found if m.prefill is not None]
    if len(tpot) < 2 and len(prefill) < 2:
        return none("no level of the knee measured twice")
    tpot = tpot if len(tpot) >= 2 else prefill
    prefill = prefill if len(prefill) >= 2 else tpot

    def edges(ratios: list[float]) -> tuple[float, float]:
        low, high = np.percentile(ratios, [LOW_PCT, HIGH_PCT])
        return min(float(low), 1.0), max(float(high), 1.0)

    (tf, ts), (pf, ps) = edges(tpot), edges(prefill)
    return Spread(Edge(pf, tf), Edge(ps, ts), MEASURED, tuple(found))
