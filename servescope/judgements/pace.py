"""The pace an engine ran at in one measurement, and whether repeated measurements of one load agree on it.

A knee measures the loads around its answer more than once, minutes apart; what differs between those measurements is
the engine's speed, not the queueing. On this project's VMs a measurement now and then catches the engine in a
transient slowdown the host's noise rule cannot see (no other program's CPU, no steal: the engine's own share ran
slower): in two of four quiet plan checks one of the knee's two lowest-level measurements ran 9% slower than the other
and than the rows measured after it (docs/plan.md, passes F and G). Pooled, such a measurement moves the speed a plan
predicts at by half its slowdown, and near saturation a few percent of speed is many points of attainment. So two
measurements that disagree get a third (loadgen/knee.py), and a measurement the others outvote stands out of the
replica the plan models (servescope/report/plan.py), though not out of the speed spread it predicts over.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from servescope.contracts.runfolder import RequestRecord
from servescope.judgements import slo

# Two measurements of one load agree on pace when the slower is at most this much slower. Why a twentieth: in four
# quiet checks measurements that caught no transient were 0.4-4.0% apart (time per token) and those that caught one
# 8.8-9.0% (a fifth, pass H, 6-12%: a drift, no two agreeing, nothing outvoted); and near saturation 4% of speed moved
# the plan's attainment 9-17 points (issue 41), so a smaller gap is noise the band carries and a larger one a
# measurement the plan should not pool.
AGREE = 0.05


def pace(values: Iterable[float | None]) -> float | None:
    """The pace a set of requests' times says an engine runs at, to scale a measured profile to: their mean (None
    where none is known). A queue's capacity is one over its mean service time, so a speed that sets a prediction's
    queueing is a mean: a median leaves out the slow tail that a busy replica's queue still waits through (replayed
    over three quiet 180-s checks, the rows' E2E p50 error at their own speed was 1.4 / 3.1 / 6.9% with medians and
    1.4 / 1.9 / 3.5% with means: docs/plan.md)."""
    known = known_values(values)
    return statistics.fmean(known) if known else None


def known_values(values: Iterable[float | None]) -> list[float]:
    """The values that are numbers: None, NaN and infinities left out."""
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def of_records(records: Iterable[RequestRecord]) -> float | None:
    """One measurement's pace: the mean time per output token of its successful requests (None: no request answered
    two tokens, so no time per token to compare)."""
    return pace(slo.tpot(r) for r in records if r.ok)


def agree(a: float, b: float) -> bool:
    """Two paces of one load within AGREE of each other."""
    return max(a, b) <= min(a, b) * (1 + AGREE)


def outvoted(paces: Sequence[float | None]) -> set[int]:
    """The measurements (indices into `paces`) that agree with no other while two others agree with each other:
    a transient the rest outvote. Empty where nothing stands out (fewer than three known, or no two agree: then the
    engine's speed moved and every measurement is as good as another). A pace that is not a time (None, 0 or less)
    is neither compared nor outvoted."""
    agrees = _agreements(paces)
    if not any(agrees.values()):
        return set()
    return {i for i, others in agrees.items() if not others}


def owed(paces: Sequence[float | None]) -> bool:
    """One more measurement is owed: at least two paces are times (above 0) and no two of them agree."""
    agrees = _agreements(paces)
    return len(agrees) >= 2 and not any(agrees.values())


def _agreements(paces: Sequence[float | None]) -> dict[int, set[int]]:
    """For each pace that is a time, the indices of the other paces it agrees with."""
    known = [i for i, p in enumerate(paces) if _comparable(p)]
    return {i: {j for j in known if j != i and agree(paces[i], paces[j])} for i in known}


def _comparable(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0
