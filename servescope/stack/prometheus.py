"""Prometheus for the native stack: find or install the binary, generate its config for the services that are up."""

from __future__ import annotations

import shutil
from pathlib import Path

from servescope.contracts import knobs, metrics_mode
from servescope.contracts.settings import KnobTable
from servescope.stack import paths, provision


def find_or_install() -> tuple[str | None, str | None]:
    """(path, None) when usable, (None, message) otherwise; installing goes through the one provisioning table."""
    if provision.ensure(["prometheus"]):
        return None, f"Prometheus not found: {provision.PROMETHEUS.how_to_install}; continuing without it"
    return shutil.which("prometheus"), None


def rule_files(repo_root: Path = knobs.REPO_ROOT, mode: str = metrics_mode.EXPORTER) -> list[str]:
    """The shared rules and those of the mode (METRICS_MODE's text; fleet: the neutral series from the engines' own
    pages)."""
    mode = metrics_mode.parse(mode)
    prometheus = repo_root / "prometheus"
    return [str(p) for d in (prometheus / "rules", prometheus / "mode" / mode) for p in sorted(d.glob("*.yml"))]


def write_config(
    targets: list[tuple[str, str, str, dict[str, str]]],
    scrape_interval: str | None = None,
    rules: list[str] | None = None,
    mode: str = metrics_mode.EXPORTER,
) -> Path:
    """targets: (job, "host:port", metrics_path, labels); rendered by the one config source Compose uses too. rules:
    the rule files (None: the shared ones and those of `mode`, METRICS_MODE's text)."""
    from servescope.prometheus import prometheus_config

    scrape_interval = scrape_interval or prometheus_config.NATIVE_SCRAPE_INTERVAL
    text = prometheus_config.render(
        [
            prometheus_config.Target(job=job, address=address, metrics_path=metrics_path, labels=labels)
            for job, address, metrics_path, labels in targets
        ],
        scrape_interval=scrape_interval,
        rule_files=tuple(rule_files(mode=mode) if rules is None else rules),
    )
    config = paths.prometheus_dir() / "prometheus.yml"
    config.write_text(text)
    return config


def check_config(config: Path) -> str | None:
    """promtool's verdict on the generated config (None = fine or promtool absent): prometheus_config's one check."""
    from servescope.prometheus import prometheus_config

    return prometheus_config.promtool_verdict(config)


def command(binary: str, config: Path, host: str, port: int, table: KnobTable) -> list[str]:
    """Prometheus' command line; `table`: its retention and whether its lifecycle API is on (PROMETHEUS_*)."""
    # Data lives in the state dir, bounded by time and size so a long-lived laptop stack cannot fill a disk.
    cmd = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={paths.prometheus_dir() / 'data'}",
        f"--storage.tsdb.retention.time={table.text('PROMETHEUS_RETENTION', '15d')}",
        f"--storage.tsdb.retention.size={table.text('PROMETHEUS_RETENTION_SIZE', '1GB')}",
        f"--web.listen-address={host}:{port}",
    ]
    # The lifecycle API (POST /-/quit, /-/reload) takes no token and no origin check: any page the user's browser
    # opens could stop Prometheus. Nothing here needs it; only when asked.
    if table.switch("PROMETHEUS_LIFECYCLE"):
        cmd.append("--web.enable-lifecycle")
    return cmd
