"""`servescope <verb>`: the one command, each verb handed to the package that does it (the `python -m` forms stay)."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable
from dataclasses import dataclass

from loadgen.verbs import COMMANDS as LOAD_COMMANDS
from loadgen.verbs import QUICK_HELP, WEBUI_HELP
from servescope.text import command_name

PROG = "servescope"
EXIT_USAGE = 2


# Each package's entry point is imported only when its verb runs: the load generator's import monkey-patches
# sockets for gevent (only a load run wants that), and a report should not pay for Locust's import.
def _stack(verb: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        from servescope.stack import cli

        return cli.main([verb, *argv])

    return run


def _loadgen(verb: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        from loadgen import cli

        return cli.main([verb, *argv])

    return run


def _report(sub: str | None) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        from servescope.report import cli

        return cli.main([sub, *argv] if sub else argv)

    return run


def _exporter(argv: list[str]) -> int:
    from exporter import cli

    return cli.main(argv)


def _fleet_config(argv: list[str]) -> int:
    from servescope.prometheus import fleet_config

    return fleet_config.main(argv)


def _dashboards(argv: list[str]) -> int:
    from dashboards import build

    return build.main(argv)


@dataclass(frozen=True)
class Verb:
    """One `servescope` verb: its help group and line, and the package's entry point its arguments are handed to."""

    name: str
    group: str
    help: str
    run: Callable[[list[str]], int]
    # What the handed-over parser calls itself in usage lines: "servescope" where the package's own parser
    # names the verb (a subcommand), "servescope <verb>" where the verb is the whole program.
    prog: str = PROG


STACK = "The stack (native processes, or Compose when a Docker engine answers)"
MEASURE = "Measure an engine (the stack's, or one that already runs: --engine NAME=URL)"
READ = "Read run folders"
TOOLS = "Tools for a deployment of your own"

VERBS: tuple[Verb, ...] = (
    Verb(
        "up",
        STACK,
        "bring the stack up and run the sequential-vs-burst comparison (--no-compare: services only)",
        _stack("up"),
    ),
    Verb("down", STACK, "stop what `up` started", _stack("down")),
    Verb("status", STACK, "the services: pid, URL, ready, memory", _stack("status")),
    Verb(
        "tune",
        STACK,
        "knee, turn the knob the binding resource names, restart, keep it if goodput rises",
        _stack("tune"),
    ),
    Verb(
        "replicas", STACK, "N llama.cpp replicas on their own cores behind nginx, held until Ctrl-C", _stack("replicas")
    ),
    Verb(
        "provision",
        STACK,
        "install what a purpose needs (apt-get as root on Debian), else name it",
        _stack("provision"),
    ),
    Verb("quick", MEASURE, QUICK_HELP, _loadgen("quick"), prog=f"{PROG} quick"),
    *(Verb(name, MEASURE, text, _loadgen(name)) for name, text in LOAD_COMMANDS.items()),
    Verb("webui", MEASURE, WEBUI_HELP, _loadgen("webui")),
    Verb(
        "report",
        READ,
        "report on a run folder (the latest by default; --baseline to compare two)",
        _report(None),
        prog=f"{PROG} report",
    ),
    Verb(
        "plan",
        READ,
        "replicas for a traffic from knee runs, and what a good token costs",
        _report("plan"),
        prog=f"{PROG} plan",
    ),
    Verb(
        "check",
        READ,
        "the regression gate: exit 1 when a run got worse than its baseline",
        _report("check"),
        prog=f"{PROG} check",
    ),
    Verb(
        "exporter",
        TOOLS,
        "the engine-neutral Prometheus exporter; `exporter check URL`: the metric-drift gate",
        _exporter,
        prog=f"{PROG} exporter",
    ),
    Verb(
        "fleet-config",
        TOOLS,
        "Prometheus scrape config and rules for a fleet of engines",
        _fleet_config,
        prog=f"{PROG} fleet-config",
    ),
    Verb("dashboards", TOOLS, "regenerate the Grafana dashboards' JSON", _dashboards, prog=f"{PROG} dashboards"),
)
BY_NAME = {verb.name: verb for verb in VERBS}


def usage() -> str:
    width = max(len(verb.name) for verb in VERBS) + 2
    lines = [f"usage: {PROG} <verb> [options]   ({PROG} <verb> --help: that verb's options)", ""]
    for group in dict.fromkeys(verb.group for verb in VERBS):
        lines.append(f"{group}:")
        lines += [f"  {verb.name:<{width}}{verb.help}" for verb in VERBS if verb.group == group]
        lines.append("")
    lines.append(f"A measurement of an engine that already runs: {PROG} quick http://HOST:PORT")
    return "\n".join(lines) + "\n"


def version() -> str:
    from importlib import metadata

    try:
        return metadata.version(PROG)
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(usage())
        return 0 if argv else EXIT_USAGE
    if argv[0] == "--version":
        print(f"{PROG} {version()}")
        return 0
    verb = BY_NAME.get(argv[0])
    if verb is None:
        near = difflib.get_close_matches(argv[0], BY_NAME, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        print(f"{PROG}: no verb {argv[0]!r}{hint}; `{PROG} --help` lists them", file=sys.stderr)
        return EXIT_USAGE
    command_name.invoked_as(verb.prog)
    return verb.run(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
