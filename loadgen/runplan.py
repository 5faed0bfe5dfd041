"""A run's plan, read once from its options, and the phases it is made of: the factory on top of the phase kinds
(loadgen/scenarios.py), the knee's search (loadgen/knee.py) and the schedules (servescope/judgements/arrivals.py).

The options arrive as a namespace (the command line's, Locust's parser for the web UI); RunPlan.from_args reads it
into a frozen, typed plan once, at that boundary, and nothing below takes the namespace. The workers get the plan
as JSON (RunPlan.to_json / from_json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loadgen.knee import KneeOptions, KneeSearch
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
from loadgen.targets import default_url
from servescope.contracts.runcontract import MAX_RUN_S
from servescope.contracts.settings import LoadSettings
from servescope.judgements import arrivals, slo
from servescope.workloads import prompts as prompt_sets
from servescope.workloads.base import PromptSetError


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
    steps: tuple[int, ...] | None = _typed(lambda text: tuple(parse_levels(text, "--steps")))
    concurrencies: tuple[int, ...] | None = _typed(lambda text: tuple(parse_levels(text, "--concurrencies")))
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


# The manifest's flags are the options as given but for these (the targets say the engines and models).
_NOT_FLAGS = ("engine", "model", "quiet")


@dataclass(frozen=True)
class RunPlan:
    """One run as its options asked for it, typed: the engines, the prompt set, the load's shape, the trials, the SLOs,
    where the run folder goes. Built once, by from_args, where the options are parsed."""

    command: str  # the scenario (`compare`, `burst`, ... `knee`)
    engines: tuple[str, ...]  # NAME=URL, as --engine gave them
    models: tuple[str, ...]  # --model NAME or NAME=MODEL
    prompts: str  # the prompt set's spec (a fresh set with this run's seed written in)
    max_tokens: int | None
    temperature: float | None
    request_timeout: float | None
    think_time: float | None
    ignore_eos: bool
    http_client: str
    shape: LoadShape
    slo: str | None  # as given (the manifest's flags); `spec` is what the run is judged by
    slo_attainment: float | None
    spec: slo.SloSpec
    settings: LoadSettings  # the knobs below the options, read with them
    results: str | None
    run_id: str | None
    quiet: bool
    metrics_port: int
    metrics_linger: float
    workers: int
    warmup: int
    repetitions: int
    max_repetitions: int
    noise_retries: int
    settle_max_s: float
    isolate: str
    grafana_url: str
    no_sequential_four: bool
    options: tuple[tuple[str, Any], ...]  # every option as given (prompts as above): the manifest's and the wire's

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, host: str | None = None, fresh_prompts: bool = True) -> RunPlan:
        """The plan of a namespace of the options table: the command line's, or Locust's (`scenario` for the command,
        one `engine` name whose URL is `host`, the web UI's form fields as text)."""
        given = dict(vars(args))
        settings = LoadSettings.from_env()
        engine = given.get("engine")
        if isinstance(engine, str):  # Locust's parser: one engine, at the Host the form or --host gave
            engine = [f"{engine}={host or given.get('engine_url') or default_url(engine, settings.knobs)}"]
        model = given.get("model")
        shape = LoadShape.from_options(args)
        levels = {"ramp": "steps", "sweep": "concurrencies"}.get(given.get("command") or given.get("scenario"))
        if levels and getattr(shape, levels) is None:  # the knob left empty: the flag's own one line
            parse_levels(None, f"--{levels}")
        if fresh_prompts and given.get("prompts") is not None:
            given["prompts"] = prompt_sets.for_this_run(given["prompts"])  # a fresh set: this run's own prompts
        return cls(
            command=given.get("command") or given.get("scenario"),
            engines=tuple(engine or ()),
            models=((model,) if model else ()) if isinstance(model, str) else tuple(model or ()),
            prompts=given.get("prompts"),
            max_tokens=given.get("max_tokens"),
            temperature=given.get("temperature"),
            request_timeout=given.get("request_timeout"),
            think_time=given.get("think_time"),
            ignore_eos=not given.get("no_ignore_eos"),
            http_client=given.get("http_client"),
            shape=shape,
            slo=given.get("slo"),
            slo_attainment=given.get("slo_attainment"),
            spec=spec_of(args),
            settings=settings,
            results=given.get("results"),
            run_id=given.get("run_id"),
            quiet=bool(given.get("quiet")),
            metrics_port=given.get("metrics_port", 0),
            metrics_linger=given.get("metrics_linger", 0),
            workers=given.get("workers", 0),
            warmup=given.get("warmup", 0),
            repetitions=given.get("repetitions", 1),
            max_repetitions=given.get("max_repetitions", 1),
            noise_retries=given.get("noise_retries", 0),
            settle_max_s=given.get("settle_max_s", 0),
            isolate=given.get("isolate", "off"),
            grafana_url=given.get("grafana_url", ""),
            no_sequential_four=bool(given.get("no_sequential_four")),
            options=tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in given.items()),
        )

    def option(self, name: str) -> Any:
        """One option as it was given (None: not an option of this command)."""
        return dict(self.options).get(name)

    def flags(self) -> dict[str, Any]:
        """The options as the manifest records them."""
        flags = {k: list(v) if isinstance(v, tuple) else v for k, v in self.options if k not in _NOT_FLAGS}
        flags["ignore_eos"] = self.ignore_eos
        return flags

    def to_json(self) -> str:
        """The plan as the workers receive it: its options, from which from_json builds the same plan."""
        return json.dumps({"options": {k: list(v) if isinstance(v, tuple) else v for k, v in self.options}})

    @classmethod
    def from_json(cls, text: str, *, engines: list[str] | None = None) -> RunPlan:
        """The plan to_json wrote; `engines` (a worker's, credentials included) instead of the ones written."""
        options = json.loads(text)["options"]
        if engines:
            options["engine"] = list(engines)
        return cls.from_args(argparse.Namespace(**options), fresh_prompts=False)


def spec_of(options: Any) -> slo.SloSpec:
    """The SLOs a run is judged by: --slo and --slo-attainment as given (their defaults are the SLO knobs), else the
    threshold table's. SloError (one line) for a spec that cannot be used."""
    return slo.resolve(getattr(options, "slo", None), getattr(options, "slo_attainment", None))


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


def build_phases(scenario: str, settings: Settings, plan: RunPlan) -> list[Phase]:
    """The phases of one scenario for one engine, as the plan shapes them (the knee: under the plan's SLOs)."""
    shape = plan.shape
    if scenario == "sequential":
        return [SequentialPhase(settings, repeat=shape.repeat)]
    if scenario == "burst":
        return [BurstPhase(settings, size=shape.burst_size, rounds=shape.bursts, pause_s=shape.burst_pause)]
    duration, requests = shape.duration, shape.requests
    if scenario == "replay":
        return [replay_phase(settings, shape.speed, duration, requests)]  # a trace ends by itself
    if duration is None and requests is None:
        duration = plan.settings.duration_s
    if scenario == "ramp":
        return closed_loop_steps(settings, list(shape.steps), duration, requests, "ramp")
    if scenario == "sweep":
        return closed_loop_steps(settings, list(shape.concurrencies), duration, requests, "sweep")
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
        wait_s = plan.settings.fault_wait_s
        search = KneeSearch(settings, shape.knee, plan.spec, duration, requests, fault_wait_s=wait_s)
        return [search.first()]
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
