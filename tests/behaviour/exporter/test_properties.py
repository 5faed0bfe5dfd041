"""Property tests: whatever text or JSON an engine sends, collect() never raises and engine_up says whether it was usable."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter import config as exporter_config
from exporter.cli import build_parser
from exporter.llamacpp import LlamacppCollector
from exporter.observations import ProxyObservations
from exporter.ollama import OllamaCollector
from exporter.proxy import OllamaTail
from exporter.upstream import Upstream
from exporter.vllm import VllmCollector
from servescope.contracts import series
from tests.doubles.recorded_engine import RecordedEngine, fixture

# A fixed seed (derandomize): the same examples every run.
SETTINGS = settings(
    derandomize=True, max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "models",
                    "data",
                    "id",
                    "n_ctx",
                    "is_processing",
                    "n_past",
                    "n_prompt_tokens",
                    "next_token",
                    "n_decoded",
                    "name",
                    "model",
                    "size",
                    "size_vram",
                    "expires_at",
                    "context_length",
                    "details",
                    "version",
                    "max_model_len",
                    "family",
                ]
            )
            | st.text(max_size=8),
            children,
            max_size=6,
        )
    ),
    max_leaves=20,
)


# One collector (one HTTP session) per served engine: examples then cost a request, not a connection.
LLAMACPP: dict[str, LlamacppCollector] = {}
OLLAMA: dict[str, OllamaCollector] = {}


@pytest.fixture(scope="module")
def engine():
    with RecordedEngine() as served:
        yield served


def up_of(collector) -> float:
    families = list(collector.collect())  # must not raise
    up = next(f for f in families if f.name == series.ENGINE_UP)
    return up.samples[0].value


def mutate(text: str, start: int, length: int, insert: str) -> str:
    start %= len(text) + 1
    return text[:start] + insert + text[start + length :]


@SETTINGS
@given(page=st.text(max_size=400))
def test_vllm_arbitrary_text_never_raises(engine, page):
    engine.set_text("/metrics", page)
    engine.set_json("/v1/models", {"object": "list", "data": [{"id": "m", "max_model_len": 1024}]})
    assert up_of(VllmCollector("vllm", Upstream(engine.url))) in (0.0, 1.0)


@SETTINGS
@given(
    start=st.integers(0, 10_000),
    length=st.integers(0, 40),
    insert=st.text(alphabet=st.sampled_from('{}"=,# \n\\abc0.9e+-:_'), max_size=12),
)
def test_vllm_garbled_fixture_never_raises(engine, start, length, insert):
    engine.set_text("/metrics", mutate(fixture("vllm-0.10.1-metrics-both-names.txt"), start, length, insert))
    engine.set_json(
        "/v1/models", {"object": "list", "data": [{"id": "HuggingFaceTB/SmolLM2-135M-Instruct", "max_model_len": 1024}]}
    )
    assert up_of(VllmCollector("vllm", Upstream(engine.url))) in (0.0, 1.0)


@SETTINGS
@given(models=json_values)
def test_vllm_arbitrary_v1_models_never_raises(engine, models):
    engine.set_text("/metrics", fixture("vllm-0.9.1-cpu-metrics.txt"))
    engine.set_json("/v1/models", models)
    collector = VllmCollector("vllm", Upstream(engine.url))
    families = {family.name: family for family in collector.collect()}
    # a model list the engine cannot have sent costs what it says (max concurrency), never the engine
    assert families[series.ENGINE_UP].samples[0].value == 1.0
    if not isinstance(models, dict) or not isinstance(models.get("data"), list):
        assert not families[series.KV_MAX_CONCURRENCY].samples


@SETTINGS
@given(slots=json_values)
def test_llamacpp_arbitrary_slots_never_raise(engine, slots):
    engine.set_text("/metrics", "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n")
    engine.set_json("/v1/models", {"data": [{"id": "m"}]})
    engine.set_json("/slots", slots)
    collector = LLAMACPP.setdefault(engine.url, LlamacppCollector("llamacpp", Upstream(engine.url)))
    families = {family.name: family for family in collector.collect()}  # must not raise
    assert families[series.ENGINE_UP].samples[0].value == 1.0  # /metrics was fine: a bad /slots costs KV only
    usage = families.get(series.KV_CACHE_USAGE)
    if not isinstance(slots, list):
        assert usage is None
    elif usage is not None:
        assert all(0.0 <= sample.value <= 1.0 for sample in usage.samples)


@SETTINGS
@given(path=st.sampled_from(["/api/version", "/api/ps", "/api/tags"]), payload=json_values)
def test_ollama_arbitrary_json_never_raises(engine, path, payload):
    engine.pages["/api/version"] = (200, fixture("ollama-0.12-version.json"), "application/json")
    engine.pages["/api/ps"] = (200, fixture("ollama-0.12-ps.json"), "application/json")
    engine.pages["/api/tags"] = (200, fixture("ollama-0.12-tags.json"), "application/json")
    engine.set_json(path, payload)
    up = up_of(
        OLLAMA.setdefault(engine.url, OllamaCollector("ollama", Upstream(engine.url), observations=ProxyObservations()))
    )
    if not isinstance(payload, dict):
        assert up == 0.0


@SETTINGS
@given(raw=st.binary(max_size=300))
def test_ollama_arbitrary_bytes_never_raise(engine, raw):
    engine.pages["/api/version"] = (200, raw, "application/json")
    assert up_of(OllamaCollector("ollama", Upstream(engine.url))) in (0.0, 1.0)


@settings(derandomize=True, max_examples=200, deadline=None)
@given(
    body=st.binary(max_size=2000) | st.just(fixture("ollama-0.12-chat-stream.ndjson").encode()),
    cuts=st.lists(st.integers(0, 2000), max_size=8),
)
def test_response_tail_never_raises(body, cuts):
    for_native, for_openai = OllamaTail(), OllamaTail()
    edges = sorted({0, len(body), *(c % (len(body) + 1) for c in cuts)})
    for start, end in zip(edges, edges[1:], strict=False):
        for_native.feed(body[start:end])
        for_openai.feed(body[start:end])
    final = for_native.final_ndjson()
    assert final is None or isinstance(final, dict)
    usage = for_openai.openai_usage()
    assert usage is None or isinstance(usage, dict)


@settings(derandomize=True, max_examples=100, deadline=None)
@given(lines=st.integers(1, 5000))
def test_response_tail_keeps_the_final_object_of_a_long_stream(lines):
    tail = OllamaTail()
    line = b'{"message":{"content":"tok"},"done":false}\n'
    for _ in range(lines):
        tail.feed(line)
    tail.feed(json.dumps({"done": True, "eval_count": lines}).encode() + b"\n")
    assert tail.final_ndjson() == {"done": True, "eval_count": lines}
    assert len(tail.buffer) <= 4 * 64 * 1024 + 100


@settings(
    derandomize=True, max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=json_values
    | st.dictionaries(
        st.sampled_from(["port", "engines", "timeout_seconds", "listen_address"]), json_values, max_size=4
    )
)
def test_config_raises_only_config_error(tmp_path, data):
    path = tmp_path / "exporter.yml"
    path.write_text(yaml.safe_dump(data))
    try:
        exporter_config.load(build_parser().parse_args(["--config", str(path)]))
    except exporter_config.ConfigError as exc:
        assert str(exc).startswith("config error: ") and "\n" not in str(exc)
