"""The one Prometheus scrape config source: render(), the generated Compose file, and a real Prometheus loading it."""

from __future__ import annotations

import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from servescope.prometheus import prometheus_config as pc

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.tool("prometheus")


def test_render_groups_targets_by_job_and_keeps_engine_labels_on_exporter():
    text = pc.render(
        [
            pc.Target("exporter", "127.0.0.1:9464"),
            pc.Target("vllm", "127.0.0.1:8009", labels={"instance": "vllm"}),
            pc.Target("vllm", "127.0.0.1:8010", labels={"instance": "vllm-b"}),
            pc.Target("loadgen", "127.0.0.1:9465"),
        ],
        scrape_interval="2s",
        rule_files=("/rules/*.yml",),
    )
    config = yaml.safe_load(text)
    assert config["global"]["scrape_interval"] == "2s"
    assert config["global"]["evaluation_interval"] == "2s"
    assert config["global"]["scrape_timeout"] == "1600ms"  # below the interval, or Prometheus refuses it
    assert config["rule_files"] == ["/rules/*.yml"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert list(jobs) == ["exporter", "vllm", "loadgen"]
    # The exporter's series carry their own engine/instance labels: they must win over the target's.
    assert jobs["exporter"]["honor_labels"] is True and jobs["loadgen"]["honor_labels"] is True
    assert "honor_labels" not in jobs["vllm"]
    assert [sc["labels"]["instance"] for sc in jobs["vllm"]["static_configs"]] == ["vllm", "vllm-b"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"job": "vllm", "address": "localhost"}, "not host:port"),
        ({"job": "vllm", "address": "localhost:http"}, "not host:port"),
        ({"job": "vllm", "address": "h:1", "metrics_path": "metrics"}, "must start with /"),
        ({"job": "vllm", "address": "h:1", "discovery": "consul"}, "static or dns"),
    ],
)
def test_bad_targets_are_refused_with_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pc.Target(**kwargs)


def test_one_job_cannot_have_two_metrics_paths():
    with pytest.raises(ValueError, match="disagree on metrics_path"):
        pc.render([pc.Target("vllm", "a:1"), pc.Target("vllm", "b:1", metrics_path="/other")])


def test_bad_scrape_interval_is_refused():
    with pytest.raises(ValueError, match="scrape interval"):
        pc.render([pc.Target("exporter", "a:1")], scrape_interval="fast")


def test_compose_targets_cover_every_job():
    jobs = {t.job for t in pc.compose_targets()}
    assert jobs == set(pc.JOBS)


def test_generated_compose_file_is_up_to_date():
    assert pc.main(["--check"]) == 0


def test_check_fails_on_a_stale_file(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "prometheus.compose.yml"
    stale.write_text(pc.render_compose().replace("5s", "15s"))
    monkeypatch.setattr(pc, "COMPOSE_CONFIG", stale)
    monkeypatch.setattr(pc, "REPO_ROOT", tmp_path)
    assert pc.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert pc.main(["--write"]) == 0
    assert pc.main(["--check"]) == 0


@needs_promtool
def test_promtool_accepts_compose_config_and_native_config_with_rules(tmp_path):
    compose = subprocess.run([PROMTOOL, "check", "config", str(pc.COMPOSE_CONFIG)], capture_output=True, text=True)
    assert compose.returncode == 0, compose.stdout + compose.stderr
    native = tmp_path / "prometheus.yml"
    native.write_text(pc.render(pc.compose_targets()))  # default rule_files: the work tree's rules
    proc = subprocess.run([PROMTOOL, "check", "config", str(native)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # promtool checked each rule file the glob found: every file under prometheus/rules/.
    for rules in sorted(pc.RULES_DIR.glob("*.yml")):
        assert rules.name in proc.stdout


@needs_promtool
def test_promtool_rejects_a_broken_config(tmp_path):
    broken = tmp_path / "prometheus.yml"
    broken.write_text(pc.render([pc.Target("exporter", "a:1")]).replace("scrape_timeout: 4000ms", "scrape_timeout: 9s"))
    proc = subprocess.run([PROMTOOL, "check", "config", str(broken)], capture_output=True, text=True)
    assert proc.returncode != 0 and "scrape timeout greater than scrape interval" in proc.stdout + proc.stderr


class _ExporterPage(BaseHTTPRequestHandler):
    """A fixed exposition page with the exporter's own labels (engine, instance)."""

    body = (
        b"# TYPE servescope_engine_up gauge\n"
        b'servescope_engine_up{engine="vllm",instance="vllm"} 1\n'
        b'servescope_engine_up{engine="ollama",instance="ollama"} 0\n'
    )

    def do_GET(self):  # noqa: N802 -- http.server's naming
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def test_real_prometheus_loads_rendered_config_rules_and_keeps_exporter_instance_labels(prometheus_server):
    page = ThreadingHTTPServer(("127.0.0.1", 0), _ExporterPage)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{page.server_address[1]}"
        prometheus_server.start(pc.render([pc.Target("exporter", address)], scrape_interval="1s"))
        result = prometheus_server.wait_for('servescope_engine_up{job="exporter"}', timeout=30)
        instances = sorted(r["metric"]["instance"] for r in result)
        assert instances == ["ollama", "vllm"]  # not renamed to exported_instance
        import requests

        groups = requests.get(f"{prometheus_server.url}/api/v1/rules", timeout=5).json()["data"]["groups"]
        loaded = {g["name"] for g in groups}
        expected = set()
        for path in pc.RULES_DIR.glob("*.yml"):
            expected |= {g["name"] for g in yaml.safe_load(path.read_text())["groups"]}
        assert loaded == expected
    finally:
        page.shutdown()
        page.server_close()


def test_the_exporters_per_engine_budget_fits_inside_the_scrape_timeout():
    assert pc.engine_budget_s(pc.DEFAULT_SCRAPE_INTERVAL) == 3.0  # the exporter's own default
    assert pc.engine_budget_s(pc.NATIVE_SCRAPE_INTERVAL) == 0.6
    for interval in ("1s", "5s", "500ms", "1m"):
        assert pc.engine_budget_s(interval) * 1000 < int(pc._timeout_for(interval).removesuffix("ms"))
