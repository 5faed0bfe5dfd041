"""Gaps drawn as gaps: time nobody read (a stack that was down, a read that got no value) is never a line across."""

from __future__ import annotations

import math
import subprocess
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dashboards import render  # noqa: E402
from dashboards.build import DASHBOARDS  # noqa: E402
from servescope.contracts import series
from servescope.contracts.runfolder import PhaseRecord, RunFolder, SampleRecord, append_samples
from servescope.prometheus.sampler import split_at_gaps
from servescope.report import figures, plots
from servescope.report.gauges import collect
from servescope.report.load import load
from tests.conftest import free_port  # noqa: E402

R, W = series.REQUESTS_RUNNING, series.REQUESTS_WAITING


def test_split_at_gaps_marks_the_pause_one_spacing_after_the_last_read():
    points = [(0.0, 1.0), (0.1, 2.0), (0.2, None), (0.3, 1.0), (1.0, 0.0), (1.1, 0.0)]
    assert split_at_gaps(points, 0.1) == [
        (0.0, 1.0),
        (0.1, 2.0),
        (0.2, None),
        (0.3, 1.0),
        (0.4, None),
        (1.0, 0.0),
        (1.1, 0.0),
    ]
    assert split_at_gaps(points, None) == points


def test_dashboard_render_draws_a_stack_that_was_down_as_a_gap(prometheus_server, tmp_path):
    """running climbed 0 -> 3 while the stack ran, then nothing for 25 minutes: Grafana shows nothing there, so do we."""
    t0 = int(time.time()) - 2400
    labels = 'engine="vllm",instance="vllm",model="m"'
    lines = ["# TYPE servescope_requests_running gauge"]
    for dt in list(range(0, 301, 5)) + list(range(1800, 2101, 5)):
        lines.append(f"servescope_requests_running{{{labels}}} {3 if dt >= 1800 else dt // 100} {t0 + dt}")
    (tmp_path / "backfill.om").write_text("\n".join(lines) + "\n# EOF\n")
    subprocess.run(
        [
            "promtool",
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(tmp_path / "backfill.om"),
            str(tmp_path / "data"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    prometheus_server.start("global:\n  scrape_interval: 5s\n")
    board = DASHBOARDS["engine-comparison"]()
    panels = render.panel_data(board, prometheus_server.url, t0, t0 + 2100)
    (panel,) = [p for p in panels if p.title == "Running requests"]
    (running,) = panel.series
    # Prometheus answers for 5 minutes after the last sample (its lookback), then has nothing until the stack is back.
    points = list(zip(running.times, running.values, strict=True))
    assert not [v for t, v in points if t0 + 620 < t < t0 + 1790 and not math.isnan(v)]
    before = max(i for i, (t, v) in enumerate(points) if t < t0 + 1000 and not math.isnan(v))
    assert math.isnan(points[before + 1][1]) and points[before + 2][0] >= t0 + 1800  # one NaN: no line across
    assert [v for v in running.values if not math.isnan(v)][-1] == 3
    fig, ax = plt.subplots()
    render.draw(panel, ax, t0, t0 + 2100)
    (line,) = ax.lines
    assert any(math.isnan(v) for v in line.get_ydata())  # matplotlib breaks the line there
    plt.close(fig)


def test_report_gauge_plot_draws_missing_and_late_reads_as_gaps(tmp_path):
    folder = RunFolder.create(tmp_path, "run")
    folder.write_manifest({"run_id": "run", "started_at": 100.0, "ended_at": 102.0})
    folder.append_phase(PhaseRecord("vllm", "vllm", "burst", "burst-1", 100.0, 102.0, 3, 3, "seed3", "x", 48))
    records = []
    for k in range(21):
        t = 100.0 + k * 0.1
        if 5 <= k <= 7:  # the engine's /metrics did not answer
            records.append(SampleRecord(t, 0.5, 0.1, "vllm", "vllm", "burst", missing="engine_up 0"))
        elif 12 <= k <= 15:  # nobody read: the exporter answered late
            continue
        else:
            records.append(SampleRecord(t, 0.002, 0.1, "vllm", "vllm", "burst", {R: 1.0, W: 2.0}))
    append_samples(folder, records)
    run = load(folder.path)
    report = collect(run, f"http://127.0.0.1:{free_port()}")
    eg = report.engines["vllm"]
    assert eg.source == "samples" and eg.coverage["burst-1"].missing == 3 and eg.coverage["burst-1"].samples == 14
    xs, ys = figures.gauge_traces(run, report)["vllm"][W]
    nan_at = [round(x, 2) for x, y in zip(xs, ys, strict=True) if math.isnan(y)]
    assert nan_at == [0.5, 0.6, 0.7, 1.2]  # three missing reads, then the pause after the read at 1.1 s
    png = plots.gauges(figures.gauges(run, report), tmp_path / "gauges.png")
    assert png == tmp_path / "gauges.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_torn_or_odd_samples_file_costs_only_its_bad_records(tmp_path):
    folder = RunFolder.create(tmp_path, "run")
    folder.write_manifest({"run_id": "run", "started_at": 100.0, "ended_at": 101.0})
    folder.append_phase(PhaseRecord("vllm", "vllm", "burst", "burst-1", 100.0, 101.0, 3, 3, "seed3", "x", 48))
    append_samples(
        folder, [SampleRecord(100.0 + k * 0.1, 0.002, 0.1, "vllm", "vllm", None, {W: 1.0}) for k in range(5)]
    )
    with open(folder.path / "samples.jsonl", "a") as fh:
        fh.write(
            '{"t": "soon", "read_s": 0, "interval_s": 0.1, "engine": "vllm", "instance": "vllm"}\n{"t": 101.2, "re'
        )
    report = collect(load(folder.path), f"http://127.0.0.1:{free_port()}")
    assert report.engines["vllm"].source == "samples" and len(report.engines["vllm"].series[W]) == 5
    assert any("torn last record" in w for w in report.warnings)
    # One reader for every run-folder file (servescope/contracts/runreader.py): the bad record is named by field and line.
    assert any("1 record skipped, t: expected a number, got a string (line 6)" in w for w in report.warnings)
