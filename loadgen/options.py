"""The load generator's options, once: `python -m loadgen` commands, `locust -f loadgen/locustfile.py` and the web UI.

Every default is a knob (.env.example, overridden by .env, overridden by the environment), and the
same knob is the option's environment variable on Locust's parser (its `env_var=` way), so a value
set once reads the same in a headless command, `locust -f` and the web UI's custom parameters.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.knee import KneeInputError
from loadgen.scenarios import MAX_USERS, SCENARIOS, parse_levels
from servescope import engines
from servescope.contracts import knobs
from servescope.contracts.runcontract import MAX_RUN_S
from servescope.contracts.runfolder import check_run_id
from servescope.contracts.settings import KnobTable
from servescope.judgements import slo

HEADLESS = frozenset({"compare", *SCENARIOS})
BURSTS = frozenset({"compare", "burst"})
TIMED = frozenset({"ramp", "rate", "sweep", "replay", "knee"})
KNEE = frozenset({"knee"})
OPEN_LOOP = frozenset({"rate", "knee"})
CAPACITY = frozenset({"ramp", "rate", "sweep", "knee"})  # their defaults: a fresh prompt per request
PROMPTS_HELP = (
    "sequential4, burst3 (formerly seed4, seed3), mixed, synthetic:TOKENS (a fresh prompt of about TOKENS prompt "
    "tokens per request), synthetic:TOKENSxCOUNT (COUNT prompts, sent again), a txt/JSONL file, or a workload: "
    "conversation[:NAME|FILE], "
    "shared-prefix[:P,L,S[,Q]], dataset[:NAME|FILE[,input=MIN-MAX,output=MIN-MAX,sample=N,seed=S]], "
    "trace[:NAME|FILE] (servescope/workloads/)"
)


# --- what a value may be: each raises argparse.ArgumentTypeError, a ValueError, with the one line to show ---


def _number(text: str, convert: Callable[[str], float], what: str) -> float:
    try:
        value = convert(str(text).strip())
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def bounded(convert: Callable[[str], float], what: str, low: float, high: float | None = None, *, above: bool = False):
    def check(text: str):
        value = _number(text, convert, what)
        if value < low or (above and value == low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    check.__name__ = what  # argparse names the type in its messages
    return check


positive_int = bounded(int, "a whole number >= 1", 1)
non_negative_int = bounded(int, "a whole number >= 0", 0)
users = bounded(int, f"a whole number of users from 1 to {MAX_USERS}", 1, MAX_USERS)
positive_seconds = bounded(float, f"a number of seconds > 0, at most {MAX_RUN_S:g} (a week)", 0, MAX_RUN_S, above=True)
non_negative_seconds = bounded(float, f"a number of seconds from 0 to {MAX_RUN_S:g} (a week)", 0, MAX_RUN_S)
linger_seconds = bounded(float, "a number of seconds from 0 to 600", 0, 600)
positive_rate = bounded(float, "a number of arrivals per second > 0", 0, above=True)
speed = bounded(float, "a speed-up factor > 0 (1: the trace's own times)", 0, above=True)
temperature = bounded(float, "a temperature >= 0", 0)
port = bounded(int, "a port from 0 (off) to 65535", 0, 65535)
workers = bounded(int, "a whole number of worker processes from 0 (one process) to 64", 0, 64)
# The sequential queue holds passes x prompts up front: a bound keeps it in memory.
repeats = bounded(int, "a whole number of passes from 1 to 100000", 1, 100_000)
repetitions = bounded(int, "a whole number of repetitions from 1 to 1000", 1, 1000)


positive_number = bounded(float, "a number > 0", 0, above=True)


def slo_spec(text: str) -> str:
    """An SLO spec (servescope/judgements/slo.py), kept as text: empty means the SLO knob, else the threshold table's."""
    if str(text).strip():
        try:
            slo.parse(text)
        except slo.SloError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return str(text)


def slo_share(text: str) -> float:
    try:
        return slo.check_objective(text)
    except slo.SloError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def levels(text: str) -> str:
    """Comma-separated user counts (a ramp's steps, a sweep's levels); kept as text, the scenario parses it."""
    try:
        parse_levels(text, "levels")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("levels: ")) from None
    return str(text)


def run_id(text: str) -> str:
    try:
        return check_run_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True)
class Option:
    """One load generator option, declared once for `python -m loadgen`, Locust's parser and the web UI."""

    flag: str
    help: str
    knob: str | None = None  # the default's one source, and the environment variable Locust reads
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False  # a flag without a value (store_true)
    repeat: bool = False  # may be given several times (append)
    metavar: str | None = None
    commands: frozenset[str] = HEADLESS  # the headless `python -m loadgen` commands that take it
    locust: bool = True  # on Locust's parser: `locust -f`, and so `python -m loadgen webui`
    web_ui: bool = True  # shown under the web UI's Custom parameters
    repo_relative: bool = (
        False  # a relative path knob means under the checkout, not the current directory (knobs.under_root)
    )
    aliases: tuple[str, ...] = ()  # the flag's earlier names: still accepted, not shown in --help

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def default(self, table: KnobTable) -> Any:
        """The option's default: its knob in `table` (read once where the parser is built)."""
        if self.switch:
            return table.switch(self.knob) if self.knob else False
        if self.repeat:
            return []
        if self.knob is None:
            return None
        value = table[self.knob]
        if value == "":
            return None if self.type not in (None, str) else ""
        if self.repo_relative and not Path(value).expanduser().is_absolute():
            return str(knobs.under_root(Path(value)))
        return value  # argparse applies `type` to a string default, so a knob is checked like a flag

    def kwargs(self, table: KnobTable) -> dict[str, Any]:
        if self.switch:
            return {"action": "store_true", "default": self.default(table), "help": self.help}
        kwargs: dict[str, Any] = {"default": self.default(table), "help": self.help}
        if self.type is not None:
            kwargs["type"] = self.type
        if self.choices is not None:
            kwargs["choices"] = self.choices
        if self.metavar is not None:
            kwargs["metavar"] = self.metavar
        if self.repeat:
            kwargs["action"] = "append"
        return kwargs


def _knob_help(option_help: str, knob: str | None) -> str:
    return f"{option_help} (default {knob}: %(default)s)" if knob else option_help


OPTIONS: tuple[Option, ...] = (
    # -- what to load --
    Option(
        "--engine",
        f"engine kind ({', '.join(engines.ENGINES)}), optionally kind:instance, =URL for where it listens; "
        "repeat for several, run back to back (no URL: the kind's *_URL knob, else its default port)",
        repeat=True,
        metavar="NAME[=URL]",
        locust=False,
    ),
    Option(
        "--engine",
        "engine kind to load; the Host field is its URL",
        knob="LOADGEN_ENGINE",
        choices=tuple(engines.ENGINES),
        commands=frozenset(),
    ),
    Option(
        "--engine-url",
        "engine base URL, shown as the web UI's Host (empty: the kind's *_URL knob, else its default port)",
        knob="LOADGEN_ENGINE_URL",
        metavar="URL",
        commands=frozenset(),
        web_ui=False,
    ),
    Option(
        "--scenario",
        "sequential, burst, ramp, rate, sweep, replay or knee (burst: the Number of users is the burst size; "
        "replay: a trace's requests at their own times; knee: the highest load that meets the SLOs)",
        knob="LOADGEN_SCENARIO",
        choices=SCENARIOS,
        commands=frozenset(),
    ),
    Option(
        "--model",
        "model to request (default: what the engine lists; Ollama: OLLAMA_MODEL); NAME=MODEL for one engine",
        repeat=True,
        metavar="[NAME=]MODEL",
        locust=False,
    ),
    Option("--model", "model to request (empty: what the engine lists)", knob="LOADGEN_MODEL", commands=frozenset()),
    Option("--prompts", PROMPTS_HELP, knob="LOADGEN_PROMPTS", commands=HEADLESS - CAPACITY),
    # The capacity commands measure how much load an engine takes: on prompts no other request shares (a small
    # set sent again is served from the prefix cache at every level after the first), and a longer answer.
    Option("--prompts", PROMPTS_HELP, knob="LOADGEN_CAPACITY_PROMPTS", commands=CAPACITY, locust=False),
    Option(
        "--prompt-dir",
        "web UI: a folder whose files the form's Prompts may name (besides the shipped sets and the set the UI "
        "started with); empty: no other file. The form cannot change it",
        knob="LOADGEN_PROMPT_DIR",
        metavar="DIR",
        commands=frozenset(),
        web_ui=False,
    ),
    Option(
        "--think-time",
        "conversation sets: seconds between an answer and the conversation's next turn (not in a burst: "
        "the pause between bursts is its think time)",
        knob="LOADGEN_THINK_TIME",
        type=non_negative_seconds,
    ),
    Option(
        "--max-tokens", "output tokens per request", knob="MAX_TOKENS", type=positive_int, commands=HEADLESS - CAPACITY
    ),
    Option(
        "--max-tokens",
        "output tokens per request",
        knob="LOADGEN_CAPACITY_MAX_TOKENS",
        type=positive_int,
        commands=CAPACITY,
        locust=False,
    ),
    Option("--temperature", "sampling temperature", knob="TEMPERATURE", type=temperature),
    Option(
        "--no-ignore-eos",
        "don't send ignore_eos to engines that accept it",
        knob="LOADGEN_NO_IGNORE_EOS",
        switch=True,
    ),
    # -- the scenarios' shapes --
    Option(
        "--burst-size",
        "requests released at the same instant (the web UI's Number of users)",
        knob="BURST_SIZE",
        type=users,
        commands=BURSTS,
        web_ui=False,
    ),
    Option("--bursts", "how many bursts", knob="LOADGEN_BURSTS", type=positive_int, commands=BURSTS),
    Option(
        "--burst-pause",
        "seconds between bursts",
        knob="LOADGEN_BURST_PAUSE",
        type=non_negative_seconds,
        commands=BURSTS,
    ),
    Option(
        "--repeat",
        "sequential: passes over the prompt set",
        knob="LOADGEN_REPEAT",
        type=repeats,
        commands=frozenset({"sequential"}),
    ),
    Option("--steps", "ramp: users per step", knob="LOADGEN_STEPS", type=levels, commands=frozenset({"ramp"})),
    Option(
        "--concurrencies",
        "sweep: one closed-loop phase per concurrency",
        knob="LOADGEN_CONCURRENCIES",
        type=levels,
        commands=frozenset({"sweep"}),
    ),
    Option(
        "--rate", "rate: arrivals per second", knob="LOADGEN_RATE", type=positive_rate, commands=frozenset({"rate"})
    ),
    Option(
        "--arrivals",
        "rate (and knee over rate): constant gaps or Poisson arrivals",
        knob="LOADGEN_ARRIVALS",
        choices=("constant", "poisson"),
        commands=OPEN_LOOP,
    ),
    Option(
        "--speed",
        "replay: the trace's clock runs this many times faster (2: twice the arrival rate)",
        knob="LOADGEN_REPLAY_SPEED",
        type=speed,
        commands=frozenset({"replay"}),
    ),
    Option(
        "--duration",
        "seconds per ramp step / sweep level / rate phase / knee measurement (empty: LOADGEN_DURATION unless "
        "--requests); replay: replay the trace's first SECONDS (after --speed), default all of it",
        type=positive_seconds,
        commands=TIMED,
    ),
    Option(
        "--requests",
        "requests per user per ramp step / sweep level / knee measurement (rate, replay: in total) instead of a "
        "duration",
        type=positive_int,
        commands=TIMED,
    ),
    Option(
        "--max-in-flight",
        "rate / knee over rate: the client's own ceiling of requests in flight; arrivals beyond it wait and the "
        "report counts their wait from the schedule",
        knob="LOADGEN_MAX_IN_FLIGHT",
        type=positive_int,
        commands=OPEN_LOOP,
    ),
    # -- service level objectives: goodput in every run, the knee's pass/fail --
    Option(
        "--slo",
        f"service level objectives, {slo.SPEC_HELP} (empty: servescope/contracts/thresholds.py's SLO_DEFAULT)",
        knob="SLO",
        type=slo_spec,
        metavar="SPEC",
    ),
    Option(
        "--slo-attainment",
        "share of requests that must meet every per-request SLO term; also the burn-rate rules' objective "
        "(empty: servescope/contracts/thresholds.py's SLO_ATTAINMENT)",
        knob="SLO_ATTAINMENT",
        type=slo_share,
        metavar="SHARE",
    ),
    # -- the knee: the highest load that meets the SLOs --
    Option(
        "--over",
        "knee: search over concurrency (closed loop) or rate (open loop, arrivals per second)",
        knob="LOADGEN_KNEE_OVER",
        choices=("concurrency", "rate"),
        commands=KNEE,
    ),
    Option(
        "--min-load", "knee: the lowest load it may try", knob="LOADGEN_KNEE_MIN", type=positive_number, commands=KNEE
    ),
    Option(
        "--start-load",
        "knee: where the bracket starts (empty: --min-load); `make tune` starts at the last knee",
        type=positive_number,
        commands=KNEE,
    ),
    Option(
        "--max-load", "knee: the highest load it may try", knob="LOADGEN_KNEE_MAX", type=positive_number, commands=KNEE
    ),
    Option(
        "--knee-repeats",
        "knee: measurements of each boundary load (pooled: a repeat that flips a verdict moves the boundary)",
        knob="LOADGEN_KNEE_REPEATS",
        type=positive_int,
        commands=KNEE,
    ),
    Option(
        "--knee-precision",
        "knee over rate: stop bisecting when the failing rate is within this fraction of the passing one",
        knob="LOADGEN_KNEE_PRECISION",
        type=positive_number,
        commands=KNEE,
    ),
    Option(
        "--knee-probes",
        "knee: at most this many measurements in all",
        knob="LOADGEN_KNEE_PROBES",
        type=positive_int,
        commands=KNEE,
    ),
    # -- how requests are sent and where results go --
    Option(
        "--request-timeout",
        "seconds without a byte before a request fails",
        knob="REQUEST_TIMEOUT",
        type=positive_seconds,
    ),
    Option(
        "--http-client",
        "the HTTP client requests go through",
        knob="LOADGEN_HTTP_CLIENT",
        web_ui=False,
    ),
    Option(
        "--workers",
        "worker processes sharing the load under this one (one run folder, one burst barrier, one clock)",
        knob="LOADGEN_WORKERS",
        type=workers,
        metavar="N",
        locust=False,
    ),
    Option(
        "--results",
        "where run folders go (a relative SERVESCOPE_RESULTS is under the repository)",
        knob="SERVESCOPE_RESULTS",
        repo_relative=True,
        web_ui=False,
    ),
    Option(
        "--run-id",
        "name of this run's folder: the run is written to RESULTS/RUN_ID (default: date-time-pid), so a caller "
        "that passes it knows the folder without reading the output",
        type=run_id,
        metavar="RUN_ID",
        locust=False,
    ),
    Option(
        "--metrics-port",
        "client-side /metrics for Prometheus while the run lasts (0: off)",
        knob="LOADGEN_METRICS_PORT",
        type=port,
        web_ui=False,
    ),
    Option(
        "--metrics-linger",
        "keep client /metrics up this many seconds after the last request, one scrape interval, so "
        "Prometheus gets the final samples (0: off)",
        knob="LOADGEN_METRICS_LINGER",
        type=linger_seconds,
        metavar="SECONDS",
        locust=False,
    ),
    Option(
        "--warmup",
        "warm-up per engine, excluded from results: at least this many requests (0: none), then until "
        "WARMUP_STABLE_COUNT latencies agree within WARMUP_TOLERANCE (at most WARMUP_MAX_S seconds)",
        knob="LOADGEN_WARMUP",
        type=non_negative_int,
        locust=False,
    ),
    Option(
        "--repetitions",
        "passes of the reference experiment, engines and phases interleaved (A B B A ...): the table gives the median "
        "wall per phase and the scaling factor's 95%% CI over them",
        knob="LOADGEN_REPETITIONS",
        type=repetitions,
        commands=frozenset({"compare"}),
        locust=False,
    ),
    Option(
        "--max-repetitions",
        "while an engine's scaling factor, widened by the host noise its phases measured, is undecided (its CI "
        "straddles a reading's bound), add passes of that engine up to this many in all (<= --repetitions: never)",
        knob="LOADGEN_MAX_REPETITIONS",
        type=repetitions,
        commands=frozenset({"compare"}),
        locust=False,
    ),
    Option(
        "--noise-retries",
        "run a phase flagged noisy (host noise over the NOISE_* thresholds) again right away, up to this many times",
        knob="LOADGEN_NOISE_RETRIES",
        type=non_negative_int,
        commands=frozenset({"compare"}),
        locust=False,
    ),
    Option(
        "--settle-max-s",
        "when the schedule switches engines, wait until the engines measured before use under half "
        "NOISE_GROUP_CPU_CORES, for at most this many seconds (0: no wait)",
        knob="LOADGEN_SETTLE_MAX_S",
        type=non_negative_seconds,
        commands=frozenset({"compare"}),
        locust=False,
    ),
    Option(
        "--isolate",
        "while one engine is measured: off (the others run on, their CPU is measured and flags the phase) or "
        "pause (SIGSTOP the other engines the native stack started, SIGCONT after)",
        knob="LOADGEN_ISOLATE",
        choices=("off", "pause"),
        commands=frozenset({"compare"}),
        locust=False,
    ),
    Option(
        "--grafana-url",
        "post each phase as a Grafana annotation (unset: none). "
        "Credential: GRAFANA_TOKEN, else GRAFANA_ADMIN_USER/GRAFANA_ADMIN_PASSWORD",
        knob="GRAFANA_URL",
        metavar="URL",
        locust=False,
    ),
    Option("--quiet", "no per-request progress lines", switch=True, locust=False),
    Option(
        "--no-sequential-four",
        "skip the reference experiment's four-prompt sequential pass (sequential4)",
        switch=True,
        aliases=("--no-seed4",),
        commands=frozenset({"compare"}),
        locust=False,
    ),
)


class ArgumentParser(argparse.ArgumentParser):
    """argparse that says what is wrong in one line (no usage block) and exits 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


FLAGS = {option.dest: option.flag for option in OPTIONS}  # what the command line calls each value


def said(exc: BaseException) -> str:
    """An error's one line as the command line says it: a knee input named by its flag (--min-load), any other as
    it is."""
    return exc.named(FLAGS) if isinstance(exc, KneeInputError) else str(exc)


def validate(namespace: argparse.Namespace) -> None:
    """Check every table option's value as its flag would be (values typed into the web UI arrive as text)."""
    for option in for_locust():
        value = getattr(namespace, option.dest, None)
        if option.type is None or option.switch or value in (None, ""):
            continue
        try:
            setattr(namespace, option.dest, option.type(str(value)))
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise ValueError(f"{option.flag}: {exc}") from None


def for_command(command: str) -> list[Option]:
    """A headless command's options; `webui` takes Locust's."""
    return for_locust() if command == "webui" else [o for o in OPTIONS if command in o.commands]


def for_locust() -> list[Option]:
    return [o for o in OPTIONS if o.locust]


def add_command_options(parser: argparse.ArgumentParser, command: str, table: KnobTable) -> None:
    """One `python -m loadgen COMMAND`'s options, from the table (their defaults: the knobs in `table`)."""
    for option in for_command(command):
        kwargs = option.kwargs(table)
        kwargs["help"] = _knob_help(option.help, option.knob)
        parser.add_argument(option.flag, **kwargs)
        for alias in option.aliases:
            parser.add_argument(
                alias, **{**kwargs, "dest": option.dest, "default": argparse.SUPPRESS, "help": argparse.SUPPRESS}
            )


def _empty_means_default(option: Option, convert: Callable[[str], Any], table: KnobTable) -> Callable[[str], Any]:
    """Compose sets every knob it passes, an unset one as "" (`${SLO_ATTAINMENT:-}`), and configargparse converts
    the environment variable as given: empty means the knob's default there, as it does in .env."""

    def check(text: str) -> Any:
        if str(text).strip():
            return convert(text)
        default = option.default(table)
        return None if default in (None, "") else convert(default)

    return check


def add_locust_options(parser, table: KnobTable) -> None:
    """Locust's parser (configargparse): the knob is also the environment variable, the web UI shows what it should."""
    for option in for_locust():
        kwargs = option.kwargs(table)
        if option.type not in (None, str):
            kwargs["type"] = _empty_means_default(option, option.type, table)
        parser.add_argument(option.flag, env_var=option.knob, include_in_web_ui=option.web_ui, **kwargs)
