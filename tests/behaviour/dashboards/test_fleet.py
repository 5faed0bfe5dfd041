"""The fleet dashboard on a live Prometheus in both modes: every panel has data, and the neutral series are the same.

Three instances of the fleet double (tests/doubles/fleet_engine.py: the recorded vLLM 0.32 page, values moving) are
read either by the real exporter that Prometheus scrapes (METRICS_MODE=exporter) or by Prometheus itself through a
target file with the fleet rules (METRICS_MODE=fleet). Grafana cannot run here: the panels' queries are replayed
through query_range with the variables substituted as Grafana does (dashboards/render.py).
"""

from __future__ import annotations

import math
import time

import pytest

from dashboards import build, render
from servescope.contracts import metrics_mode, series
from servescope.prometheus import prometheus_config as pc
from tests.conftest import free_port, stop_process, wait_http
from tests.doubles.fleet_engine import MODEL
from tests.harness import spawn_cli

pytestmark = pytest.mark.slow
INSTANCES = 3
SCRAPE = "1s"


@pytest.fixture
def fleet_double():
    port = free_port()
    proc = spawn_cli("tests.doubles.fleet_engine", "--port", port, "--instances", INSTANCES, stdout=None, stderr=None)
    try:
        wait_http(f"http://127.0.0.1:{port}/i/0/version", timeout=30, proc=proc)
        yield port
    finally:
        stop_process(proc)


def names() -> list[str]:
    return [f"vllm-{i:04d}" for i in range(INSTANCES)]


def fleet_config(tmp_path, port: int) -> str:
    targets = tmp_path / "vllm.json"
    targets.write_text(
        pc.file_sd(
            (f"127.0.0.1:{port}", {"instance": name, "__metrics_path__": f"/i/{i}/metrics"})
            for i, name in enumerate(names())
        )
    )
    return pc.render(
        [],
        scrape_interval=SCRAPE,
        rule_files=pc.native_rule_files(metrics_mode.FLEET),
        discovered=[pc.Discovered("vllm", files=(str(targets),), refresh="1s")],
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", metrics_mode.MODES)
def test_every_fleet_panel_has_data_and_the_series_are_the_same_in_both_modes(
    prometheus_server, fleet_double, tmp_path, mode
):
    exporter = None
    try:
        if mode == metrics_mode.FLEET:
            config = fleet_config(tmp_path, fleet_double)
        else:
            port = free_port()
            engines = "".join(
                f"  - {{kind: vllm, name: {name}, url: 'http://127.0.0.1:{fleet_double}/i/{i}'}}\n"
                for i, name in enumerate(names())
            )
            (tmp_path / "exporter.yml").write_text(f"port: {port}\ntimeout_seconds: 0.6\nengines:\n{engines}")
            exporter = spawn_cli(
                *["exporter", "--config", tmp_path / "exporter.yml", "--metrics-mode", mode], stdout=None, stderr=None
            )
            wait_http(f"http://127.0.0.1:{port}/", timeout=30, proc=exporter)
            config = pc.render(
                [pc.Target("exporter", f"127.0.0.1:{port}")],
                scrape_interval=SCRAPE,
                rule_files=pc.native_rule_files(mode),
            )
        prometheus_server.start(config)
        query = f'{series.REQUESTS_RUNNING}{{engine="vllm"}}'
        found = prometheus_server.wait_for(query, timeout=60)
        for _ in range(60):  # every instance, and ten scrapes of each for the rates
            if len(found) == INSTANCES and prometheus_server.query(f"count_over_time({query}[20s]) >= 10"):
                break
            time.sleep(1)
            found = prometheus_server.query(query)
        assert sorted(r["metric"]["instance"] for r in found) == names()
        assert {r["metric"]["model"] for r in found} == {MODEL}
        # the same labels either way (the exporter's series also carry the job of its scrape)
        assert {frozenset(r["metric"]) - {"job"} for r in found} == {
            frozenset({"__name__", "engine", "instance", "model"})
        }
        board = build.fleet_dashboard()
        variables = render.panel_variables(board, {})
        end = time.time()
        for panel in (p for p in board["panels"] if p["type"] != "row"):
            for target in panel["targets"]:
                expr = render.substitute(target["expr"], variables, step=1.0, rate_interval="4s")
                result = render.query_range(prometheus_server.url, expr, end - 10, end, 1.0)
                finite = [float(v) for s in result for _, v in s["values"] if not math.isnan(float(v))]
                assert finite, f"{mode}: {panel['title']} / {target['refId']}: no data for {expr}"
    finally:
        if exporter is not None:
            stop_process(exporter)
