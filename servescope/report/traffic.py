"""The traffic a plan is made for: constant or Poisson arrivals, a trace file's, or a real service's rate in Prometheus.

The arrival times are servescope/judgements/arrivals.py's schedules, the ones the load generator's open-loop phases send at.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice, takewhile

from servescope.judgements import arrivals
from servescope.report.replicas import Arrival
from servescope.text import printable

MAX_ARRIVALS = 2_000_000  # what one plan simulates: about a minute per replica count searched at the top


class TrafficError(ValueError):
    """Traffic that cannot be planned for: one line saying why."""


@dataclass(frozen=True)
class Traffic:
    """The arrivals a plan is made for, named as its header says, over the span they cover."""

    name: str  # what the plan's header says it was made for
    arrivals: tuple[Arrival, ...]
    duration_s: float  # the span the traffic covers (cost is for this long)

    @property
    def mean_rate(self) -> float:
        return len(self.arrivals) / self.duration_s if self.duration_s > 0 else 0.0


def constant(rate: float, duration_s: float) -> Traffic:
    _check_rate(rate, duration_s)
    n = int(rate * duration_s)
    at = islice(arrivals.Constant(rate).offsets(), n)
    return Traffic(f"constant {rate:g} req/s for {duration_s:g} s", tuple(Arrival(t) for t in at), duration_s)


def poisson(rate: float, duration_s: float, seed: int = 0) -> Traffic:
    _check_rate(rate, duration_s)
    # Observed from an arbitrary instant: the first arrival after a gap, not at the start as a load phase sends.
    schedule = arrivals.Poisson(rate, seed=_seed(seed), at_start=False)
    at = takewhile(lambda t: t < duration_s, schedule.offsets())
    return Traffic(f"Poisson {rate:g} req/s for {duration_s:g} s", _bounded(at), duration_s)


def trace(arg: str, speed: float = 1.0) -> Traffic:
    """A trace file of the kinds `--prompts trace:` reads (servescope/workloads/trace.py: its parser, its errors), its
    offsets divided by `speed` (the replay's --speed), each request's output length kept."""
    from servescope.workloads import trace as trace_file
    from servescope.workloads.prompts import PromptSetError

    if not speed > 0 or not math.isfinite(speed):
        raise TrafficError(f"--speed {speed:g}: expected a number above 0")
    try:
        loaded = trace_file.load(arg)
    except PromptSetError as exc:
        raise TrafficError(str(exc)) from None
    schedule = loaded.schedule(speed)
    planned = tuple(Arrival(t, p.max_tokens) for t, p in zip(schedule.offsets(), loaded.prompts, strict=True))
    last = planned[-1].at
    # The span: the last arrival plus one mean gap, so a trace of n requests at rate r lasts n / r.
    span = last * len(planned) / (len(planned) - 1) if len(planned) > 1 and last > 0 else max(last, 1.0)
    said = f" at {speed:g}x" if speed != 1 else ""
    return Traffic(f"trace {arg}{said}", planned, span)


def prometheus(url: str, expr: str, since_s: float, step_s: float, seed: int = 0, now: float | None = None) -> Traffic:
    """A real service's request rate over the last `since_s` (a PromQL expression in requests per second, e.g.
    `sum(rate(http_requests_total{job="api"}[5m]))`), as Poisson arrivals at each step's rate. Prometheus is read
    through servescope/prometheus/prometheus_api.py: bounded, redirects kept to its origin, its answer's shape checked."""
    from servescope.prometheus.prometheus_api import Prometheus, PrometheusError

    if not (0 < step_s <= since_s and math.isfinite(since_s)):
        raise TrafficError("--since and --step: seconds above 0, the step no longer than the span")
    client = Prometheus(url)
    end = time.time() if now is None else now
    try:
        result = client.query_range(expr, end - since_s, end, step_s)
    except PrometheusError as exc:
        raise TrafficError(str(exc)) from None
    totals: dict[float, float] = {}
    for series in result:
        for t, value in series["values"]:  # numbers: the answer's shape was checked
            if math.isfinite(value) and value >= 0:
                totals[t] = totals.get(t, 0.0) + value
    said = printable.line(expr, limit=120)
    if not totals:
        raise TrafficError(f"Prometheus at {client.shown}: {said!r} returned no samples over the last {since_s:g} s")
    start = min(totals)
    pieces = [(t - start, t - start + step_s, rate) for t, rate in sorted(totals.items())]
    expected = sum((b - a) * rate for a, b, rate in pieces)
    if not expected <= MAX_ARRIVALS:  # refused before any is drawn (a rate of 1e300 is an answer too)
        raise TrafficError(
            f"{said}: about {expected:.3g} requests over {since_s:g} s, more than {MAX_ARRIVALS:,}: plan a part"
        )
    span = pieces[-1][1]
    planned = _bounded(arrivals.piecewise_poisson(pieces, _seed(seed)))
    return Traffic(f"Prometheus {said} over {since_s:g} s (step {step_s:g} s)", planned, span)


def _check_rate(rate: float, duration_s: float) -> None:
    if not (rate > 0 and math.isfinite(rate)) or not (duration_s > 0 and math.isfinite(duration_s)):
        raise TrafficError("--rate and --duration: numbers above 0")
    if rate * duration_s > MAX_ARRIVALS:
        raise TrafficError(f"{rate:g} req/s for {duration_s:g} s is more than {MAX_ARRIVALS:,} requests: plan a part")


def _seed(seed: int) -> str:
    return f"traffic-{seed}"  # not the load generator's seeds: a plan's arrivals are its own draw


def _bounded(offsets: Iterable[float]) -> tuple[Arrival, ...]:
    """The arrivals at `offsets`, refused past MAX_ARRIVALS (a rate times a span can be any size)."""
    out: list[Arrival] = []
    for t in offsets:
        out.append(Arrival(t))
        if len(out) > MAX_ARRIVALS:
            raise TrafficError(f"more than {MAX_ARRIVALS:,} requests: plan a part")
    return tuple(out)
