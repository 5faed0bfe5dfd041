"""The phases a run is made of, built from the run's options: the factory on top of the phase kinds
(loadgen/scenarios.py), the knee's search (loadgen/knee.py) and the schedules (servescope/arrivals.py).

The options arrive as a namespace (the command line's, Locust's parser for the web UI and the workers); they are
read into a typed LoadShape once, here, and nothing below takes the namespace.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadgen.knee import KneeOptions, KneeSearch
from loadgen.options import MAX_RUN_S
from loadgen.scenarios import (
    SCENARIOS,
    BurstPhase,
    ClosedLoopPhase,
    Phase,
    RatePhase,
    SequentialPhase,
    Settings,
    parse_levels,
)
from loadgen.workloads.base import PromptSetError
from servescope import arrivals, knobs


def _typed(convert: Callable[[Any], Any]) -> Any:
    """A LoadShape field read from the options with `convert`."""
    return dataclasses.field(default=None, metadata={"type": convert})


@dataclass(frozen=True)
class LoadShape:
    """What the phases of one scenario are: the options table's values for them, typed (None: not given, or a
    field the web UI's form left empty)."""

    repeat: int | None = _typed(int)
    burst_size: int | None = _typed(int)
    bursts: int | None = _typed(int)
    burst_pause: float | None = _typed(float)
    duration: float | None = _typed(float)
    requests: int | None = _typed(int)
    steps: str | None = _typed(str)
    concurrencies: str | None = _typed(str)
    rate: float | None = _typed(float)
    arrivals: str | None = _typed(str)
    max_in_flight: int | None = _typed(int)
    speed: float | None = _typed(float)
    knee: KneeOptions | None = None

    @classmethod
    def from_options(cls, options: Any) -> LoadShape:
        """From a namespace of the options table (loadgen/options.py): the same names on every path."""
        values = {f.name: read(options, f.name, f.metadata["type"]) for f in dataclasses.fields(cls) if f.metadata}
        return cls(**values, knee=KneeOptions.from_options(options) if hasattr(options, "over") else None)


def read(options: Any, name: str, convert: Callable[[Any], Any]) -> Any:
    """One option's value from a namespace of the options table, typed; None when absent or left empty ("")."""
    value = getattr(options, name, None)
    return None if value in (None, "") else convert(value)


def closed_loop_steps(
    settings: Settings, levels: list[int], hold_s: float | None, requests_per_level: int | None, scenario: str
) -> list[Phase]:
    name = (lambda n: f"ramp-{n}users") if scenario == "ramp" else (lambda n: f"sweep-c{n}")
    # `requests_per_level` counts per user, so every level sees the same work per user.
    return [
        ClosedLoopPhase(
            settings, name(n), n, hold_s, None if requests_per_level is None else requests_per_level * n, scenario
        )
        for n in levels
    ]


def build_phases(scenario: str, settings: Settings, shape: LoadShape) -> list[Phase]:
    """The phases of one scenario for one engine."""
    if scenario == "sequential":
        return [SequentialPhase(settings, repeat=shape.repeat)]
    if scenario == "burst":
        return [BurstPhase(settings, size=shape.burst_size, rounds=shape.bursts, pause_s=shape.burst_pause)]
    duration, requests = shape.duration, shape.requests
    if scenario == "replay":
        return [replay_phase(settings, shape.speed, duration, requests)]  # a trace ends by itself
    if duration is None and requests is None:
        duration = float(knobs.get("LOADGEN_DURATION"))
    if scenario == "ramp":
        return closed_loop_steps(settings, parse_levels(shape.steps, "--steps"), duration, requests, "ramp")
    if scenario == "sweep":
        return closed_loop_steps(
            settings, parse_levels(shape.concurrencies, "--concurrencies"), duration, requests, "sweep"
        )
    if scenario == "rate":
        return [
            RatePhase(
                settings,
                rate_schedule(shape.rate, shape.arrivals),
                duration_s=duration,
                requests=requests,
                max_in_flight=shape.max_in_flight,
            )
        ]
    if scenario == "knee":
        return [KneeSearch(settings, shape.knee, duration, requests).first()]
    raise ValueError(f"unknown scenario {scenario!r}: expected one of {', '.join(SCENARIOS)}")


def rate_schedule(rate: float, kind: str) -> arrivals.Schedule:
    """--rate RATE --arrivals constant|poisson."""
    return arrivals.Poisson(rate) if kind == "poisson" else arrivals.Constant(rate)


def replay_phase(settings: Settings, speed: float, duration: float | None, requests: int | None) -> RatePhase:
    """The `replay` scenario's one phase: the trace's requests at their own times, SPEED times faster."""
    schedule = settings.prompt_set.schedule(speed)
    offsets = schedule.offsets_s[:requests] if requests is not None else schedule.offsets_s
    span = offsets[-1] / speed if offsets and speed > 0 else 0.0
    if min(span, duration if duration is not None else math.inf) > MAX_RUN_S:
        # A replay that outlasts any run (a speed of 1e-300) would never end: say so now, not after a week.
        raise PromptSetError(
            f"replay at --speed {speed}: the trace's {offsets[-1]:g} s would take {span:.4g} s, more "
            f"than a run can last ({MAX_RUN_S:g} s): raise --speed or give --duration"
        )
    return RatePhase(settings, schedule, duration_s=duration, requests=requests, scenario="replay")
