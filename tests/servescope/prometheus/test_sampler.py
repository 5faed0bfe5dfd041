"""The run's server-side samples: the real exporter reading the synthetic engine's /metrics, sampled every 100 ms into the run folder."""

from __future__ import annotations

import json
import threading
import time
import types
from http.server import BaseHTTPRequestHandler

import pytest
import requests

from exporter.config import Config, Instance
from exporter.server import build
from servescope.contracts import series
from servescope.contracts.runfolder import SAMPLES, RunFolder, read_samples
from servescope.contracts.settings import SamplerSettings
from servescope.prometheus.exposition import parse_exposition
from servescope.prometheus.sampler import (
    FROM_EXPORTER,
    FROM_PROMETHEUS,
    WANTED,
    Sampler,
    engine_values,
    prometheus_samples,
    source_kind,
)
from tests.conftest import free_port, serve_in_thread, wait_until
from tests.doubles.synthetic_openai import SyntheticServer
from tests.exporter.test_proxy import ExporterThread

R, W, K = series.REQUESTS_RUNNING, series.REQUESTS_WAITING, series.KV_CACHE_USAGE


class EngineExporter(ExporterThread):
    """The real exporter (collectors, /metrics) watching vLLM-like engines, served from a background event loop."""

    def __init__(self, engines: dict[str, str], timeout: float = 0.5):
        self.port = free_port()
        instances = tuple(Instance(kind="vllm", name=name, url=url, timeout=timeout) for name, url in engines.items())
        self.exporter = build(Config(port=self.port, instances=instances))
        self.url = f"http://127.0.0.1:{self.port}"


def burst(url: str, size: int, max_tokens: int = 20) -> list[dict]:
    """`size` streamed chat requests released together; each one's TTFT and end, client side (monotonic)."""
    barrier = threading.Barrier(size)
    results: list[dict] = [{} for _ in range(size)]

    def one(i: int) -> None:
        body = {
            "model": "synthetic/model",
            "messages": [{"role": "user", "content": f"prompt {i}"}],
            "max_tokens": max_tokens,
            "stream": True,
        }
        with requests.Session() as session:
            barrier.wait()
            sent = time.monotonic()
            with session.post(f"{url}/v1/chat/completions", json=body, stream=True, timeout=30) as resp:
                # Each HTTP chunk as it arrives: iter_lines' default 512-byte reads can hold the first token back
                # until more arrive, and byte-at-a-time reads take the CPU the sampler's reads need.
                for line in resp.iter_lines(chunk_size=None):
                    if b'"content":"tok' in line and "ttft" not in results[i]:
                        results[i]["ttft"] = time.monotonic() - sent
            results[i]["e2e"] = time.monotonic() - sent

    threads = [threading.Thread(target=one, args=(i,)) for i in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def wait_for(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    assert wait_until(predicate, timeout), f"timed out waiting for {what}"


@pytest.fixture
def folder(tmp_path) -> RunFolder:
    return RunFolder.create(tmp_path, "run")


def _engine_idle(url: str) -> bool:
    busy = frozenset(("vllm:num_requests_running", "vllm:num_requests_waiting"))
    page = parse_exposition(requests.get(f"{url}/metrics", timeout=5).text, busy)
    return all(value == 0 for name in busy for _, value in page.get(name, []))


@pytest.mark.serial  # the burst must stay under 1 s and no 100 ms read may be late: not with a CPU to share
def test_a_burst_shorter_than_a_second_is_seen_waiting(folder):
    """llama.cpp --parallel 1 as it was seen: a 0.7 s burst of 3 with one slot shows waiting 2 at 100 ms."""
    with (
        SyntheticServer(ttft=0.05, itl=0.01, tokens=20, max_running=1) as engine,
        EngineExporter({"vllm": engine.url}) as exp,
    ):
        sampler = Sampler(folder, exp.url, 0.1, expected=[("vllm", "vllm")])
        sampler.start("burst")
        started = time.time()
        results = burst(engine.url, 3)
        ended = time.time()
        # The client has its last chunk a moment before the server's handler counts the request done: the last
        # read is to see the drain, so it waits for the engine's own word that it drained.
        wait_for(lambda: _engine_idle(engine.url), what="the engine's running and waiting back at 0")
        sampler.stop()
        sampler.close()
    assert ended - started < 1.0, "the burst must be shorter than one 1 s scrape for this test to mean anything"
    ttfts = sorted(r["ttft"] for r in results)
    assert ttfts[1] - ttfts[0] > 0.15 and ttfts[2] - ttfts[1] > 0.15  # served one after another
    samples = [s for s in read_samples(folder) if s.instance == "vllm"]
    good = [s for s in samples if s.missing is None]
    assert len(good) >= 5 and len(good) == len(samples)
    assert max(s.values[W] for s in good) == 2
    assert max(s.values[R] for s in good) == 1
    assert max(s.values[K] for s in good) > 0
    # One clock with the request records; the last read comes after the burst and sees it drained.
    assert samples[0].t <= started + 0.1 and samples[-1].t >= ended
    assert samples[-1].values[R] == 0 and samples[-1].values[W] == 0
    gaps = [b.t - a.t for a, b in zip(samples, samples[1:], strict=False)][:-1]
    assert all(g < 0.2 for g in gaps), gaps  # no interval went unread
    assert samples[-1].values[series.GENERATED_TOKENS] == 60
    assert samples[0].values[series.KV_CAPACITY_TOKENS] == 23_296


def test_an_engine_that_stops_answering_metrics_is_marked_missing_never_invented(folder):
    with SyntheticServer(ttft=0.05, itl=0.01, tokens=10) as engine, EngineExporter({"vllm": engine.url}) as exp:
        sampler = Sampler(folder, exp.url, 0.1, expected=[("vllm", "vllm")])

        def records():
            return [json.loads(line) for line in (folder.path / SAMPLES).read_text().splitlines()]

        sampler.start("burst")
        wait_for(lambda: (folder.path / SAMPLES).exists() and len(records()) >= 2, what="first samples")
        requests.post(f"{engine.url}/control", json={"metrics_fault": "stall=5"}, timeout=5)
        wait_for(lambda: sum(1 for r in records() if r["missing"]) >= 3, what="missing samples")
        requests.post(f"{engine.url}/control", json={"metrics_fault": ""}, timeout=5)
        wait_for(lambda: not records()[-1]["missing"], what="samples again")
        sampler.stop()
        sampler.close()
    rows = records()
    missing = [r for r in rows if r["missing"]]
    assert missing and all(r["values"] == {} for r in missing)
    assert all("engine_up 0" in r["missing"] for r in missing)
    assert all(r["values"][R] == 0 for r in rows if not r["missing"])
    # The exporter gives up on the hung page after its per-engine timeout (0.5 s): those reads came late,
    # so the time they cover shows as gaps rather than as reads that never happened.
    stalled = [r["read_s"] for r in missing]
    assert min(stalled) >= 0.4


def test_an_unreachable_exporter_marks_the_runs_engines_missing(folder):
    url = f"http://127.0.0.1:{free_port()}"
    sampler = Sampler(folder, url, 0.1, expected=[("vllm", "vllm"), ("llamacpp", "llamacpp")])
    records = sampler.read_once()
    assert [(r.engine, r.missing) for r in records] == [
        ("vllm", f"exporter at {url}: connection refused"),
        ("llamacpp", f"exporter at {url}: connection refused"),
    ]
    assert sampler.failed_reads == 1
    assert [r.instance for r in read_samples(folder)] == ["vllm", "llamacpp"]


class _TestClock:
    """The sampler's clock and its stop event's waits, kept by the test: a wait moves the clock on at once.

    The schedule (when each read is due) is what is tested, so it is read on a clock the host's load cannot move: on
    the real one a busy host woke the sampler late and the gaps grew with the load, not with the schedule.
    """

    def __init__(self) -> None:
        self.now = 1000.0
        self.stopped = False

    def monotonic(self) -> float:
        return self.now

    # threading.Event's interface, as the sampler's loop uses it
    def clear(self) -> None:
        self.stopped = False

    def set(self) -> None:
        self.stopped = True

    def wait(self, timeout: float | None = None) -> bool:
        if not self.stopped:
            self.now += timeout or 0.0
        return self.stopped


def test_a_slow_first_read_does_not_stretch_the_first_interval(folder, monkeypatch):
    """The next read is due one interval after the first one began: a cold first read is no gap in the samples."""
    from servescope.prometheus import sampler as sampler_module

    clock = _TestClock()
    monkeypatch.setattr(sampler_module, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    began: list[float] = []

    class SlowFirstRead(Sampler):
        def read_once(self):
            began.append(clock.now)
            clock.now += 0.15 if len(began) == 1 else 0.0  # the first read takes 0.15 s, the others no time
            if len(began) == 4:
                clock.set()  # as close() would: the loop ends at its next wait
            return []

    sampler = SlowFirstRead(folder, "http://127.0.0.1:9", 0.1)
    sampler._stop = clock  # the loop waits for its next read on the test's clock
    sampler.start("burst")
    wait_for(lambda: len(began) >= 4, what="four reads")
    sampler.close()
    gaps = [round(b - a, 9) for a, b in zip(began, began[1:], strict=False)]
    # Due at 0.1 s, the second read comes as the first one ends (0.15 s), then the reads are back on the first one's
    # 0.1 s grid. Before: the second came 0.15 + 0.1 s after the first began, a gap to every reader (> GAP_FACTOR
    # intervals), and the grid moved with it.
    assert gaps == [0.15, 0.05, 0.1], gaps


def test_zero_interval_is_off(folder):
    sampler = Sampler(folder, "http://127.0.0.1:1", 0.0)
    sampler.start("burst")
    sampler.stop()
    assert not (folder.path / SAMPLES).exists()
    assert sampler.describe() == "server samples: off (SAMPLE_INTERVAL_MS=0)"


def test_engine_values_merge_models_and_drop_engines_that_are_down():
    page = "\n".join(
        [
            'servescope_engine_up{engine="ollama",instance="ollama"} 1',
            'servescope_engine_up{engine="vllm",instance="vllm"} 0',
            'servescope_requests_running{engine="ollama",instance="ollama",model="a:latest"} 1',
            'servescope_requests_running{engine="ollama",instance="ollama",model="b:latest"} 1',
            'servescope_requests_waiting{engine="ollama",instance="ollama",model="a:latest"} 2',
            'servescope_kv_cache_usage_ratio{engine="ollama",instance="ollama",model="a:latest"} 0.2',
            'servescope_kv_cache_usage_ratio{engine="ollama",instance="ollama",model="b:latest"} 0.5',
            'servescope_kv_cache_usage_ratio{engine="ollama",instance="ollama",model="c:latest"} NaN',
            'servescope_proxy_requests_in_flight{engine="ollama",instance="ollama"} 3',
            # Ollama's API down, its proxy still counting: what the exporter saw itself is kept.
            'servescope_engine_up{engine="ollama",instance="ollama-b"} 0',
            'servescope_requests_running{engine="ollama",instance="ollama-b",model="a:latest"} 1',
        ]
    )
    values = engine_values(parse_exposition(page, WANTED))
    assert values == {
        ("ollama", "ollama"): {R: 2.0, W: 2.0, K: 0.5},
        ("vllm", "vllm"): None,
        ("ollama", "ollama-b"): {R: 1.0},
    }


def test_the_exporter_answers_only_the_series_asked_for():
    with SyntheticServer() as engine, EngineExporter({"vllm": engine.url}) as exp:
        full = requests.get(f"{exp.url}/metrics", timeout=5).text
        few = requests.get(f"{exp.url}/metrics", params=[("name[]", R), ("name[]", W)], timeout=5).text
    assert "process_cpu_seconds_total" in full and "process_cpu_seconds_total" not in few
    assert R in few and W in few and K not in few


def test_sample_records_round_trip_through_the_run_folder(folder):
    from servescope.contracts.runfolder import SampleRecord, append_samples

    records = [
        SampleRecord(1.5, 0.002, 0.1, "vllm", "vllm", "burst", {R: 2.0, W: 1.0}),
        SampleRecord(1.6, 0.6, 0.1, "vllm", "vllm", "burst", missing="the exporter could not read this engine"),
    ]
    append_samples(folder, records)
    append_samples(folder, [])  # a read with nothing to write writes nothing
    assert list(read_samples(folder)) == records
    assert len((folder.path / SAMPLES).read_text().splitlines()) == 2


def test_the_exporters_names_replace_the_runs_once_it_answers(folder):
    """loadgen's `vllm:a` is the exporter's `vllm`: no record shadows the exporter's under a name it does not use."""
    with SyntheticServer() as engine, EngineExporter({"vllm": engine.url}) as exp:
        sampler = Sampler(folder, exp.url, 0.1, expected=[("vllm", "vllm:a")])
        (record,) = sampler.read_once()
    assert (record.engine, record.instance, record.missing) == ("vllm", "vllm", None)
    assert list(sampler.known) == [("vllm", "vllm")]


def _answer(*series_: tuple[dict, str]) -> str:
    return json.dumps(
        {
            "status": "success",
            "data": {"resultType": "vector", "result": [{"metric": m, "value": [1.0, v]} for m, v in series_]},
        }
    )


def test_prometheus_answers_become_the_exporter_pages_samples():
    """Fleet mode: rule-made series carry the engine's own `instance`, the exporter's scraped ones `exported_instance`;
    models add up as on the exporter's page; an instance without engine_up stands by its series; NaN is no value."""
    page = _answer(
        ({"__name__": series.REQUESTS_WAITING, "engine": "vllm", "instance": "a", "model": "m1"}, "2"),
        ({"__name__": series.REQUESTS_WAITING, "engine": "vllm", "instance": "a", "model": "m2"}, "3"),
        ({"__name__": series.KV_CACHE_USAGE, "engine": "vllm", "instance": "a", "model": "m1"}, "0.4"),
        ({"__name__": series.KV_CACHE_USAGE, "engine": "vllm", "instance": "a", "model": "m2"}, "0.7"),
        ({"__name__": series.REQUESTS_RUNNING, "engine": "vllm", "instance": "b"}, "NaN"),
        (
            {
                "__name__": series.REQUESTS_RUNNING,
                "engine": "llamacpp",
                "instance": "exp:9464",
                "exported_instance": "l1",
            },
            "1",
        ),
        ({"__name__": series.ENGINE_UP, "engine": "llamacpp", "instance": "exp:9464", "exported_instance": "l2"}, "0"),
        ({"__name__": "up", "instance": "a"}, "1"),
    )
    values = engine_values(prometheus_samples(page))
    assert values == {
        ("vllm", "a"): {series.REQUESTS_WAITING: 5.0, series.KV_CACHE_USAGE: 0.7},
        ("llamacpp", "l1"): {series.REQUESTS_RUNNING: 1.0},
        ("llamacpp", "l2"): None,
    }


@pytest.mark.parametrize("page", ['{"status": "error", "error": "bad query"}', "[]", "not json"])
def test_a_prometheus_answer_that_is_not_success_is_one_error(page):
    with pytest.raises(ValueError):
        prometheus_samples(page)


def test_the_sample_source_follows_the_metrics_mode_unless_told(monkeypatch):
    monkeypatch.delenv("SAMPLE_SOURCE", raising=False)
    monkeypatch.setenv("METRICS_MODE", "exporter")
    assert source_kind(SamplerSettings.from_env()) == FROM_EXPORTER
    monkeypatch.setenv("METRICS_MODE", "fleet")
    assert source_kind(SamplerSettings.from_env()) == FROM_PROMETHEUS
    monkeypatch.setenv("SAMPLE_SOURCE", "exporter")
    assert source_kind(SamplerSettings.from_env()) == FROM_EXPORTER
    monkeypatch.setenv("SAMPLE_SOURCE", "promethus")
    with pytest.raises(ValueError, match="SAMPLE_SOURCE='promethus'"):
        source_kind(SamplerSettings.from_env())


def test_fleet_mode_samples_at_prometheus_resolution_not_faster(monkeypatch, folder):
    """Reading Prometheus ten times a second would only repeat its last value: the sampler asks its configuration."""
    config = "global:\n  scrape_interval: 2s\n  evaluation_interval: 3s\n"

    class Config(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"status": "success", "data": {"yaml": config}}).encode()
            self.send_response(200 if self.path == "/api/v1/status/config" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    server = serve_in_thread(Config)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        monkeypatch.setenv("SAMPLE_SOURCE", "prometheus")
        monkeypatch.setenv("SAMPLE_PROMETHEUS_URL", url)
        monkeypatch.delenv("SAMPLE_PROMETHEUS_INTERVAL_MS", raising=False)
        sampler = Sampler.for_run(folder, (), SamplerSettings.from_env())
        assert (sampler.kind, sampler.interval_s, sampler.source) == (FROM_PROMETHEUS, 3.0, url)
        assert "Prometheus" in sampler.describe()
        monkeypatch.setenv("SAMPLE_PROMETHEUS_INTERVAL_MS", "500")
        assert Sampler.for_run(folder, (), SamplerSettings.from_env()).interval_s == 0.5
    finally:
        server.shutdown()
