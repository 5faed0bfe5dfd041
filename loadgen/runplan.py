"""The phases a run is made of, built from the run's options: the factory on top of the phase kinds
(loadgen/scenarios.py), the knee's search (loadgen/knee.py) and the schedules (servescope/arrivals.py)."""

from __future__ import annotations

import math

from loadgen.knee import KneeSearch
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


def build_phases(scenario: str, settings: Settings, options) -> list[Phase]:
    """The phases of one scenario for one engine, from CLI/web-UI options (loadgen.options: the same names in both)."""
    if scenario == "sequential":
        return [SequentialPhase(settings, repeat=int(options.repeat))]
    if scenario == "burst":
        return [
            BurstPhase(
                settings, size=int(options.burst_size), rounds=int(options.bursts), pause_s=float(options.burst_pause)
            )
        ]
    # The web UI hands back an empty field as "": no bound of that kind.
    duration = float(options.duration) if options.duration not in (None, "") else None
    requests = int(options.requests) if options.requests not in (None, "") else None
    if scenario == "replay":
        return [replay_phase(settings, float(options.speed), duration, requests)]  # a trace ends by itself
    if duration is None and requests is None:
        duration = float(knobs.get("LOADGEN_DURATION"))
    if scenario == "ramp":
        return closed_loop_steps(settings, parse_levels(options.steps, "--steps"), duration, requests, "ramp")
    if scenario == "sweep":
        return closed_loop_steps(
            settings, parse_levels(options.concurrencies, "--concurrencies"), duration, requests, "sweep"
        )
    if scenario == "rate":
        return [
            RatePhase(
                settings,
                rate_schedule(float(options.rate), options.arrivals),
                duration_s=duration,
                requests=requests,
                max_in_flight=int(options.max_in_flight),
            )
        ]
    if scenario == "knee":
        return [KneeSearch(settings, options, duration, requests).first()]
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
