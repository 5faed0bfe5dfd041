"""Open-loop arrival schedules (constant gaps, Poisson, a trace's own times): when each request is due, in seconds from the start.

One rule for the load generator's open-loop phases (loadgen/scenarios.py's RatePhase sends at these offsets) and
the capacity plan's traffic (servescope/report/traffic.py simulates them), so the plan is made for the arrivals a run sends.
A schedule only says when; how many and for how long is its user's bound (a phase's --requests and --duration, a
plan's duration).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import count
from typing import Protocol


class Schedule(Protocol):
    label: str  # what a phase's name says of it: "5rps", "5rps-poisson", "2x"
    length: int | None  # how many arrivals it holds; None: it never ends (a bound ends it)

    def offsets(self) -> Iterator[float]:
        """Each arrival's due time, in seconds from the start, in order."""
        ...

    def describe(self) -> str | None:
        """What a phase's terminal line says of it (None: the phase's own line)."""
        ...


@dataclass(frozen=True)
class _AtRate:
    """An endless schedule of RATE arrivals per second: its phase's bound ends it, its name says the rate."""

    rate: float
    length = None
    named = "rps"  # what its label says after the rate

    def __post_init__(self) -> None:
        _check_rate(self.rate)

    @property
    def label(self) -> str:
        return f"{self.rate:g}{self.named}"

    def describe(self) -> str | None:
        return None


@dataclass(frozen=True)
class Constant(_AtRate):
    """RATE arrivals per second at equal gaps, the first at the start."""

    def offsets(self) -> Iterator[float]:
        # i / rate, not a running sum of 1 / rate: the n-th arrival is where it should be however long the run.
        return (i / self.rate for i in count())


@dataclass(frozen=True)
class Poisson(_AtRate):
    """A Poisson process at RATE per second: exponential gaps drawn from a generator seeded with `seed` (the same seed,
    the same schedule). `at_start`: the first arrival at the start, as a load phase starts with a send; else after
    the first gap, as a process observed from an arbitrary instant."""

    seed: int | str = 0
    at_start: bool = True
    named = "rps-poisson"

    def offsets(self) -> Iterator[float]:
        rng = random.Random(self.seed)
        if self.at_start:
            yield 0.0
        yield from poisson_span(rng, 0.0, math.inf, self.rate)


def poisson_span(rng: random.Random, start: float, end: float, rate: float) -> Iterator[float]:
    """Arrivals of a Poisson process at `rate` from `start` (excluded) until `end`, its gaps drawn from `rng`: a rate
    that changes step by step is one span per step, drawn from one generator."""
    t = start
    while rate > 0:
        t += rng.expovariate(rate)
        if t >= end:
            return
        yield t


def piecewise_poisson(pieces: Iterable[tuple[float, float, float]], seed: int | str = 0) -> Iterator[float]:
    """Arrivals of a Poisson process whose rate is constant on each (start, end, rate) piece."""
    rng = random.Random(seed)
    for start, end, rate in pieces:
        yield from poisson_span(rng, start, end, rate)


@dataclass(frozen=True)
class Trace:
    """A trace's own times (offset_s of each request), played SPEED times faster."""

    offsets_s: tuple[float, ...]
    speed: float = 1.0

    def __post_init__(self) -> None:
        if not self.speed > 0:
            raise ValueError("--speed must be > 0")

    @property
    def label(self) -> str:
        return f"{self.speed:g}x"

    @property
    def length(self) -> int:
        return len(self.offsets_s)

    def offsets(self) -> Iterator[float]:
        return (offset / self.speed for offset in self.offsets_s)

    def describe(self) -> str | None:
        return f"{len(self.offsets_s)} requests at the trace's times"


def _check_rate(rate: float) -> None:
    if not rate > 0:
        raise ValueError("--rate must be > 0")
