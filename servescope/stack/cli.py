"""`python -m servescope.stack up|down|status|provision|tune|replicas [--mode native|compose|auto]`: Compose when a Docker engine
answers, else native."""

from __future__ import annotations

import argparse
import sys

from servescope.contracts import knobs
from servescope.stack import compose, native, provision, replicas, supervisor, tune
from servescope.stack.errors import StackError
from servescope.text import command_name

COMMANDS = ("up", "down", "status", "provision", "tune", "replicas")


def use_compose(mode: str, command: str, native_has_state: bool) -> bool:
    """Whether this command goes to Compose (True) or the native stack (False)."""
    if mode != "auto":
        return mode == "compose"
    # auto: a native stack that is up is managed natively whatever Docker says.
    if command in ("down", "status") and native_has_state:
        return False
    return compose.docker_available()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=command_name.prog("python -m servescope.stack"), description=__doc__.splitlines()[0]
    )
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument(
        "--mode",
        choices=("auto", "native", "compose"),
        default="auto",
        help="auto (default): Compose when a Docker engine answers, else native processes",
    )
    parser.add_argument(
        "--no-compare",
        action="store_true",
        help="up: bring the services up without running the sequential-vs-burst comparison",
    )
    parser.add_argument(
        "--for",
        dest="purpose",
        choices=sorted(provision.PURPOSES),
        default="up",
        help="provision: install what this entry point drives (apt-get as root on Debian, else one line each)",
    )
    parser.add_argument(
        "--engine",
        help="tune: the native stack's engine to tune (vllm, llamacpp); options after it go to `python -m loadgen knee`;"
        " replicas: the engine to start replicas of (llamacpp)",
    )
    parser.add_argument(
        "--count", type=int, default=2, help="replicas: how many to start behind the router (default 2)"
    )
    args, knee_args = parser.parse_known_args(argv)
    usage = None
    if knee_args and args.command != "tune":
        usage = f"unrecognized arguments: {' '.join(knee_args)} (only tune passes options on, to the knee)"
    elif args.command == "tune" and args.engine not in tune.TUNED:
        usage = f"tune: --engine (ENGINE=) {args.engine or ''!r}: expected one of {', '.join(tune.TUNED)}"
    if usage:
        print(f"stack: {usage}", file=sys.stderr, flush=True)
        return 2
    try:
        if args.command == "tune":
            return tune.main(args.engine or "", knee_args)
        if args.command == "replicas":
            return replicas.serve(args.engine or replicas.STARTABLE[0], args.count)
        if args.command == "provision":
            return provision.main(args.purpose)
        if use_compose(args.mode, args.command, bool(supervisor.records())):
            if args.command == "up":
                return compose.up(compare=not args.no_compare)
            return getattr(compose, args.command)()
        if args.command == "up":
            return native.up(compare=not args.no_compare)
        if args.command == "down":
            return native.down()
        return native.status()
    except knobs.KnobError as exc:  # a knob read at this boundary: one line naming it
        print(f"stack: {exc}", file=sys.stderr, flush=True)
        return 2
    except StackError as exc:
        print(f"stack: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("stack: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
