"""The one source of Prometheus scrape config: the native stack renders it for what is up, Compose gets a generated file.

python -m servescope.prometheus.prometheus_config --write   # regenerate prometheus/prometheus.compose.yml
python -m servescope.prometheus.prometheus_config --check   # exit 1 when the committed file is stale
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from servescope import engines
from servescope.contracts.knobs import REPO_ROOT

PROMETHEUS_DIR = REPO_ROOT / "prometheus"
RULES_DIR = PROMETHEUS_DIR / "rules"
# Rules of one METRICS_MODE (servescope/contracts/metrics_mode.py), loaded beside RULES_DIR: mode/fleet/ holds the recording
# rules that make the neutral series from the engines' own pages (servescope/prometheus/fleet_rules.py); mode/exporter/ none.
MODE_DIR = PROMETHEUS_DIR / "mode"
COMPOSE_CONFIG = PROMETHEUS_DIR / "prometheus.compose.yml"

# Grafana's datasource timeInterval is set to this too, so $__rate_interval spans >= 4 scrapes.
DEFAULT_SCRAPE_INTERVAL = "5s"
# The native stack scrapes every second: its dashboards and alerts see a burst that lasts a second or
# two (a run's report reads its own 100 ms samples, servescope/prometheus/sampler.py). The exporter reads each
# engine within engine_budget_s() of it, so a slow engine never makes the whole scrape time out.
NATIVE_SCRAPE_INTERVAL = "1s"

# The engines docker-compose.yml runs, each a service (and a profile) named after its kind.
COMPOSE_ENGINES = (engines.VLLM.name, engines.LLAMACPP.name, engines.OLLAMA.name)
# Those Prometheus scrapes raw as well: the ones with a metrics page of their own.
COMPOSE_SCRAPED = tuple(name for name in COMPOSE_ENGINES if engines.kind(name).metrics_path)
# The jobs every piece agrees on (dashboards and rules select on them).
JOBS = ("exporter", "loadgen", *COMPOSE_SCRAPED, "prometheus")

# Jobs whose series carry their own `engine`/`instance` labels (the exporter's engine-neutral
# series, the loadgen's client histograms): Prometheus must keep those rather than rename them
# to exported_instance.
HONOR_LABELS_JOBS = frozenset({"exporter", "loadgen"})

# Where the Compose Prometheus finds its rules (docker-compose.yml mounts prometheus/rules there, and
# prometheus/mode/${METRICS_MODE} at .../mode: one knob picks the mode's rules).
COMPOSE_RULE_FILES = ("/etc/prometheus/rules/*.yml", "/etc/prometheus/mode/*.yml")
# The native Prometheus reads the rules straight from the work tree.
NATIVE_RULE_FILES = (str(RULES_DIR / "*.yml"),)


def native_rule_files(mode: str) -> tuple[str, ...]:
    """The work tree's rules for a METRICS_MODE: the shared ones and the mode's own."""
    return (*NATIVE_RULE_FILES, str(MODE_DIR / mode / "*.yml"))


# Compose service name -> the port the service listens on INSIDE the Compose network. The host
# ports are knobs (.env); container ports are fixed so the generated config never depends on them.
COMPOSE_PORTS: Mapping[str, int] = {
    "exporter": 9464,
    "locust-master": 9465,
    engines.VLLM.name: 8000,
    engines.LLAMACPP.name: 8081,
    "prometheus": 9090,
    engines.OLLAMA.name: 11434,
    "grafana": 3000,
    f"{engines.OLLAMA.name}-proxy": 11435,  # the exporter's Ollama proxy
}


# ---------------------------------------------------------------- what Prometheus takes (checked before rendering)

# The scrape timeout's floor (_timeout_ms): an interval below it would have a timeout longer than itself, which
# Prometheus refuses ("scrape timeout greater than scrape interval").
MIN_TIMEOUT_MS = 100
# Past 2m a series goes stale (Prometheus' 5-minute lookback) between two scrapes of a missed one: Prometheus' own
# advice is at most 2m. An interval of 99999999999h is out of its duration's range altogether.
MAX_SCRAPE_INTERVAL_S = 120.0
# A DNS name (RFC 1123): dot-separated labels of letters, digits and inner hyphens, 253 characters at most.
_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_HOST_LABEL}(?:\.{_HOST_LABEL})*\.?")
IPV6 = re.compile(r"\[[0-9A-Fa-f:.]+\]")
# Prometheus' own rule for a file_sd path (discovery/file: patFileSDName): a JSON or YAML file, a `*` glob in the
# file's name at most (`/**/*.json` is refused).
FILE_SD_NAME = re.compile(r"^[^*]*(\*[^/]*)?\.(json|yml|yaml|JSON|YML|YAML)$")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
PROMTOOL_TIMEOUT_S = 60.0


def checked_interval(interval: str) -> str:
    """A scrape interval Prometheus takes and a scrape can keep: one unit (5s, 500ms, 1m) within
    [MIN_TIMEOUT_MS, MAX_SCRAPE_INTERVAL_S]; ValueError naming the bounds otherwise."""
    seconds = interval_s(interval)
    if not MIN_TIMEOUT_MS / 1000 <= seconds <= MAX_SCRAPE_INTERVAL_S:
        raise ValueError(
            f"scrape interval {interval!r}: expected {MIN_TIMEOUT_MS}ms to {MAX_SCRAPE_INTERVAL_S:g}s (below, the "
            f"scrape timeout would exceed it; above, series go stale between scrapes)"
        )
    return interval


def checked_port(port: str, what: str) -> int:
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{what}: port {port!r} is not 1 to 65535")
    return int(port)


def checked_address(address: str, what: str, *, dns: bool = False) -> tuple[str, int]:
    """host:port with a host Prometheus can resolve (a DNS name or IPv4; [IPv6] unless `dns`: an A record's name)
    and a port 1 to 65535; ValueError saying which part is wrong."""
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{what}: {address!r} is not host:port")
    if not (HOST_NAME.fullmatch(host) or (not dns and IPV6.fullmatch(host))):
        raise ValueError(f"{what}: {host!r} is not a host name")
    try:
        return host, checked_port(port, what)
    except ValueError:
        raise ValueError(f"{what}: {address!r} is not host:port (a port 1 to 65535)") from None


def checked_file_sd(path: str, what: str) -> str:
    """A file_sd path Prometheus takes: no control character, a .json/.yml/.yaml file, a glob in its name only."""
    if CONTROL.search(path):
        raise ValueError(f"{what}: the path {path!r} holds a control character")
    if not FILE_SD_NAME.match(path):
        raise ValueError(
            f"{what}: {path!r} is not a file_sd path Prometheus takes (a .json, .yml or .yaml file; a `*` in its "
            f"name only, as targets-*.json)"
        )
    return path


def promtool_verdict(config: Path) -> str | None:
    """promtool's refusal of a Prometheus config file, in one line; None when it passes or promtool is absent."""
    promtool = shutil.which("promtool")
    if promtool is None:
        return None
    try:
        proc = subprocess.run(
            [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return f"promtool check config did not finish within {PROMTOOL_TIMEOUT_S:g} s"
    if proc.returncode == 0:
        return None
    lines = [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    return lines[-1] if lines else f"promtool check config: exit {proc.returncode}"


def promtool_verdict_of(text: str) -> str | None:
    """promtool_verdict of a rendered config, from a file of its own (its path left out of the line)."""
    with tempfile.TemporaryDirectory(prefix="servescope-promtool-") as tmp:
        config = Path(tmp) / "prometheus.yml"
        config.write_text(text)
        verdict = promtool_verdict(config)
    return None if verdict is None else verdict.replace(str(config), "the generated config")


@dataclass(frozen=True)
class Target:
    """One thing to scrape. `labels` are added to every series (an `instance` label renames the target)."""

    job: str
    address: str  # host:port
    metrics_path: str = "/metrics"
    labels: Mapping[str, str] = field(default_factory=dict)
    # "static" (the address as is) or "dns" (every A record of the host: Compose's scaled replicas)
    discovery: str = "static"

    def __post_init__(self) -> None:
        checked_address(self.address, f"target {self.job}", dns=self.discovery == "dns")
        if not self.metrics_path.startswith("/") or CONTROL.search(self.metrics_path):
            raise ValueError(f"target {self.job}: metrics_path {self.metrics_path!r} must start with /")
        if self.discovery not in ("static", "dns"):
            raise ValueError(f"target {self.job}: discovery must be static or dns, not {self.discovery!r}")


@dataclass(frozen=True)
class Discovered:
    """Engines of one kind that Prometheus finds and scrapes itself (fleet mode): file-based or DNS service discovery.

    A target file is Prometheus' file_sd JSON or YAML, `[{"targets": ["host:port"], "labels": {"instance": "a"}}]`,
    reread when it changes; label each target's `instance` with the name the exporter gives the same engine (its
    remaining series join on it) and, for llama.cpp, whose page names no model, its `model`. A DNS name is
    "host:port": every A record of host is one engine on port.
    """

    kind: str
    files: tuple[str, ...] = ()
    dns: tuple[str, ...] = ()
    refresh: str = "30s"

    def __post_init__(self) -> None:
        adapter = engines.kind(self.kind)  # ValueError naming the kinds
        if adapter.metrics_path is None:
            raise ValueError(f"{self.kind} has no /metrics page of its own: the exporter reads it, not Prometheus")
        if not self.files and not self.dns:
            raise ValueError(f"{self.kind}: give a target file or a DNS name")
        for name in self.dns:
            checked_address(name, f"{self.kind}: DNS name", dns=True)
        for path in self.files:
            checked_file_sd(path, f"{self.kind}: target file")
        interval_s(self.refresh)  # one unit, as Prometheus reads it

    @property
    def job(self) -> str:
        return f"{self.kind}-fleet"

    def scrape_config(self) -> dict:
        scrape: dict = {"job_name": self.job, "metrics_path": engines.kind(self.kind).metrics_path}
        if self.files:
            scrape["file_sd_configs"] = [{"files": list(self.files), "refresh_interval": self.refresh}]
        if self.dns:
            scrape["dns_sd_configs"] = [
                {"names": [host], "type": "A", "port": int(port), "refresh_interval": self.refresh}
                for host, _, port in (name.rpartition(":") for name in self.dns)
            ]
        return scrape


def file_sd(targets: Iterable[tuple[str, Mapping[str, str]]]) -> str:
    """A file_sd target file (JSON) for (host:port, labels) pairs."""
    import json

    return json.dumps([{"targets": [address], "labels": dict(labels)} for address, labels in targets], indent=1)


def render(
    targets: Iterable[Target],
    *,
    scrape_interval: str = DEFAULT_SCRAPE_INTERVAL,
    rule_files: Sequence[str] = NATIVE_RULE_FILES,
    discovered: Iterable[Discovered] = (),
) -> str:
    """A complete prometheus.yml for these targets: one scrape job per job name, in first-seen order, then the
    discovered engines' jobs."""
    by_job: dict[str, list[Target]] = {}
    for target in targets:
        by_job.setdefault(target.job, []).append(target)
    scrape_configs = []
    for job, members in by_job.items():
        paths = {t.metrics_path for t in members}
        if len(paths) > 1:
            raise ValueError(f"job {job}: targets disagree on metrics_path ({', '.join(sorted(paths))})")
        scrape: dict = {"job_name": job, "metrics_path": paths.pop()}
        if job in HONOR_LABELS_JOBS:
            scrape["honor_labels"] = True
        static = [t for t in members if t.discovery == "static"]
        dns = [t for t in members if t.discovery == "dns"]
        if static:
            scrape["static_configs"] = [_static_config(t) for t in static]
        if dns:
            scrape["dns_sd_configs"] = [
                {"names": [t.address.rpartition(":")[0]], "type": "A", "port": int(t.address.rpartition(":")[2])}
                for t in dns
            ]
            # dns_sd_configs cannot carry labels; add them with a relabel rule each.
            relabels = [
                {"target_label": key, "replacement": value} for t in dns for key, value in sorted(t.labels.items())
            ]
            if relabels:
                scrape["relabel_configs"] = relabels
        scrape_configs.append(scrape)
    scrape_configs += [fleet.scrape_config() for fleet in discovered]
    checked_interval(scrape_interval)
    config = {
        "global": {
            "scrape_interval": scrape_interval,
            # Rules evaluate as often as samples arrive: alerts' `for:` counts in scrapes.
            "evaluation_interval": scrape_interval,
            "scrape_timeout": _timeout_for(scrape_interval),
        },
        "rule_files": list(rule_files),
        "scrape_configs": scrape_configs,
    }
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=False)


def _static_config(target: Target) -> dict:
    entry: dict = {"targets": [target.address]}
    if target.labels:
        entry["labels"] = dict(sorted(target.labels.items()))
    return entry


def _timeout_for(interval: str) -> str:
    """Prometheus refuses scrape_timeout > scrape_interval; its default (10s) breaks a 5s interval."""
    return f"{_timeout_ms(interval)}ms"


def interval_s(interval: str) -> float:
    """Seconds in a Prometheus interval of one unit (5s, 500ms, 1m, 1h); ValueError for any other form."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for suffix in ("ms", "s", "m", "h"):
        if interval.endswith(suffix) and interval[: -len(suffix)].isdigit():
            return int(interval[: -len(suffix)]) * units[suffix]
    raise ValueError(f"scrape interval {interval!r} is not like 5s, 500ms or 1m")


def _timeout_ms(interval: str) -> int:
    return max(int(interval_s(interval) * 1000 * 0.8), 100)


def engine_budget_s(interval: str) -> float:
    """The exporter's per-engine timeout for a scrape interval: 3/4 of the scrape timeout, the rest for the page.

    5s -> 3.0 s (the exporter's default), 1s -> 0.6 s.
    """
    return _timeout_ms(interval) * 0.75 / 1000


def compose_targets() -> list[Target]:
    """The Compose stack's targets by service name, with `instance` set to the exporter's instance names."""
    return [
        Target("exporter", f"exporter:{COMPOSE_PORTS['exporter']}"),
        # Workers send every record to the master: its client histograms count the whole test.
        Target("loadgen", f"locust-master:{COMPOSE_PORTS['locust-master']}"),
        # Raw engine pages, with `instance` renamed to the name the exporter gives the same engine,
        # so raw and engine-neutral series join on (instance).
        *(
            Target(name, f"{name}:{COMPOSE_PORTS[name]}", engines.kind(name).metrics_path, {"instance": name})
            for name in COMPOSE_SCRAPED
        ),
        Target("prometheus", f"localhost:{COMPOSE_PORTS['prometheus']}"),
    ]


def render_compose(scrape_interval: str = DEFAULT_SCRAPE_INTERVAL) -> str:
    header = (
        "# GENERATED by `python -m servescope.prometheus.prometheus_config --write` from servescope/prometheus/prometheus_config.py.\n"
        "# Do not edit: change the generator. The native stack renders its own from the same code.\n"
    )
    return header + render(compose_targets(), scrape_interval=scrape_interval, rule_files=COMPOSE_RULE_FILES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m servescope.prometheus.prometheus_config", description=__doc__.splitlines()[0]
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"write {COMPOSE_CONFIG.relative_to(REPO_ROOT)} (default)")
    mode.add_argument("--check", action="store_true", help="exit 1 when the committed file differs from the generator")
    mode.add_argument("--print", action="store_true", help="print the Compose config to stdout")
    args = parser.parse_args(argv)
    text = render_compose()
    where = COMPOSE_CONFIG.relative_to(REPO_ROOT)
    if args.print:
        sys.stdout.write(text)
        return 0
    if args.check:
        current = COMPOSE_CONFIG.read_text() if COMPOSE_CONFIG.exists() else ""
        if current != text:
            print(f"{where} is stale: run `python -m servescope.prometheus.prometheus_config --write`", file=sys.stderr)
            return 1
        print(f"{where} is up to date")
        return 0
    COMPOSE_CONFIG.parent.mkdir(parents=True, exist_ok=True)
    COMPOSE_CONFIG.write_text(text)
    print(f"wrote {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
