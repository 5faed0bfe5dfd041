"""A prometheus.yml for a fleet: engines found by file or DNS service discovery, scraped directly, fleet rules loaded.

Every option is checked as Prometheus reads it (servescope/prometheus/prometheus_config.py: host names, ports, file_sd paths,
the interval's bounds), and the config by `promtool check config` where promtool is installed, before it is printed.

python -m servescope.prometheus.fleet_config --file-sd vllm=/etc/servescope/vllm.json --dns llamacpp=llama.fleet.internal:8080 \\
    --exporter 127.0.0.1:9464 > prometheus.yml
"""

from __future__ import annotations

import argparse
import sys

from servescope.contracts import metrics_mode
from servescope.prometheus import prometheus_config
from servescope.prometheus.prometheus_config import DEFAULT_SCRAPE_INTERVAL, Discovered, Target


def discovered(file_sd: list[str], dns: list[str]) -> list[Discovered]:
    """KIND=PATH and KIND=HOST:PORT options, one Discovered per kind in first-seen order; ValueError on a bad one."""
    by_kind: dict[str, dict[str, list[str]]] = {}
    for option, values in (("--file-sd", file_sd), ("--dns", dns)):
        for value in values:
            kind, sep, where = value.partition("=")
            if not sep or not kind or not where:
                raise ValueError(f"{option} {value!r}: expected KIND=..., e.g. vllm=targets.json")
            by_kind.setdefault(kind, {"files": [], "dns": []})["files" if option == "--file-sd" else "dns"].append(
                where
            )
    return [Discovered(kind, tuple(w["files"]), tuple(w["dns"])) for kind, w in by_kind.items()]


def render(
    fleet: list[Discovered],
    *,
    exporter: str | None = None,
    scrape_interval: str = DEFAULT_SCRAPE_INTERVAL,
    rule_files: tuple[str, ...] | None = None,
) -> str:
    """The config: the exporter (what no page gives) when named, then the discovered engines."""
    targets = [Target("exporter", exporter)] if exporter else []
    rules = prometheus_config.native_rule_files(metrics_mode.FLEET) if rule_files is None else rule_files
    return prometheus_config.render(targets, scrape_interval=scrape_interval, rule_files=rules, discovered=fleet)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m servescope.prometheus.fleet_config", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--file-sd", action="append", default=[], metavar="KIND=PATH", help="a file_sd target file")
    parser.add_argument("--dns", action="append", default=[], metavar="KIND=HOST:PORT", help="every A record of HOST")
    parser.add_argument("--exporter", metavar="HOST:PORT", help="the exporter, for what no engine page gives")
    parser.add_argument("--interval", default=DEFAULT_SCRAPE_INTERVAL, help="scrape and rule interval (default 5s)")
    args = parser.parse_args(argv)
    try:
        fleet = discovered(args.file_sd, args.dns)
        if not fleet:
            raise ValueError("name at least one --file-sd or --dns")
        text = render(fleet, exporter=args.exporter, scrape_interval=args.interval)
    except ValueError as exc:
        print(f"fleet_config: {exc}", file=sys.stderr)
        return 2
    # What Prometheus itself would say of it, where promtool is installed: a config it refuses is never printed.
    refused = prometheus_config.promtool_verdict_of(text)
    if refused is not None:
        print(f"fleet_config: promtool check config refuses it: {refused}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
