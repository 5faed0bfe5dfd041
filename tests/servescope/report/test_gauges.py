"""Gauges, verdict and the vLLM cross-check against a real Prometheus whose TSDB is backfilled (promtool) with crafted samples."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from servescope.contracts import series, thresholds
from servescope.contracts.runfolder import PhaseRecord, RunFolder, SampleRecord, append_samples
from servescope.report import cli, compare, figures, gauges, render, sections
from servescope.report.gauges import Prometheus, PrometheusError, collect
from servescope.report.load import load
from tests.conftest import free_port
from tests.paths import RUNS

CONFIG = "global:\n  scrape_interval: 15s\n"


def shifted_copy(src: Path, dst: Path, offset: float) -> None:
    """The fixture moved in time: Prometheus drops blocks far older than its newest, so the run must be recent."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    for key in ("started_at", "ended_at"):
        if key in manifest:
            manifest[key] += offset
    (dst / "manifest.json").write_text(json.dumps(manifest))
    for name in ("requests.jsonl", "phases.jsonl"):
        out = []
        for line in (dst / name).read_text().splitlines():
            record = json.loads(line)
            for key in ("started_at", "ended_at"):
                if key in record:
                    record[key] += offset
            out.append(json.dumps(record))
        (dst / name).write_text("\n".join(out) + "\n")


def openmetrics(t0: int) -> str:
    """Samples every second for the seed fixture's timeline (phase times relative to t0, from the fixture)."""
    vllm_seq = [(0, 19.673), (22, 34.393)]
    vllm_burst = (36.5, 40.465)
    ollama_phases = [(45, 48.765), (50, 51.427), (53, 54.301)]

    def inside(rt, spans):
        return any(a <= rt <= b for a, b in spans)

    run = load(RUNS / "seed-vllm-ollama")
    base = 1796000000.0  # the fixture's own t0
    vllm_done = sorted(r.started_at - base + r.e2e_s for r in run.requests_of("vllm"))
    fams: dict[str, list[str]] = {}

    def add(name, labels, rt, value):
        fams.setdefault(name, []).append(f"{name}{{{labels}}} {value} {t0 + rt}")

    v = 'engine="vllm",instance="vllm",model="SmolLM2"'
    o = 'engine="ollama",exported_instance="ollama",instance="127.0.0.1:9464",job="exporter"'
    for rt in range(-10, 71):
        running = 3 if inside(rt, [vllm_burst]) else (1 if inside(rt, vllm_seq) else 0)
        add(series.REQUESTS_RUNNING, v, rt, running)
        add(series.REQUESTS_WAITING, v, rt, 0)
        add(series.KV_CACHE_USAGE, v, rt, 0.02 if running == 3 else (0.01 if running else 0))
        add(series.KV_BLOCK_SIZE, v, rt, 128)
        add(series.KV_BLOCKS, v, rt, 182)
        add(series.KV_CAPACITY_TOKENS, v, rt, 23296)
        add(series.KV_MAX_CONCURRENCY, v, rt, 22.75)
        add(series.REQUESTS_RUNNING, o, rt, 1 if inside(rt, ollama_phases) else 0)
        add(series.REQUESTS_WAITING, o, rt, {53: 2, 54: 1}.get(rt, 0))
        finished = sum(1 for d in vllm_done if d <= rt)
        # queue + prefill + decode = the 4.0 s vLLM records as each request's end-to-end time
        for metric, per_request in (("queue_time", 0.05), ("prefill_time", 0.1), ("decode_time", 3.85)):
            add(f"vllm:request_{metric}_seconds_sum", 'model_name="SmolLM2"', rt, round(finished * per_request, 6))
            add(f"vllm:request_{metric}_seconds_count", 'model_name="SmolLM2"', rt, finished)
        add("vllm:e2e_request_latency_seconds_sum", 'model_name="SmolLM2"', rt, round(finished * 4.0, 6))
        add("vllm:e2e_request_latency_seconds_count", 'model_name="SmolLM2"', rt, finished)
    text = []
    for name, lines in fams.items():
        text.append(f"# TYPE {name} {'gauge' if name.startswith('servescope') else 'unknown'}")
        text += lines
    return "\n".join(text) + "\n# EOF\n"


@pytest.fixture
def backfilled(prometheus_server, tmp_path):
    """A real Prometheus holding the crafted gauges, plus the seed run shifted to match them."""
    t0 = int(time.time()) - 600
    shifted_copy(RUNS / "seed-vllm-ollama", tmp_path / "run", t0 - 1796000000.0)
    source = tmp_path / "backfill.om"
    source.write_text(openmetrics(t0))
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source), str(tmp_path / "data")],
        check=True,
        capture_output=True,
        timeout=60,
    )
    prometheus_server.start(CONFIG)
    return prometheus_server, tmp_path / "run", t0


def test_gauges_peaks_verdict_kv_and_vllm_split(backfilled, capsys):
    server, run_dir, t0 = backfilled
    assert cli.main(["--run", str(run_dir), "--prometheus", server.url]) == 0
    numbers = json.loads((run_dir / "report.json").read_text())
    g = numbers["gauges"]
    assert g["available"], g["reason"]
    vllm, ollama = g["engines"]["vllm"], g["engines"]["ollama"]
    assert vllm["peaks"] == {series.REQUESTS_RUNNING: 3, series.REQUESTS_WAITING: 0, series.KV_CACHE_USAGE: 0.02}
    assert vllm["phase_peaks"]["sequential"][series.REQUESTS_RUNNING] == 1
    # Ollama's exporter series arrive with the exporter's name in exported_instance
    assert ollama["peaks"][series.REQUESTS_WAITING] == 2 and ollama["peaks"][series.KV_CACHE_USAGE] is None

    verdicts = {v["instance"]: v for v in numbers["verdict"]["verdicts"]}
    # The reference page's vLLM burst: running 3, nothing waiting, yet TTFT 0.2 / 0.4 / 0.6 s by arrival: no slot or KV
    # lever, and the verdict says where the first tokens' wait went instead of "nothing waited".
    vllm_verdict = verdicts["vllm"]
    assert vllm_verdict["lever"] == "none" and "oversized" in vllm_verdict["text"]
    assert "admitted at once" in vllm_verdict["text"] and "nothing waited" not in vllm_verdict["text"]
    assert "prefill inside the batch" in vllm_verdict["disagreement"]
    assert verdicts["ollama"]["lever"] == "ollama_num_parallel"
    assert "OLLAMA_NUM_PARALLEL (now 1)" in verdicts["ollama"]["text"]

    (kv,) = [a for a in numbers["verdict"]["kv_arithmetic"] if a["instance"] == "vllm"]
    assert kv["capacity_from_blocks"] == 182 * 128 == 23296  # the reference page's 1456 x 16 tokens
    assert kv["max_concurrency_computed"] == pytest.approx(22.75)  # the reference page's "22.75x"
    assert kv["blocks_per_sequence"] == 1 and kv["burst_blocks"] == 3  # (20 + 48) tokens < one 128-token block

    (cc,) = [c for c in numbers["crosscheck"]["engines"] if c["instance"] == "vllm"]
    assert cc["available"], cc["source"]
    assert cc["components_mean_s"]["queue"] == pytest.approx(0.05, rel=1e-6)
    assert cc["components_mean_s"]["compute"] == pytest.approx(0.1 + 3.85, rel=1e-6)
    client_mean = (19.604371 + 12.345679 + 9.234882) / 10
    assert cc["components_mean_s"]["transport"] == pytest.approx(client_mean - 4.0, rel=1e-5)

    (drain,) = [d for d in numbers["sweeps"]["bursts"] if d["instance"] == "ollama"]
    assert drain["gauge_drain_s"] == pytest.approx(2.0)  # waiting > 0 at +53 and +54 s, 0 at +55 s
    assert (run_dir / "gauges.png").stat().st_size > 10_000
    md = (run_dir / "report.md").read_text()
    assert "raise OLLAMA_NUM_PARALLEL (now 1)" in md and "23,296 tokens / 1,024 tokens max-model-len = 22.75x" in md


def test_prometheus_with_no_samples_in_the_window(backfilled):
    server, _, _ = backfilled
    run = load(RUNS / "live-failures")  # hours before anything in this TSDB
    report = collect(run, server.url)
    assert not report.available and report.reachable
    assert "answered but holds no samples" in report.reason


def test_unreachable_prometheus_is_a_reason_not_a_crash(tmp_path):
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"
    report = collect(load(RUNS / "seed-vllm-ollama"), url)
    assert not report.available and not report.reachable
    assert report.reason == f"Prometheus at {url} is unreachable (connection refused or no route)"
    with pytest.raises(PrometheusError, match="unreachable"):
        Prometheus(url).query("up", 0)
    assert math.isfinite(load(RUNS / "seed-vllm-ollama").started_at)


def test_prometheus_errors_are_one_line_each(backfilled):
    """Its own error for a bad query (HTTP 400 with JSON), a silent server, a page that is not JSON, not a URL."""
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    server, _, _ = backfilled
    with pytest.raises(PrometheusError, match=r"^Prometheus at .*: .*parse error"):
        Prometheus(server.url).query("sum(", 0)

    with socket.socket() as silent:  # accepts, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(PrometheusError, match=r"did not answer within 0.3s$"):
            Prometheus(url, timeout=0.3).query("up", 0)

    class Odd(BaseHTTPRequestHandler):
        """Answers by path: a page that is not JSON, success without data, an error whose body is cut short."""

        def do_GET(self):
            if self.path.startswith("/cut"):
                self.send_response(503)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                self.wfile.write(b'{"stat')
                self.close_connection = True
                return
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"status": "success"}' if self.path.startswith("/nodata") else b"<html>a page</html>")

        def log_message(self, *args):
            pass

    page = ThreadingHTTPServer(("127.0.0.1", 0), Odd)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{page.server_address[1]}"
    try:
        with pytest.raises(PrometheusError, match=r"answered HTTP 200 without JSON$"):
            Prometheus(base).query("up", 0)
        with pytest.raises(PrometheusError, match=r"answered success without its data$"):
            Prometheus(f"{base}/nodata").query("up", 0)
        with pytest.raises(
            PrometheusError, match=r"^Prometheus at .*/cut: connection closed after [0-9]+ bytes of the response$"
        ):
            Prometheus(f"{base}/cut").query("up", 0)
    finally:
        page.shutdown()
    for not_a_url in ("127.0.0.1:9090", "localhost"):
        with pytest.raises(PrometheusError, match=r"not a URL \(http://host:port\)$"):
            Prometheus(not_a_url).query("up", 0)


def _fleet_folder(tmp_path: Path, targets: dict[str, str], samples: dict[tuple[str, str], list[tuple[float, float]]]):
    """A run with one phase per target and, per (engine, instance) of the samples, (running, waiting) per read."""
    folder = RunFolder.create(tmp_path, "fleet")
    folder.write_manifest({"run_id": "fleet", "started_at": 100.0, "ended_at": 101.0})
    for instance, kind in targets.items():
        folder.append_phase(PhaseRecord(kind, instance, "burst", "burst-1", 100.0, 101.0, 3, 3, "seed3", "x", 48))
    records = []
    for (kind, instance), reads in samples.items():
        for k, (running, waiting) in enumerate(reads):
            values = {
                series.REQUESTS_RUNNING: running,
                series.REQUESTS_WAITING: waiting,
                series.KV_CACHE_USAGE: 0.1 * k,
            }
            records.append(SampleRecord(100.0 + 0.1 * k, 0.002, 0.1, kind, instance, "burst", values))
    append_samples(folder, records)
    return load(folder.path)


def test_replicas_behind_one_target_are_summed_and_summarised_not_interleaved(tmp_path):
    """A router's replicas, read one by one: the target's series is their sum per read (derived), each its own peaks."""
    run = _fleet_folder(
        tmp_path,
        {"router": "llamacpp"},
        {
            ("llamacpp", "r1"): [(1, 0), (1, 2), (1, 1)],
            ("llamacpp", "r2"): [(0, 0), (1, 0), (1, 0)],
            ("llamacpp", "r3"): [(1, 1), (1, 0), (0, 0)],
        },
    )
    report = collect(run, f"http://127.0.0.1:{free_port()}")
    eg = report.engines["router"]
    assert eg.series[series.REQUESTS_RUNNING] == [(100.0, 2.0), (100.1, 3.0), (100.2, 2.0)]
    assert eg.series[series.REQUESTS_WAITING] == [(100.0, 1.0), (100.1, 2.0), (100.2, 1.0)]
    (fleet,) = report.fleets
    assert fleet.behind == "router" and report.fleet_of("router") is fleet
    assert [m.instance for m in fleet.members] == ["r1", "r3", "r2"]  # busiest first
    assert [m.instance for m in fleet.queued] == ["r1", "r3"]
    assert fleet.spread(series.REQUESTS_WAITING) == (0.0, 1.0, 2.0)
    assert fleet.members[0].waiting_share == pytest.approx(2 / 3)
    text = render.markdown(render.Document("r", "", [sections._gauges(run, report, [])]))
    assert "A fleet of 3 llamacpp instances behind" in text and "2 of them had requests waiting" in text
    assert json.loads(json.dumps(gauges.to_json(report)))["fleets"][0]["queued"] == ["r1", "r3"]


def test_many_targets_of_one_kind_are_one_summary_and_one_derived_plot(tmp_path):
    n = thresholds.FLEET_SUMMARY_INSTANCES + 7
    names = [f"v{i:02d}" for i in range(n)]
    run = _fleet_folder(
        tmp_path,
        dict.fromkeys(names, "vllm"),
        {("vllm", name): [(1, 0), (2, i % 3), (1, 0)] for i, name in enumerate(names)},
    )
    report = collect(run, f"http://127.0.0.1:{free_port()}")
    (fleet,) = report.fleets
    assert fleet.behind is None and len(fleet.members) == n and len(fleet.queued) == 8
    assert fleet.total[series.REQUESTS_RUNNING] == [(100.0, n), (100.1, 2.0 * n), (100.2, n)]
    panels = figures.gauges(run, report)["panels"]
    assert len(panels) == 1 and "derived" in panels[0][0]
    text = render.markdown(render.Document("r", "", [sections._gauges(run, report, [])]))
    assert "Peaks over the run" not in text  # no row per instance
    top = text.split(f"A fleet of {n} vllm instances")[1]
    assert top.count("| v") == thresholds.FLEET_TOP_N


def test_fewer_targets_than_a_fleet_keep_their_own_rows(tmp_path):
    names = [f"v{i}" for i in range(thresholds.FLEET_SUMMARY_INSTANCES - 1)]
    run = _fleet_folder(tmp_path, dict.fromkeys(names, "vllm"), {("vllm", n): [(1, 0), (1, 1)] for n in names})
    report = collect(run, f"http://127.0.0.1:{free_port()}")
    assert report.fleets == [] and len(figures.gauges(run, report)["panels"]) == len(names)


def test_a_fleets_targets_are_not_compared_one_by_one_nor_their_series_repeated(tmp_path):
    """Replica k against replica 0 says nothing about an engine: left out of the within-run comparison, with why;
    their reads stay in samples.jsonl, not copied into report.json once per member."""
    names = [f"v{i}" for i in range(thresholds.FLEET_SUMMARY_INSTANCES)]
    run = _fleet_folder(tmp_path, dict.fromkeys(names, "vllm"), {("vllm", n): [(1, 0), (1, 1)] for n in names})
    assert gauges.fleet_kinds(run) == {"vllm"}
    deltas, how = compare.within_run(run)
    assert deltas == [] and f"the {len(names)} targets of the vllm fleet" in how
    engines = gauges.to_json(collect(run, f"http://127.0.0.1:{free_port()}"))["engines"]
    assert all(e["series"] == {} and "series_left_out" in e for e in engines.values())
