"""SGLang as a fourth engine, from its adapter alone (servescope/engines/sglang.py): exporter, verdict, knee, dashboards.

SGLang cannot be installed here: its page is the one written from its documentation
(tests/fixtures/sglang-0.5-metrics-from-docs.txt), served by a recorded-engine double; the knee runs
against the synthetic OpenAI server speaking SGLang's metric names (--flavour sglang).
"""

from __future__ import annotations

import json
import os

import pytest
import requests
from prometheus_client import CollectorRegistry

from dashboards import build as dashboards
from exporter.config import Config, Instance
from exporter.page import PageCollector
from exporter.server import build as build_exporter
from servescope import engines
from servescope.contracts import series
from servescope.host import engine_identity
from servescope.judgements import binding
from servescope.prometheus.exposition import parse_exposition
from servescope.report import crosscheck, ttft_split
from servescope.report.gauges import EngineGauges
from servescope.report.load import EngineInfo, load
from servescope.report.verdict import decide
from servescope.stack import tune
from tests.conftest import free_port
from tests.doubles.recorded_engine import RecordedEngine, fixture
from tests.doubles.synthetic_openai import SyntheticServer
from tests.exporter.test_proxy import ExporterThread
from tests.harness import run_cli
from tests.loadgen.test_knee import SLO
from tests.paths import REPO

PAGE = "sglang-0.5-metrics-from-docs.txt"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
R, W, K = series.REQUESTS_RUNNING, series.REQUESTS_WAITING, series.KV_CACHE_USAGE


def sglang_engine(page: str | None = None) -> RecordedEngine:
    """The page from its docs, its /v1/models (ModelCard: max_model_len) and /get_server_info (server args + version)."""
    engine = RecordedEngine()
    engine.set_text("/metrics", page if page is not None else fixture(PAGE))
    card = {"id": MODEL, "object": "model", "owned_by": "sglang", "root": MODEL, "max_model_len": 8192}
    engine.set_json("/v1/models", {"object": "list", "data": [card]})
    engine.set_json("/get_model_info", {"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True})
    engine.set_json("/get_server_info", {"version": "0.5.4", "max_running_requests": 48, "context_length": 8192})
    return engine


def scrape(engine: RecordedEngine) -> CollectorRegistry:
    """The exporter as it is built from a config naming an SGLang instance: the generic page collector reads it."""
    exporter = build_exporter(Config(instances=(Instance(kind="sglang", name="sglang", url=engine.url),)))
    (collector,) = exporter.fanout.collectors
    assert type(collector) is PageCollector and collector.kind == "sglang"
    return exporter.registry


class SglangExporter(ExporterThread):
    """The real exporter watching one SGLang instance, served from a background event loop."""

    def __init__(self, url: str):
        self.port = free_port()
        instance = Instance(kind="sglang", name="sglang", url=url, timeout=0.5)
        self.exporter = build_exporter(Config(port=self.port, instances=(instance,)))
        self.url = f"http://127.0.0.1:{self.port}"


def test_the_fixture_says_it_was_written_from_the_docs_and_holds_only_sglangs_names():
    text = fixture(PAGE)
    assert text.splitlines()[0].startswith("# Written from SGLang's documentation, NOT captured")
    names = {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert names and all(n.startswith(engines.SGLANG.metrics.prefix) for n in names)
    wanted = {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate"}
    assert wanted <= names and "sglang:time_to_first_token_seconds_bucket" in names


def test_the_exporter_maps_sglangs_documented_page_onto_the_neutral_series():
    with sglang_engine() as engine:
        registry = scrape(engine)
        get = registry.get_sample_value
        model = {"engine": "sglang", "instance": "sglang", "model": MODEL}
        assert get(series.ENGINE_UP, {"engine": "sglang", "instance": "sglang"}) == 1.0
        assert (get(R, model), get(W, model), get(K, model)) == (162.0, 2826.0, 0.28)
        assert get(series.GENERATED_TOKENS, model) == 7.557572e06 and get(series.PROMPT_TOKENS, model) == 8.128902e06
        assert get(series.ENGINE_INFO, {"engine": "sglang", "instance": "sglang", "version": "0.5.4"}) == 1.0
        # Not on its docs page: no series rather than a made-up 0 (cache_hit_rate is a rate, never read as a count).
        for absent in (series.PROMPT_CACHED_TOKENS, series.PREEMPTIONS, series.KV_CAPACITY_TOKENS):
            assert get(absent, model) is None, absent


def test_the_names_from_sglangs_source_are_read_where_a_build_has_them():
    extra = (
        f'sglang:cached_tokens_total{{model_name="{MODEL}"}} 1200\n'
        f'sglang:num_retracted_requests_total{{model_name="{MODEL}"}} 3\n'
        f'sglang:max_total_num_tokens{{model_name="{MODEL}"}} 442000\n'
    )
    with sglang_engine(fixture(PAGE) + extra) as engine:
        get = scrape(engine).get_sample_value
        model = {"engine": "sglang", "instance": "sglang", "model": MODEL}
        assert get(series.PROMPT_CACHED_TOKENS, model) == 1200.0
        assert get(series.PREEMPTIONS, model) == 3.0  # a retraction frees KV for others: its preemption
        assert get(series.KV_CAPACITY_TOKENS, model) == 442000.0


def test_its_identity_is_read_from_its_own_endpoints():
    with sglang_engine() as engine:
        identity = engine_identity.probe("sglang", engine.url)
    assert identity.version == "0.5.4" and identity.models == {MODEL: 8192} and not identity.errors
    assert identity.settings["max_running_requests"] == 48


def test_the_binding_rule_names_sglangs_flags_and_no_stack_knob():
    slots, kv = binding.knob_for("sglang", binding.BATCH_SLOTS), binding.knob_for("sglang", binding.KV_CAPACITY)
    assert slots.flag == "--max-running-requests" and slots.env is None
    assert kv.flag == "--mem-fraction-static" and kv.env is None
    assert binding.Binding(binding.BATCH_SLOTS, "").advice("sglang") == "batch slots: raise it - --max-running-requests"
    # Its queue is for a slot or for KV, told apart by the pool while requests waited (as vLLM's).
    assert binding.queue_resource("sglang", 0.95, 0.93) == binding.KV_CAPACITY
    assert binding.queue_resource("sglang", 0.3, 0.2) == binding.BATCH_SLOTS
    # The stack does not start SGLang: nothing for make tune to restart.
    assert "sglang" not in tune.TUNED and tune.raise_knob("sglang", binding.BATCH_SLOTS, {}) is None


def test_the_verdict_reads_sglangs_gauges_with_its_own_words():
    info = EngineInfo("sglang", "sglang", flags={"max_running_requests": 8, "context_length": 8192})
    room = decide(info, {R: 8, W: 4, K: 0.3}, gauges=EngineGauges("sglang", "sglang", kv_while_waiting=(0.3, 0.25)))
    assert room.computable and room.lever == "max_running_requests"
    assert room.text.startswith("raise --max-running-requests (now 8)") and "hit the cap" in room.text
    full = decide(info, {R: 5, W: 3, K: 0.97}, gauges=EngineGauges("sglang", "sglang", kv_while_waiting=(0.97, 0.95)))
    assert full.lever == "mem_fraction_static_or_context_length"
    assert "--mem-fraction-static" in full.text and "lower --context-length (now 8192)" in full.text


def test_its_own_histograms_stand_in_for_request_timings():
    class Prometheus:
        def __init__(self, means: dict[str, float]):
            self.means, self.asked = means, []

        def query(self, expr: str, at: float):
            self.asked.append(expr)
            value = next((v for name, v in self.means.items() if f"{name}_sum" in expr), None)
            return [{"value": [at, str(value)]}] if value is not None else []

    run = load(REPO / "tests" / "fixtures" / "runs" / "seed-vllm-ollama")  # its vLLM requests stand in
    both = Prometheus({"sglang:queue_time_seconds": 0.2, "sglang:e2e_request_latency_seconds": 1.0})
    cc = crosscheck.histograms(run, "vllm", both, "sglang")
    assert cc.available and cc.engine == "sglang" and cc.source.startswith("Prometheus: SGLang histograms")
    assert cc.components_mean_s["queue"] == 0.2 and "transport" in cc.components_mean_s
    assert all("sglang:" in expr for expr in both.asked)
    split = ttft_split.histograms(run, "vllm", cc, "sglang")
    assert split.aggregate and split.source.startswith("aggregate: SGLang's OpenAI responses carry no per-request")
    # The queue histogram is in SGLang's source, not on its docs page: without it nothing is concluded.
    docs_only = crosscheck.histograms(run, "vllm", Prometheus({"sglang:e2e_request_latency_seconds": 1.0}), "sglang")
    assert not docs_only.available and "sglang:queue_time_seconds" in docs_only.source


def test_the_comparison_dashboard_charts_sglangs_own_latency_histograms():
    board = dashboards.engine_comparison()
    by_title = {p["title"]: p for p in board["panels"] if p["type"] != "row"}
    ttft = [t["expr"] for t in by_title["TTFT (server)"]["targets"]]
    assert any(
        'sglang:time_to_first_token_seconds_bucket{instance=~"$instance",model_name=~"$model"}' in e for e in ttft
    )
    itl = [t["expr"] for t in by_title["ITL (server)"]["targets"]]
    assert any("sglang:inter_token_latency_seconds_bucket" in e and "sglang:time_per_output_token" in e for e in itl)
    assert "SGLang" in by_title["TTFT (server)"]["description"]


def test_the_synthetic_double_speaks_sglangs_names():
    with SyntheticServer(ttft=0.01, itl=0.001, tokens=2, flavour="sglang") as server:
        page = requests.get(f"{server.url}/metrics", timeout=5).text
        assert requests.get(f"{server.url}/version", timeout=5).status_code == 404
        assert requests.get(f"{server.url}/get_server_info", timeout=5).json()["version"] == "0.0.0-synthetic"
    samples = parse_exposition(page, engines.SGLANG.metrics.names)
    assert {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"} <= set(samples)


@pytest.mark.slow
@pytest.mark.serial  # an SLO on real latencies finds the knee: a CPU shared with another worker moves it
def test_the_knee_finds_sglangs_batch_slots_and_names_its_flag(tmp_path):
    """Two running requests at most (--max-running-requests 2): the knee at 2 users, batch slots above it, read
    from the real exporter's SGLang series."""
    with SyntheticServer(ttft=0.02, itl=0.01, tokens=10, max_running=2, flavour="sglang") as server:
        with SglangExporter(server.url) as exporter:
            env = {**os.environ, "SAMPLE_EXPORTER_URL": exporter.url, "SAMPLE_INTERVAL_MS": "50"}
            options = (
                f"--max-tokens 10 --prompts synthetic:16 --warmup 0 --results {tmp_path} --run-id knee "
                f"--metrics-port 0 --quiet --duration 1 --max-load 16 --slo {SLO}"
            )
            proc = run_cli(
                *["loadgen", "knee", "--engine", f"sglang={server.url}", *options.split()], env=env, timeout=300
            )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "knee" / "knee.json").read_text())
    assert (result["engine"], result["knee"], result["first_failing"]) == ("sglang", 2, 3)
    assert result["binding"]["resource"] == binding.BATCH_SLOTS and result["binding"]["peak_running"] == 2
    assert result["knob"] == {"env": None, "flag": "--max-running-requests", "advice": "raise it"}
    assert "--max-running-requests" in result["binding"]["advice"]
