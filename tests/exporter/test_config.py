"""Exporter configuration and command line: env-only start, the YAML schema, one-line errors, port in use, landing page."""

from __future__ import annotations

import socket
import subprocess

import pytest
import requests

from exporter import config as exporter_config
from exporter.cli import build_parser
from tests.conftest import free_port, wait_http
from tests.harness import run_cli, spawn_cli

URL_ENVS = ("VLLM_URL", "LLAMACPP_URL", "OLLAMA_URL")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in (
        *URL_ENVS,
        "EXPORTER_PORT",
        "OLLAMA_PROXY_PORT",
        "OLLAMA_NUM_PARALLEL",
        "SERVESCOPE_BIND",
        "VLLM_API_KEY",
        "LLAMACPP_API_KEY",
    ):
        monkeypatch.delenv(key, raising=False)


def load(*argv: str) -> exporter_config.Config:
    return exporter_config.load(build_parser().parse_args(list(argv)))


def test_nothing_but_urls_from_the_environment(monkeypatch):
    monkeypatch.setenv("VLLM_URL", "http://127.0.0.1:8009/")
    monkeypatch.setenv("OLLAMA_URL", "http://127.0.0.1:11434")
    monkeypatch.setenv("OLLAMA_NUM_PARALLEL", "4")
    config = load()
    assert config.listen_address == "127.0.0.1"
    assert config.port == 9464
    assert [(i.kind, i.name, i.url) for i in config.instances] == [
        ("vllm", "vllm", "http://127.0.0.1:8009"),
        ("ollama", "ollama", "http://127.0.0.1:11434"),
    ]
    ollama = config.instances[1]
    assert (ollama.proxy_port, ollama.num_parallel) == (11435, 4)


def test_flags_override_the_environment(monkeypatch):
    monkeypatch.setenv("EXPORTER_PORT", "9999")
    monkeypatch.setenv("LLAMACPP_URL", "http://127.0.0.1:1")
    config = load("--port", "9123", "--llamacpp-url", "http://127.0.0.1:8081", "--timeout", "1.5")
    assert config.port == 9123
    assert config.instances[0].url == "http://127.0.0.1:8081"
    assert config.instances[0].timeout == 1.5


def test_no_engines_is_allowed():
    assert load().instances == ()


def test_api_keys_come_from_the_knobs_or_the_file_and_never_show(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_URL", "http://127.0.0.1:8009")
    monkeypatch.setenv("LLAMACPP_URL", "http://127.0.0.1:8081")
    monkeypatch.setenv("VLLM_API_KEY", "sk-vllm")
    vllm, llamacpp = load().instances
    assert (vllm.api_key, llamacpp.api_key) == ("sk-vllm", "")
    assert "sk-vllm" not in repr(vllm)
    path = tmp_path / "exporter.yml"
    path.write_text(
        "engines:\n  - {kind: vllm, name: a, url: 'http://h:1', api_key: sk-file}\n"
        "  - {kind: vllm, name: b, url: 'http://h:2'}\n  - {kind: ollama, name: c, url: 'http://h:3'}\n"
    )
    assert [i.api_key for i in load("--config", str(path)).instances] == ["sk-file", "sk-vllm", ""]
    path.write_text("engines:\n  - {kind: vllm, name: a, url: 'http://h:1', api_key: \"sk secret\\n\"}\n")
    with pytest.raises(exporter_config.ConfigError, match="engines\\[0\\].api_key: expected an API key") as caught:
        load("--config", str(path))
    assert "secret" not in str(caught.value)


VALID = """\
port: 9500
timeout_seconds: 2
engines:
  - {kind: vllm, name: vllm-a, url: "http://127.0.0.1:8009"}
  - {kind: vllm, name: vllm-b, url: "http://127.0.0.1:8010", timeout_seconds: 1}
  - {kind: llamacpp, name: llama, url: "http://127.0.0.1:8081"}
  - {kind: ollama, name: ollama, url: "http://127.0.0.1:11434", proxy_port: 11435, num_parallel: 2}
  - {kind: ollama, name: ollama-noproxy, url: "http://127.0.0.1:11436"}
"""


def test_yaml_lists_several_instances_per_kind(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_URL", "http://127.0.0.1:1")  # ignored: the file defines the engines
    path = tmp_path / "exporter.yml"
    path.write_text(VALID)
    config = load("--config", str(path))
    assert config.port == 9500
    assert [i.name for i in config.instances] == ["vllm-a", "vllm-b", "llama", "ollama", "ollama-noproxy"]
    assert [i.timeout for i in config.instances] == [2.0, 1.0, 2.0, 2.0, 2.0]
    assert config.instances[3].proxy_port == 11435 and config.instances[3].num_parallel == 2
    assert config.instances[4].proxy_port is None


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "engines:\n  - {kind: vllm, name: a, url: 'http://h:1'}\n  - {kind: vllm, name: b}\n",
            "config error: engines[1].url: missing",
        ),
        (
            "engines:\n  - {kind: triton, name: a, url: 'http://h:1'}\n",
            "config error: engines[0].kind: unknown engine kind 'triton'",
        ),
        (
            "engines:\n  - {kind: vllm, name: a, url: 'http://h:1'}\n  - {kind: vllm, name: a, url: 'http://h:2'}\n",
            "config error: engines[1].name: 'a' is used twice",
        ),
        ("engines:\n  - {kind: vllm, name: 'has space', url: 'http://h:1'}\n", "config error: engines[0].name:"),
        ("engines:\n  - {kind: vllm, name: a, url: 'ftp://h'}\n", "config error: engines[0].url: expected an http"),
        (
            "engines:\n  - {kind: vllm, name: a, url: 'http://h:1', proxy_port: 5}\n",
            "config error: engines[0].proxy_port: only meaningful for kind: ollama",
        ),
        (
            "engines:\n  - {kind: ollama, name: a, url: 'http://h:1', proxy_port: 70000}\n",
            "config error: engines[0].proxy_port: 70000 is not a TCP port",
        ),
        (
            "engines:\n  - {kind: ollama, name: a, url: 'http://h:1', num_parallel: 0}\n",
            "config error: engines[0].num_parallel: expected a positive integer",
        ),
        (
            "engines:\n  - {kind: vllm, name: a, url: 'http://h:1', timeout_seconds: -1}\n",
            "config error: engines[0].timeout_seconds:",
        ),
        ("engines:\n  - {kind: vllm, name: a, urll: 'http://h:1'}\n", "config error: engines[0].urll: unknown key"),
        ("port: 99999\n", "config error: port: 99999 is not a TCP port"),
        ("engines: {vllm: 1}\n", "config error: engines: expected a list"),
        ("prometheus: 1\n", "config error: prometheus: unknown key"),
        ("engines: [\n", "not valid YAML at line"),
        ("- just\n- a list\n", "expected a mapping"),
    ],
)
def test_invalid_config_is_one_line_naming_the_key(tmp_path, text, message):
    path = tmp_path / "bad.yml"
    path.write_text(text)
    with pytest.raises(exporter_config.ConfigError) as caught:
        load("--config", str(path))
    assert str(caught.value).startswith("config error: ") and message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_bad_env_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("OLLAMA_URL", "http://127.0.0.1:11434")
    monkeypatch.setenv("OLLAMA_NUM_PARALLEL", "lots")
    with pytest.raises(exporter_config.ConfigError, match="^config error: OLLAMA_NUM_PARALLEL: "):
        load()


def run_exporter(*argv: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return run_cli("exporter", *argv, env={"PATH": "/usr/bin:/bin"}, timeout=timeout)  # the harness adds PYTHONPATH


def test_cli_invalid_config_exits_2_with_one_line(tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text("engines:\n  - {kind: vllm, name: a}\n")
    result = run_exporter("--config", str(path))
    assert result.returncode == 2
    assert result.stderr.strip() == "config error: engines[0].url: missing"


def test_cli_port_in_use_is_one_line_naming_the_knob():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_exporter("--port", str(port))
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert (
        last
        == f"servescope-exporter: port {port} on 127.0.0.1 is already in use: set EXPORTER_PORT or --port to another port"
    )
    assert "Traceback" not in result.stderr


def test_cli_proxy_port_in_use_names_its_knob():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_exporter(
            "--port", str(free_port()), "--ollama-url", "http://127.0.0.1:1", "--proxy-port", str(port)
        )
    assert result.returncode == 1
    assert "OLLAMA_PROXY_PORT or --proxy-port" in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr


def start_exporter(*argv: str, **env: str) -> subprocess.Popen:
    """`python -m exporter ARGV` with only these environment variables (and the repo on PYTHONPATH), its output
    captured as text."""
    return spawn_cli("exporter", *argv, env={"PATH": "/usr/bin:/bin", **env})


def test_cli_serves_landing_page_and_metrics_then_stops_on_sigterm():
    port = free_port()
    proc = start_exporter("--port", str(port), VLLM_URL="http://127.0.0.1:1")
    try:
        landing = wait_http(f"http://127.0.0.1:{port}/", timeout=20, proc=proc)
        assert '<a href="/metrics">' in landing.text and "vllm" in landing.text
        metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert 'servescope_engine_up{engine="vllm",instance="vllm"} 0.0' in metrics
        proc.terminate()
        assert proc.wait(10) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
