"""Command line of the exporter: `python -m exporter` / `servescope-exporter`; flags override env vars and the config file."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys

try:
    import uvloop
except ImportError:  # not built for this platform
    uvloop = None

from exporter import config as exporter_config
from exporter import relay, server
from servescope import engines
from servescope.contracts import metrics_mode
from servescope.contracts.settings import KnobTable
from servescope.text import command_name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=command_name.prog("servescope-exporter"),
        description=f"Prometheus exporter for {', '.join(k.said for k in engines.ENGINES.values())} (with Ollama's "
        f"streaming proxy).",
        epilog=f"Env: EXPORTER_PORT, SERVESCOPE_BIND, {', '.join(k.url_env for k in engines.ENGINES.values())}, "
        f"OLLAMA_PROXY_PORT, OLLAMA_NUM_PARALLEL, "
        f"{' and '.join(k.api_key_env for k in engines.ENGINES.values() if k.api_key_env)} (engines started with "
        f"--api-key). "
        "The config file format is described in `python -m pydoc exporter.config`. "
        "Resource series: --process/--container, or processes:/containers: in the file. "
        "`python -m exporter check URL...`: whether the engines' pages still carry what servescope reads "
        "(docs/drift.md).",
    )
    # Defaults are None so that "not given" falls through to the file, then the environment.
    parser.add_argument("--config", metavar="FILE", help="YAML file listing engine instances (see exporter/config.py)")
    parser.add_argument("--listen-address", metavar="ADDR", help="address to bind (default SERVESCOPE_BIND, 127.0.0.1)")
    parser.add_argument("--port", metavar="N", help="port for / and /metrics (default EXPORTER_PORT, 9464)")
    for kind in engines.ENGINES.values():  # --vllm-url, --llamacpp-url, ...: one per engine adapter
        parser.add_argument(
            f"--{kind.name}-url", metavar="URL", help=f"the {kind.said} server to read (default {kind.url_env})"
        )
    parser.add_argument("--proxy-port", metavar="N", help="port of the Ollama proxy (default OLLAMA_PROXY_PORT, 11435)")
    parser.add_argument(
        "--ollama-num-parallel",
        metavar="N",
        help="OLLAMA_NUM_PARALLEL that Ollama runs with (default OLLAMA_NUM_PARALLEL, 1)",
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        help="budget per engine per scrape, below Prometheus' scrape_timeout (default 3)",
    )
    parser.add_argument(
        "--metrics-mode",
        choices=metrics_mode.MODES,
        help="fleet: leave out the series Prometheus' fleet rules make from the engines' own pages "
        "(default METRICS_MODE, exporter)",
    )
    parser.add_argument(
        "--process",
        action="append",
        metavar="NAME=PIDFILE",
        help="export CPU and memory of a native engine (and its children) against its limit; "
        "NAME is kind or kind:instance; repeatable",
    )
    parser.add_argument(
        "--container",
        action="append",
        metavar="NAME=CONTAINER",
        help="the same for an engine container, through the Docker engine (docker stats); repeatable",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["check"]:  # `python -m exporter check URL...`: the metric-drift gate (exporter/check.py)
        from exporter import check

        command_name.subcommand("check")
        return check.main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="servescope-exporter: %(message)s", stream=sys.stderr)
    try:
        config = exporter_config.load(args, KnobTable.from_env())  # the exporter's entry: the knobs, read once
    except exporter_config.ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    relay.raise_fd_limit()  # before the proxies size their connection caps from it
    exporter = server.build(config)
    # Everything built so far lives as long as the process: frozen, the garbage collector never
    # walks it again. Unfrozen, a collection in the middle of a burst of chunks walked all of it and
    # stalled the proxy many times longer than a frozen one does.
    gc.freeze()
    try:
        # uvloop halves the event loop's own cost per chunk the proxy relays; asyncio's loop is the fallback.
        with asyncio.Runner(loop_factory=uvloop.new_event_loop if uvloop else None) as runner:
            runner.run(server.run(exporter))
    except server.PortInUse as exc:
        print(f"servescope-exporter: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
