"""Integration: a real Prometheus scrapes the real exporter watching the Ollama simulator and recorded vLLM/llama.cpp pages."""

from __future__ import annotations

import subprocess
import time

import requests

from servescope.prometheus import prometheus_config
from tests.conftest import free_port, stop_process, wait_http
from tests.doubles.ollama_simulator import OllamaSimulator
from tests.doubles.recorded_engine import RecordedEngine, fixture, vllm_engine
from tests.harness import spawn_cli

# Captured from the real llama-server while three streams shared its two slots.
LLAMACPP_METRICS_FIXTURE = "llamacpp-11434.0.0-metrics-busy.txt"
LLAMACPP_SLOTS_FIXTURE = "llamacpp-11434.0.0-slots-busy.json"


def llamacpp_engine() -> RecordedEngine:
    engine = RecordedEngine()
    engine.set_text("/metrics", fixture(LLAMACPP_METRICS_FIXTURE))
    engine.pages["/slots"] = (200, fixture(LLAMACPP_SLOTS_FIXTURE), "application/json")
    engine.pages["/v1/models"] = (200, fixture("llamacpp-11434.0.0-v1-models.json"), "application/json")
    return engine


def poll(prometheus, promql: str, predicate, timeout: float = 30.0) -> list[dict]:
    """Instant-query until the result satisfies predicate (Prometheus scrapes every second here)."""
    deadline = time.monotonic() + timeout
    result: list[dict] = []
    while time.monotonic() < deadline:
        result = prometheus.query(promql)
        if predicate(result):
            return result
        time.sleep(0.3)
    raise AssertionError(f"{promql!r} never satisfied the check; last result {result}")


def by_engine(result: list[dict]) -> dict[str, float]:
    return {r["metric"]["engine"]: float(r["value"][1]) for r in result}


def test_prometheus_reads_the_engine_neutral_series(tmp_path, prometheus_server):
    vllm = vllm_engine("vllm-0.9.1-cpu-metrics.txt").start()
    llamacpp = llamacpp_engine().start()
    ollama = OllamaSimulator(token_delay=0.002, load_delay=0.01).start()
    port, proxy_port = free_port(), free_port()
    (tmp_path / "exporter.yml").write_text(
        f"port: {port}\ntimeout_seconds: 0.5\nengines:\n"
        f"  - {{kind: vllm, name: vllm, url: '{vllm.url}'}}\n"
        f"  - {{kind: llamacpp, name: llamacpp, url: '{llamacpp.url}'}}\n"
        f"  - {{kind: ollama, name: ollama, url: '{ollama.url}', proxy_port: {proxy_port}, num_parallel: 1}}\n"
    )
    exporter = spawn_cli(
        *["exporter", "--config", str(tmp_path / "exporter.yml")],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "exporter.log", "w"),
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/metrics", timeout=30, proc=exporter)
        final = requests.post(
            f"http://127.0.0.1:{proxy_port}/api/chat",
            timeout=10,
            json={
                "model": "smollm2-135m",
                "messages": [{"role": "user", "content": "hello"}],
                "stream": False,
                "options": {"num_predict": 9},
            },
        ).json()
        assert final["eval_count"] == 9

        # The project's one scrape-config source: it sets honor_labels on the exporter job, so the
        # exporter's `instance` label (the configured engine name) wins over the target address.
        prometheus = prometheus_server.start(
            prometheus_config.render(
                [prometheus_config.Target("exporter", f"127.0.0.1:{port}")], scrape_interval="1s", rule_files=()
            )
        )
        up = poll(prometheus, "servescope_engine_up", lambda r: len(r) == 3 and all(x["value"][1] == "1" for x in r))
        assert {r["metric"]["instance"] for r in up} == {"vllm", "llamacpp", "ollama"}  # the exporter's label wins

        running = by_engine(prometheus.query("servescope_requests_running"))
        waiting = by_engine(prometheus.query("servescope_requests_waiting"))
        assert set(running) == set(waiting) == {"vllm", "llamacpp", "ollama"}
        assert running["vllm"] == 0.0 and running["ollama"] == 0.0
        assert running["llamacpp"] == 2.0 and waiting["llamacpp"] == 1.0  # captured: 3 streams, 2 slots
        kv = by_engine(prometheus.query("servescope_kv_cache_usage_ratio"))
        assert set(kv) == {"vllm", "llamacpp"} and 0.0 < kv["llamacpp"] < 1.0
        assert by_engine(prometheus.query("servescope_kv_cache_max_concurrency"))["vllm"] == 22.75
        assert by_engine(prometheus.query('servescope_generated_tokens_total{engine="ollama"}')) == {"ollama": 9.0}
        assert by_engine(prometheus.query("servescope_generated_tokens_total"))["vllm"] == 246.0
        models = {r["metric"]["engine"]: r["metric"]["model"] for r in prometheus.query("servescope_requests_running")}
        assert models["vllm"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and models["ollama"] == "smollm2-135m:latest"

        # One engine going away shows as up 0; the others keep being reported.
        vllm.stop()
        poll(prometheus, 'servescope_engine_up{engine="vllm"}', lambda r: r and r[0]["value"][1] == "0")
        assert by_engine(prometheus.query("servescope_engine_up")) == {"vllm": 0.0, "llamacpp": 1.0, "ollama": 1.0}
        fresh = prometheus.query("timestamp(servescope_requests_running) > time() - 3")
        assert {"llamacpp", "ollama"} <= set(by_engine(fresh))
        assert "vllm" not in by_engine(fresh)
        assert exporter.poll() is None
    finally:
        stop_process(exporter, 10)
        llamacpp.stop()
        ollama.stop()
        try:
            vllm.stop()
        except OSError:
            pass
