"""The client /metrics endpoint stays up one scrape interval after a headless run, so Prometheus gets the final samples."""

from __future__ import annotations

import subprocess
import time
from contextlib import AbstractContextManager
from pathlib import Path

import requests

from tests.conftest import free_port
from tests.doubles.synthetic_openai import SyntheticServer
from tests.harness import run_cli, start_cli


def run_with_metrics(
    engine_url: str, tmp_path: Path, port: int, linger: str
) -> AbstractContextManager[subprocess.Popen]:
    return start_cli(
        "loadgen",
        "sequential",
        "--engine",
        f"vllm={engine_url}",
        "--results",
        str(tmp_path),
        "--metrics-port",
        str(port),
        "--metrics-linger",
        linger,
        "--max-tokens",
        "4",
        "--warmup",
        "0",
        "--quiet",
    )


def test_metrics_stay_up_after_the_last_request_then_the_port_closes(tmp_path):
    port = free_port()
    with SyntheticServer(ttft=0.01, itl=0.002, tokens=8) as engine:
        with run_with_metrics(engine.url, tmp_path, port, "3") as proc:
            deadline = time.monotonic() + 60
            lines = []
            for line in proc.stdout:  # bounded: the process ends by itself within seconds
                lines.append(line)
                if "client metrics stay up" in line or time.monotonic() > deadline:
                    break
            assert any("client metrics stay up 3 s" in line for line in lines), "".join(lines) + proc.stderr.read()
            # The run is over (its summary is written) yet the final counts are still scrapable.
            page = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            rest, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert 'servescope_client_requests_total{engine="vllm",outcome="ok",scenario="sequential"} 3.0' in page
    assert rest.strip().splitlines()[-1].startswith("run folder: ")  # still the last line
    try:
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
        raise AssertionError("the metrics port is still open after the process exited")
    except requests.ConnectionError:
        pass


def test_zero_linger_exits_at_once_and_says_nothing(tmp_path):
    port = free_port()
    with SyntheticServer(ttft=0.01, itl=0.002, tokens=8) as engine:
        with run_with_metrics(engine.url, tmp_path, port, "0") as proc:
            stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "stay up" not in stdout


def test_a_bad_linger_is_a_one_line_usage_error(tmp_path):
    proc = run_cli(
        "loadgen",
        "sequential",
        "--engine",
        "vllm=http://127.0.0.1:9",
        "--results",
        str(tmp_path),
        "--metrics-linger",
        "-1",
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "python -m loadgen sequential: error: argument --metrics-linger: expected a number of seconds from 0 to 600, "
        "got '-1'"
    ]
