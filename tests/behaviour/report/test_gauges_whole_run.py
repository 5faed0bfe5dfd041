"""Server-side sampling end to end on the doubles: `python -m loadgen burst` sampling the real exporter over the synthetic engine, then the report.

The synthetic engine schedules like the engines it stands in for (max_running = vLLM's
--max-num-seqs / llama.cpp's --parallel; serial_prefill = vLLM's chunked prefill), so a burst of
3 shorter than one second queues exactly as llama.cpp with --parallel 1 was seen to.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from servescope.contracts import series
from servescope.report import cli as report_cli
from servescope.report import figures, plots
from servescope.report import gauges as report_gauges
from servescope.report.load import load
from tests.conftest import free_port
from tests.doubles.synthetic_openai import SyntheticServer
from tests.harness import run_cli
from tests.servescope.prometheus.test_sampler import EngineExporter

R, W, K = series.REQUESTS_RUNNING, series.REQUESTS_WAITING, series.KV_CACHE_USAGE
# A burst of 3 shorter than a second, read every 100 ms: a busy CPU stretches it past what the tests assert.
pytestmark = pytest.mark.serial


def burst_run(
    tmp_path: Path, engine_url: str, exporter_url: str, *, interval_ms: int = 100, kind: str = "vllm"
) -> Path:
    """`python -m loadgen burst` (3 at once, no warm-up) with the run's sampler reading `exporter_url`."""
    env = {**os.environ, "SAMPLE_EXPORTER_URL": exporter_url, "SAMPLE_INTERVAL_MS": str(interval_ms)}
    options = f"--burst-size 3 --max-tokens 20 --warmup 0 --results {tmp_path} --run-id run --metrics-port 0 --quiet"
    proc = run_cli("loadgen", "burst", "--engine", f"{kind}={engine_url}", *options.split(), env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "run"


def report_numbers(run_dir: Path) -> dict:
    """The report with no Prometheus at all: everything about the gauges comes from the run folder."""
    assert report_cli.main(["--run", str(run_dir), "--prometheus", f"http://127.0.0.1:{free_port()}"]) == 0
    return json.loads((run_dir / "report.json").read_text())


def test_max_num_seqs_2_and_a_burst_of_3_shows_running_2_waiting_1_and_the_lever(tmp_path):
    with (
        SyntheticServer(ttft=0.05, itl=0.01, tokens=20, max_running=2) as engine,
        EngineExporter({"vllm": engine.url}) as exporter,
    ):
        run_dir = burst_run(tmp_path, engine.url, exporter.url)
    (phase,) = load(run_dir).phases
    assert phase.wall_s < 1.0  # shorter than one native Prometheus scrape
    numbers = report_numbers(run_dir)
    g = numbers["gauges"]["engines"]["vllm"]
    assert g["source"] == "samples" and g["spacing_s"] == pytest.approx(0.1)
    assert g["phase_peaks"]["burst-1"][R] == 2 and g["phase_peaks"]["burst-1"][W] == 1
    assert g["coverage"]["burst-1"]["samples"] >= 3 and g["coverage"]["burst-1"]["missing"] == 0
    (verdict,) = numbers["verdict"]["verdicts"]
    assert verdict["lever"] == "max_num_seqs" and verdict["text"].startswith("raise --max-num-seqs")
    assert not verdict["disagreement"]
    (drain,) = numbers["sweeps"]["bursts"]
    assert drain["served_after"] == 1 and drain["gauge_drain_s"] is not None


def test_the_gauge_plot_lines_up_with_the_phase_bands_within_one_sample(tmp_path):
    with (
        SyntheticServer(ttft=0.05, itl=0.01, tokens=20, max_running=1) as engine,
        EngineExporter({"vllm": engine.url}) as exporter,
    ):
        run_dir = burst_run(tmp_path, engine.url, exporter.url)
    run = load(run_dir)
    report = report_gauges.collect(run, f"http://127.0.0.1:{free_port()}")
    trace = figures.gauge_traces(run, report)["vllm"]
    ((_, band_start, band_end),) = trace["bands"]
    interval = report.engines["vllm"].spacing_s
    xs, running = trace[R]
    busy = [x for x, v in zip(xs, running, strict=True) if v == v and v > 0]
    # Each read is drawn at its own time and stands until the next: the band's edges fall between the last read
    # on one side of the change and the first read on the other, within one interval. (A read that a busy host
    # delays moves where the change is seen, not where it is drawn: the bracket holds; a shifted plot fails it.)
    before = max(x for x, v in zip(xs, running, strict=True) if x < busy[0] and v == 0)
    after = next(x for x, v in zip(xs, running, strict=True) if x > busy[-1] and v == 0)
    assert before - interval <= band_start <= busy[0] + interval
    assert busy[-1] - interval <= band_end <= after + interval
    assert max(v for v in trace[W][1] if v == v) == 2  # one slot, burst of 3
    assert plots.gauges(figures.gauges(run, report), tmp_path / "gauges.png").stat().st_size > 10_000


def test_under_sampled_gauges_disagree_with_the_clients_and_the_verdict_says_why(tmp_path, monkeypatch):
    """The old report's failure: a 5 s sampling (Prometheus' old scrape) over a sub-second burst saw nothing waiting."""
    monkeypatch.setenv("VLLM_MAX_NUM_SEQS", "1")  # what the stand-in runs with, as this checkout's knob
    with (
        SyntheticServer(ttft=0.05, itl=0.01, tokens=20, max_running=1) as engine,
        EngineExporter({"vllm": engine.url}) as exporter,
    ):
        run_dir = burst_run(tmp_path, engine.url, exporter.url, interval_ms=5000)
    numbers = report_numbers(run_dir)
    g = numbers["gauges"]["engines"]["vllm"]
    assert g["peaks"][W] == 0  # the reads before and after the burst: nothing waiting
    (verdict,) = numbers["verdict"]["verdicts"]
    assert "nothing waited" not in verdict["text"]
    assert verdict["lever"] == "max_num_seqs" and "the burst of 3 is more than the batch cap" in verdict["text"]
    assert "gauges under-sampled: " in verdict["disagreement"] and "samples every 5000 ms" in verdict["disagreement"]
    assert "2 of 3 first tokens only after another request had finished" in verdict["evidence"]


def test_prefill_one_at_a_time_is_not_called_a_queue_nor_nothing(tmp_path):
    """Disagreeing evidence the other way: all admitted (running 3, waiting 0), first tokens one by one."""
    with (
        SyntheticServer(ttft=0.15, itl=0.01, tokens=20, serial_prefill=True) as engine,
        EngineExporter({"vllm": engine.url}) as exporter,
    ):
        run_dir = burst_run(tmp_path, engine.url, exporter.url)
    numbers = report_numbers(run_dir)
    g = numbers["gauges"]["engines"]["vllm"]
    assert g["phase_peaks"]["burst-1"][R] == 3 and g["phase_peaks"]["burst-1"][W] == 0
    (verdict,) = numbers["verdict"]["verdicts"]
    assert verdict["lever"] == "none" and "admitted at once" in verdict["text"]
    assert "nothing waited" not in verdict["text"] and "prefill inside the batch" in verdict["disagreement"]
