"""The report never shows, nor keeps, the password of the Prometheus it asks (issue 42 case 14)."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import free_port
from tests.harness import run_cli
from tests.paths import RUNS

pytestmark = pytest.mark.timeout(300)


def test_a_password_in_prometheus_is_in_no_line_and_no_file(tmp_path):
    run = tmp_path / "seed"
    shutil.copytree(RUNS / "seed-vllm-ollama", run)
    url = f"http://bob:PW@127.0.0.1:{free_port()}"  # nothing listens: every Prometheus line is an error line
    proc = run_cli("report", "--run", str(run), "--prometheus", url, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "PW" not in proc.stdout + proc.stderr and "http://***@127.0.0.1" in proc.stderr
    for name in ("report.md", "report.json", "report.html"):
        assert "bob:PW" not in (run / name).read_text(), name
