"""Benchmark: 1,000 vLLM pages scraped by Prometheus with the fleet rules, beside the exporter reading 100 and 1,000."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import requests

from bench.processes import REPO, python_module
from bench.proxy_overhead import free_port, percentile, wait_ready
from servescope.host.children import stop
from servescope.text import numbers

GOAL_RULE_EVAL_S = 1.0  # every rule group evaluated well inside its 5 s interval
GOAL_EXPORTER_SCRAPE_S = 5.0  # the exporter's own scrape at 1,000 engines, where it is still used
INTERVAL = "5s"
NOT_MEASURED = "not measured"  # a figure no query answered


def query(url: str, promql: str) -> list[dict]:
    resp = requests.get(f"{url}/api/v1/query", params={"query": promql}, timeout=30)
    resp.raise_for_status()
    return resp.json()["data"]["result"]


def scalar(url: str, promql: str) -> float | None:
    result = query(url, promql)
    return float(result[0]["value"][1]) if result else None


def start_prometheus(workdir: Path, fleet_port: int, targets: int, rules: str) -> tuple[subprocess.Popen, str]:
    """Debian's Prometheus on an ephemeral port, its data in workdir, the fleet found through a target file."""
    from servescope.contracts import metrics_mode
    from servescope.prometheus import fleet_rules
    from servescope.prometheus import prometheus_config as pc

    listen = f"127.0.0.1:{free_port()}"
    files = workdir / "vllm-fleet.json"
    files.write_text(
        pc.file_sd(
            (f"127.0.0.1:{fleet_port}", {"instance": f"vllm-{i:04d}", "__metrics_path__": f"/i/{i}/metrics"})
            for i in range(targets)
        )
    )
    config = workdir / "prometheus.yml"
    config.write_text(
        pc.render(
            [pc.Target("prometheus", listen)],
            scrape_interval=INTERVAL,
            rule_files=pc.native_rule_files(metrics_mode.FLEET) if rules == "all" else (str(fleet_rules.RULES_FILE),),
            discovered=[pc.Discovered("vllm", files=(str(files),), refresh="5s")],
        )
    )
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address={listen}",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(workdir / "prometheus.log", "w"),
    )
    return proc, f"http://{listen}"


def dashboard_queries(url: str, window: float) -> tuple[str, int, float]:
    """Every query of the fleet dashboard over the window as Grafana would send it: (slowest, how many, seconds)."""
    from dashboards import build, render

    board = build.fleet_dashboard()
    variables = render.panel_variables(board, {})
    end = time.time()
    timed: list[tuple[float, str]] = []
    for panel in (p for p in board["panels"] if p["type"] != "row"):
        for target in panel["targets"]:
            expr = render.substitute(target["expr"], variables, step=5.0, rate_interval="20s")
            started = time.perf_counter()
            render.query_range(url, expr, end - window, end, 5.0, timeout=60)
            timed.append((time.perf_counter() - started, f"{panel['title']} / {target['refId']}"))
    worst = max(timed)
    return f"{worst[0]:.3f} ({worst[1]})", len(timed), sum(t for t, _ in timed)


def fleet_mode(fleet_port: int, targets: int, warmup: float, window: float, rules: str) -> dict[str, str]:
    """Prometheus scraping `targets` pages every 5 s with the fleet rules: what it costs, as it measures itself."""
    workdir = Path(tempfile.mkdtemp(prefix="servescope-fleet-bench-"))
    proc, url = start_prometheus(workdir, fleet_port, targets, rules)
    try:
        wait_ready(f"{url}/-/ready", proc, timeout=60)
        deadline = time.monotonic() + 120
        while (scalar(url, 'count(up{job="vllm-fleet"} == 1)') or 0) < targets and time.monotonic() < deadline:
            time.sleep(2)
        time.sleep(warmup)
        process = psutil.Process(proc.pid)
        cpu_before, started = sum(process.cpu_times()[:2]), time.monotonic()
        evaluations: dict[str, list[float]] = {}
        while time.monotonic() - started < window:
            groups = requests.get(f"{url}/api/v1/rules", timeout=30).json()["data"]["groups"]
            for group in groups:
                evaluations.setdefault(group["name"], []).append(float(group["evaluationTime"]))
            time.sleep(5)
        elapsed = time.monotonic() - started
        cores = (sum(process.cpu_times()[:2]) - cpu_before) / elapsed
        rss = process.memory_info().rss
        span = f"{int(elapsed)}s"
        scrape = f'max_over_time(scrape_duration_seconds{{job="vllm-fleet"}}[{span}])'
        worst_group = max(evaluations, key=lambda name: max(evaluations[name]))
        fleet_group = evaluations.get("servescope-fleet-vllm", [])
        up = scalar(url, 'count(up{job="vllm-fleet"} == 1)')
        slowest_query, queries, all_queries = dashboard_queries(url, elapsed)
        return {
            "targets up": f"{numbers.fixed(up, 0, NOT_MEASURED)} of {targets}",
            "neutral series made (requests_running)": numbers.fixed(
                scalar(url, 'count(servescope_requests_running{engine="vllm"})'), 0, NOT_MEASURED
            ),
            "fleet-vllm group eval, max of samples (s)": numbers.fixed(max(fleet_group, default=None), 4, NOT_MEASURED),
            "fleet-vllm group eval, median (s)": numbers.fixed(
                percentile(fleet_group, 50) if fleet_group else None, 4, NOT_MEASURED
            ),
            "slowest group, max of samples (s)": f"{max(evaluations[worst_group]):.4f} ({worst_group})",
            "every group, max over window (s)": numbers.fixed(
                scalar(url, f"max(max_over_time(prometheus_rule_group_last_duration_seconds[{span}]))"), 4, NOT_MEASURED
            ),
            "scrape duration p50 (s)": numbers.fixed(scalar(url, f"quantile(0.5, {scrape})"), 4, NOT_MEASURED),
            "scrape duration p99 (s)": numbers.fixed(scalar(url, f"quantile(0.99, {scrape})"), 4, NOT_MEASURED),
            "scrape duration max (s)": numbers.fixed(scalar(url, f"max({scrape})"), 4, NOT_MEASURED),
            f"Prometheus CPU (cores) at {targets} targets": f"{cores:.3f}",
            f"Prometheus RSS (MB) at {targets} targets": f"{rss / 2**20:.0f}",
            "samples per scrape": numbers.fixed(
                scalar(url, 'avg(scrape_samples_scraped{job="vllm-fleet"})'), 0, NOT_MEASURED
            ),
            f"fleet dashboard: {queries} queries over the window, all (s)": f"{all_queries:.3f}",
            "fleet dashboard: slowest query (s)": slowest_query,
            "window (s)": f"{elapsed:.0f}",
        }
    finally:
        stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)


def exporter_mode(fleet_port: int, engines: int, scrapes: int) -> dict[str, str]:
    """The exporter reading `engines` of the same pages on each scrape (exporter mode): its scrape time."""
    workdir = Path(tempfile.mkdtemp(prefix="servescope-exporter-bench-"))
    port = free_port()
    config = workdir / "exporter.yml"
    lines = [f"port: {port}", "engines:"]
    lines += [
        f"  - {{kind: vllm, name: vllm-{i:04d}, url: 'http://127.0.0.1:{fleet_port}/i/{i}'}}" for i in range(engines)
    ]
    config.write_text("\n".join(lines) + "\n")
    proc = python_module("exporter", "--config", config, "--metrics-mode", "exporter")
    try:
        wait_ready(f"http://127.0.0.1:{port}/", proc, timeout=60)
        session = requests.Session()
        durations, down = [], 0
        for _ in range(scrapes + 1):  # the first reads each engine's identity too: left out
            started = time.perf_counter()
            text = session.get(f"http://127.0.0.1:{port}/metrics", timeout=120).text
            durations.append(time.perf_counter() - started)
            down = sum(
                1 for line in text.splitlines() if line.startswith("servescope_engine_up{") and line.endswith(" 0.0")
            )
        kept = durations[1:]
        return {
            "engines": str(engines),
            "first scrape (s)": f"{durations[0]:.2f}",
            "scrape p50 (s)": f"{percentile(kept, 50):.2f}",
            "scrape max (s)": f"{max(kept):.2f}",
            "engines down in the last scrape": str(down),
        }
    finally:
        stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_scale", description=__doc__)
    parser.add_argument("--targets", type=int, default=1000, help="vLLM pages Prometheus scrapes (default 1000)")
    parser.add_argument("--exporter-engines", default="100,1000", help="engine counts for the exporter-mode figure")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds after every target is up")
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured")
    parser.add_argument("--scrapes", type=int, default=3, help="exporter scrapes timed per engine count")
    parser.add_argument(
        "--rules",
        choices=("all", "fleet"),
        default="all",
        help="every rule fleet mode loads (default), or the fleet rules alone (their own cost)",
    )
    args = parser.parse_args(argv)
    try:
        counts = [int(n) for n in args.exporter_engines.split(",") if n.strip()]
    except ValueError:
        print(
            f"fleet_scale: --exporter-engines {args.exporter_engines!r}: expected numbers like 100,1000",
            file=sys.stderr,
        )
        return 2
    if shutil.which("prometheus") is None and not Path("/usr/bin/prometheus").exists():
        print("fleet_scale: Prometheus not found (Debian: apt-get install prometheus): not measured", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    fleet_port = free_port()
    double = python_module(
        "tests.doubles.fleet_engine", "--port", fleet_port, "--instances", max([args.targets, *counts])
    )
    try:
        wait_ready(f"http://127.0.0.1:{fleet_port}/i/0/version", double)
        print(f"  load average before: {open('/proc/loadavg').read().strip()} ({os.cpu_count()} cores)", flush=True)
        rules = "every rule fleet mode loads" if args.rules == "all" else "the fleet rules alone"
        print(
            f"  fleet mode: Prometheus scrapes {args.targets} recorded vLLM 0.32 pages every {INTERVAL} ({rules}) ...",
            flush=True,
        )
        fleet = fleet_mode(fleet_port, args.targets, args.warmup, args.window, args.rules)
        for key, value in fleet.items():
            print(f"    {key:<52} {value}")
        print(f"  load average after: {open('/proc/loadavg').read().strip()}", flush=True)
        slowest = float(fleet["slowest group, max of samples (s)"].split()[0])
        print(
            f"    goal: every rule group under {GOAL_RULE_EVAL_S:g} s: {'met' if slowest < GOAL_RULE_EVAL_S else 'NOT met'}"
        )
        for engines in counts:
            print(f"  exporter mode: the exporter reads {engines} of the same pages on each scrape ...", flush=True)
            row = exporter_mode(fleet_port, engines, args.scrapes)
            for key, value in row.items():
                print(f"    {key:<52} {value}")
            worst = float(row["scrape max (s)"])
            verdict = "met" if worst < GOAL_EXPORTER_SCRAPE_S else "NOT met: use METRICS_MODE=fleet"
            print(f"    goal: scrape under {GOAL_EXPORTER_SCRAPE_S:g} s: {verdict}")
        print(f"  load average after: {open('/proc/loadavg').read().strip()}", flush=True)
        return 0
    finally:
        stop(double)


if __name__ == "__main__":
    sys.exit(main())
