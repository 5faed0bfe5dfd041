"""The `python -m loadgen` command line: its parser, and what a headless command will run (targets, prompt set,
phases) checked before anything touches the network or the disk. Importing it does not import Locust."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from loadgen import client as llm
from loadgen import options, trials
from loadgen.runplan import RunPlan, build_phases
from loadgen.scenarios import BurstPhase, Phase, SequentialPhase, Settings
from loadgen.targets import Target, TargetError, parse_engine
from loadgen.verbs import COMMANDS, QUICK_HELP, WEBUI_HELP
from servescope import workloads
from servescope.contracts.settings import KnobTable
from servescope.contracts.thresholds import NoiseRule, WarmupRule
from servescope.text import command_name
from servescope.workloads import prompts as prompt_sets
from servescope.workloads.prompts import PromptSet


class UsageError(Exception):
    """Bad input from the user: one line on stderr, no traceback."""


# What bad input raises on its way through prepare(): each is one line for the terminal, exit 2.
USAGE_ERRORS = (UsageError, TargetError, prompt_sets.PromptSetError, ValueError)

web_port = options.bounded(int, "a port from 1 to 65535", 1, 65535)


def build_parser(table: KnobTable | None = None, argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The command line, every default a knob: `table`, else the knobs as this process's environment sets them (the
    parser is where they enter). Given the `argv` it will parse, a command's options are added only where it names
    that command: the other commands stay listed by name and help (`--help`), and a run does not build their two
    hundred options (0.014 CPU-s, a fortieth of a 4-request run)."""
    table = KnobTable.from_env() if table is None else table
    named = argv[0] if argv and argv[0] in (*COMMANDS, "webui") else None
    parser = options.ArgumentParser(
        prog=command_name.prog("python -m loadgen"),
        description="The sequential-vs-burst experiment (compare), one command per scenario, and Locust's web UI; "
        "each writes a run folder.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command, text in COMMANDS.items():
        chosen = sub.add_parser(command, help=text)
        if named in (None, command):
            options.add_command_options(chosen, command, table)
    # quick has a parser of its own (loadgen/quick.py): listed here so `python -m loadgen --help` shows it.
    sub.add_parser("quick", add_help=False, help=f"{QUICK_HELP} (`{parser.prog} quick --help`)")
    webui = sub.add_parser("webui", help=WEBUI_HELP)
    if named in (None, "webui"):
        _add_webui_options(webui, table)
    return parser


def _add_webui_options(webui: argparse.ArgumentParser, table: KnobTable) -> None:
    webui.add_argument("--port", type=web_port, default=table["LOCUST_PORT"])
    webui.add_argument("--bind", default=table["SERVESCOPE_BIND"])
    webui.add_argument(
        "--users",
        type=options.users,
        default=table["BURST_SIZE"],
        help="the form's Number of users: the burst size of the burst scenario (default BURST_SIZE: %(default)s)",
    )
    options.add_command_options(webui, "webui", table)


@dataclass
class Plan:
    """A headless command's run, engine after engine, as it will go: nothing probed, nothing written yet."""

    targets: list[Target]
    prompt_set: PromptSet
    phases: list[Phase]
    models: dict[str, str]  # --model: "*" for every engine, else by instance or kind
    knobs: KnobTable  # read with the options: where an engine without a URL is, its model knob

    def model_for(self, target: Target) -> str | None:
        return self.models.get(target.instance) or self.models.get(target.kind) or self.models.get("*")


def prepare(plan: RunPlan) -> Plan:
    """Everything that can be wrong with the input, found before a folder, a socket or a probe exists (but one: an
    `--engine ollama` without a URL asks the stack's proxy port whether servescope's proxy answers there)."""
    if not plan.engines:
        raise UsageError("give at least one --engine NAME=URL (e.g. --engine vllm=http://127.0.0.1:8009)")
    if plan.http_client not in llm.TRANSPORTS:
        raise UsageError(f"--http-client {plan.http_client!r}: expected one of {', '.join(llm.TRANSPORTS)}")
    knobs = plan.settings.knobs
    targets = [parse_engine(spec, ignore_eos=plan.ignore_eos, knobs=knobs) for spec in plan.engines]
    instances = [t.instance for t in targets]
    if len(set(instances)) != len(instances):
        raise UsageError("two --engine values with the same name: use kind:instance to tell them apart")
    if plan.command == "knee" and len(targets) != 1:
        raise UsageError("knee searches one engine at a time: give one --engine")
    prompt_set = prompt_sets.load(plan.prompts)
    workloads.check(plan.command, prompt_set, 1 if plan.shape.bursts is None else plan.shape.bursts)
    if plan.workers:
        _check_workers(plan, prompt_set)
    # The trials' rules are knobs: a bad one is one line now, not a traceback after the first phase.
    WarmupRule.current()
    NoiseRule.current()
    return Plan(targets, prompt_set, _phases(plan, targets, prompt_set), _models(plan.models), knobs)


def _check_workers(plan: RunPlan, prompt_set: PromptSet) -> None:
    """What worker processes cannot share: each builds the master's phases once, and holds its own conversations."""
    from servescope.workloads.conversation import ConversationSet

    if isinstance(prompt_set, ConversationSet):
        raise UsageError(
            f"--workers: the conversations of {prompt_set.name} are held in one process (each turn carries its "
            f"history): run it without --workers"
        )
    if plan.command == "knee":
        raise UsageError(
            "--workers: the knee picks each load from the last one's results, in one process: run it without --workers"
        )
    if plan.noise_retries:
        raise UsageError(
            "--workers: a noisy phase's retry is decided by the master alone, after the workers built their phases: "
            "set LOADGEN_NOISE_RETRIES=0 (or --noise-retries 0)"
        )


def _models(specs: tuple[str, ...]) -> dict[str, str]:
    """`--model NAME` for every engine, `--model vllm=NAME` for one instance."""
    models: dict[str, str] = {}
    for spec in specs:
        name, sep, model = spec.partition("=")
        models[name if sep else "*"] = model if sep else name
    return models


def _phases(plan: RunPlan, targets: list[Target], prompt_set: PromptSet) -> list[Phase]:
    """The phases of the whole run in the order they will run: the reference experiment interleaved over repetitions."""

    def settings_of(target: Target) -> Settings:
        return Settings(
            target=target,
            prompt_set=prompt_set,
            max_tokens=plan.max_tokens,
            temperature=plan.temperature,
            timeout_s=plan.request_timeout,
            think_s=plan.think_time,
        )

    if plan.command != "compare":
        return [phase for target in targets for phase in build_phases(plan.command, settings_of(target), plan)]
    wanted = not plan.no_sequential_four and prompt_set.name != "sequential4"
    four_set = prompt_sets.load("sequential4") if wanted else None

    def one_pass(target: Target, repetition: int) -> list[Phase]:
        # The matched set: the same prompts (as many as the burst sends) and max_tokens sequentially and as a
        # burst, so the scaling factor (sequential wall / burst wall) compares the same work.
        settings = settings_of(target)
        phases: list[Phase] = [
            SequentialPhase(settings, name="sequential", count=plan.shape.burst_size, repetition=repetition),
            BurstPhase(
                settings,
                size=plan.shape.burst_size,
                rounds=plan.shape.bursts,
                pause_s=plan.shape.burst_pause,
                repetition=repetition,
            ),
        ]
        if four_set is not None:
            four = dataclasses.replace(settings, prompt_set=four_set)
            phases.append(SequentialPhase(four, name="sequential-four", repetition=repetition))
        return phases

    schedule = trials.interleave(targets, one_pass, plan.repetitions)
    # Passes added while a factor is undecided are decided by the master alone: workers build their phases up front.
    if plan.max_repetitions > plan.repetitions and not plan.workers:
        planner = trials.MoreRepetitions(targets, one_pass, plan.repetitions, plan.max_repetitions, schedule[-1])
        for phase in schedule:
            phase.planner = planner
    return schedule
