"""Open-loop honesty: a rate run against an engine that stalls 2 s, with the client's in-flight ceiling at 1.

While the stalled request holds the client's only slot, the schedule's arrivals cannot be sent: they
go out late, each then served fast. Latency from the send hides that (coordinated omission); latency
from the schedule shows it, and the report flags the run.
"""

from __future__ import annotations

import json
import os

import pytest

from servescope.contracts import thresholds
from servescope.contracts.runfolder import RunFolder
from servescope.judgements import slo
from servescope.report import cli as report_cli
from tests.conftest import free_port
from tests.doubles.synthetic_openai import SyntheticServer
from tests.harness import run_cli


def test_a_2s_stall_shows_in_the_schedule_based_p99_not_the_send_based_one_and_the_report_flags_it(tmp_path):
    prompts = tmp_path / "prompts.txt"
    # 200 prompts; the 11th asks the engine to stall 2 s after its first (empty) chunk.
    prompts.write_text("".join(f"prompt {i}{' [[fault:stall=2]]' if i == 10 else ''}\n" for i in range(200)))
    with SyntheticServer(ttft=0.005, itl=0.002, tokens=4) as engine:
        proc = run_cli(
            "loadgen",
            "rate",
            "--engine",
            f"vllm={engine.url}",
            *f"--rate 40 --requests 200 --max-in-flight 1 --max-tokens 4 --warmup 0 --prompts {prompts}".split(),
            *f"--results {tmp_path} --run-id run --metrics-port 0 --quiet".split(),
            env={**os.environ, "SAMPLE_INTERVAL_MS": "0"},
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr
    records = list(RunFolder(tmp_path / "run").requests())
    assert len(records) == 200 and all(r.ok and r.scheduled_at is not None for r in records)
    stalled = [r for r in records if r.e2e_s > 1.9]
    assert len(stalled) == 1  # one request met the stall; the others were served in milliseconds
    late = [r for r in records if slo.schedule_lag(r) > 1.0]
    assert len(late) >= 20  # the arrivals due during the stall went out late

    assert report_cli.main(["--run", str(tmp_path / "run"), "--prometheus", f"http://127.0.0.1:{free_port()}"]) == 0
    numbers = json.loads((tmp_path / "run" / "report.json").read_text())
    (check,) = numbers["goodput"]["schedule"]["phases"]
    assert check["e2e_from_send"]["p99"] < 0.5  # one stalled request in 200 is above the send-based p99
    assert check["e2e_from_schedule"]["p99"] > 1.5  # the wait the schedule saw
    assert check["ttft_from_schedule"]["p99"] > 1.5 and check["ttft_from_send"]["p99"] < 0.5
    assert check["lag"]["p99"] > thresholds.SCHEDULE_LAG_P99_MAX_S and check["behind"]
    text = (tmp_path / "run" / "report.md").read_text()
    assert "BEHIND SCHEDULE" in text and "the client fell behind its schedule" in text
    # Goodput counts from the schedule too: the late requests are not good under a 0.5 s TTFT.
    (phase,) = numbers["goodput"]["phases"]
    assert phase["attainment"] <= 1 - len(late) / 200 + 1e-9


@pytest.mark.serial  # a schedule kept within 50 ms (p99) needs a CPU of its own
def test_a_rate_run_that_keeps_its_schedule_is_not_flagged(tmp_path):
    with SyntheticServer(ttft=0.005, itl=0.002, tokens=4) as engine:
        proc = run_cli(
            "loadgen",
            "rate",
            "--engine",
            f"vllm={engine.url}",
            *"--rate 20 --requests 40 --max-tokens 4 --warmup 0 --metrics-port 0 --quiet".split(),
            *f"--results {tmp_path} --run-id run".split(),
            env={**os.environ, "SAMPLE_INTERVAL_MS": "0"},
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr
    assert report_cli.main(["--run", str(tmp_path / "run"), "--prometheus", f"http://127.0.0.1:{free_port()}"]) == 0
    numbers = json.loads((tmp_path / "run" / "report.json").read_text())
    (check,) = numbers["goodput"]["schedule"]["phases"]
    assert not check["behind"] and check["lag"]["p99"] < thresholds.SCHEDULE_LAG_P99_MAX_S
    assert "BEHIND SCHEDULE" not in (tmp_path / "run" / "report.md").read_text()
