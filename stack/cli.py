"""`python -m stack up|down|status [--mode native|compose|auto]`: Compose when a Docker engine answers, else native."""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from types import ModuleType

from stack.errors import StackError


def compose_module() -> ModuleType | None:
    """stack.compose (up/down/status/docker_available), or None while it does not exist."""
    try:
        return importlib.import_module("stack.compose")
    except ImportError:
        return None


def choose(mode: str, command: str, native_has_state: bool) -> ModuleType | None:
    """The Compose module to use, or None for native."""
    if mode == "native":
        return None
    compose = compose_module()
    if mode == "compose":
        if compose is None:
            raise StackError("--mode compose: stack/compose.py is not available in this checkout")
        return compose
    # auto: a native stack that is up is managed natively whatever Docker says.
    if command in ("down", "status") and native_has_state:
        return None
    if compose is not None and compose.docker_available():
        return compose
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stack", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("up", "down", "status"))
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
    args = parser.parse_args(argv)
    from stack import native, supervisor

    try:
        compose = choose(args.mode, args.command, bool(supervisor.records()))
        if compose is not None:
            if args.command == "up" and args.no_compare and "compare" in inspect.signature(compose.up).parameters:
                return compose.up(compare=False)
            return getattr(compose, args.command)()
        if args.command == "up":
            return native.up(compare=not args.no_compare)
        if args.command == "down":
            return native.down()
        return native.status()
    except StackError as exc:
        print(f"stack: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("stack: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
