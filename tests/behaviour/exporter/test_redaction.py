"""Credentials in engine URLs (user:password@) never reach the exporter's log, landing page or error lines."""

from __future__ import annotations

import socket

import pytest
import requests

from exporter import config as exporter_config
from exporter.cli import build_parser
from servescope.contracts.urls import credentials, redact
from tests.conftest import free_port, wait_http
from tests.exporter.test_config import start_exporter

SECRET = "s3cret-pw"


@pytest.mark.parametrize(
    "text, shown",
    [
        ("http://user:pw@127.0.0.1:8009/v1", "http://***@127.0.0.1:8009/v1"),
        ("https://token@host", "https://***@host"),
        ("http://:pw@host:1", "http://***@host:1"),
        ("http://host:1/path@not-userinfo", "http://host:1/path@not-userinfo"),
        ("http://host:1/?q=a@b", "http://host:1/?q=a@b"),
        (
            "GET http://u:p@h:1/metrics: timed out; also http://x:y@z",
            "GET http://***@h:1/metrics: timed out; also http://***@z",
        ),
        ("no url here, a@b", "no url here, a@b"),
    ],
)
def test_redact_hides_userinfo_only(text, shown):
    assert redact(text) == shown


def test_credentials_are_decoded_from_the_url():
    assert credentials("http://al%40ice:p%3Ass@h:1") == ("al@ice", "p:ss")
    assert credentials("http://h:1") is None


def test_a_config_error_about_a_url_does_not_echo_its_password(monkeypatch):
    monkeypatch.setenv("VLLM_URL", f"ftp://user:{SECRET}@127.0.0.1:8009")
    with pytest.raises(exporter_config.ConfigError) as caught:
        exporter_config.load(build_parser().parse_args([]))
    assert "VLLM_URL" in str(caught.value) and SECRET not in str(caught.value)


def test_the_exporter_never_shows_the_password_of_an_engine_url():
    """BUG: VLLM_URL=http://user:pass@host printed the password in 4 log lines and the landing page."""
    port, proxy_port = free_port(), free_port()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]
    proc = start_exporter(
        "--port",
        str(port),
        "--proxy-port",
        str(proxy_port),
        VLLM_URL=f"http://user:{SECRET}@127.0.0.1:{dead}",
        OLLAMA_URL=f"http://user:{SECRET}@127.0.0.1:{dead}",
    )
    try:
        landing = wait_http(f"http://127.0.0.1:{port}/", timeout=20, proc=proc).text
        assert f"http://***@127.0.0.1:{dead}" in landing and SECRET not in landing
        metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text  # both engines down: logged
        assert 'servescope_engine_up{engine="vllm",instance="vllm"} 0.0' in metrics and SECRET not in metrics
        # the proxy's upstream is unreachable: logged too
        assert requests.post(f"http://127.0.0.1:{proxy_port}/api/chat", json={}, timeout=10).status_code == 502
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    assert "vllm vllm down" in stderr and "unreachable" in stderr and "listening" in stderr, stderr
    assert SECRET not in stderr, stderr
