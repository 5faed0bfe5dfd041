"""servescope.host.engine_identity against recorded engine pages over real HTTP: the exporter's and the load generator's one reading."""

from __future__ import annotations

import time

import pytest

from exporter.llamacpp import LlamacppCollector
from exporter.upstream import Upstream, UpstreamError
from servescope.host import engine_identity
from tests.doubles.recorded_engine import RecordedEngine, fixture, vllm_engine


def recorded_llama_server() -> RecordedEngine:
    engine = RecordedEngine()
    engine.pages["/props"] = (200, fixture("llamacpp-11434.0.0-props.json"), "application/json")
    engine.pages["/v1/models"] = (200, fixture("llamacpp-11434.0.0-v1-models.json"), "application/json")
    return engine


def test_llama_server_built_without_git_has_no_version_and_its_settings_are_read():
    with recorded_llama_server() as engine:
        identity = engine_identity.probe("llamacpp", engine.url)
    assert identity.version is None  # build_info "b0-unknown": the server does not know it
    assert identity.errors == {}
    path = identity.settings["model_path"]
    assert identity.settings == {"total_slots": 2, "model_path": path, "n_ctx": 2048}
    assert engine_identity.gguf_file_name(identity.model) == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_a_build_number_is_the_version():
    with RecordedEngine() as engine:
        engine.set_json("/props", {"build_info": "b6000-abcdef0", "model_alias": "smol"})
        identity = engine_identity.probe("llamacpp", engine.url)
    assert identity.version == "b6000-abcdef0"
    assert identity.model == "smol" and "/v1/models" in identity.errors  # 404 here: noted, the rest still read


def test_vllm_models_with_max_model_len_and_version():
    with vllm_engine() as engine:
        identity = engine_identity.probe("vllm", engine.url)
    assert identity.version == "0.9.1"
    assert identity.models == {"HuggingFaceTB/SmolLM2-135M-Instruct": 1024}


def test_ollama_version_and_installed_models():
    with RecordedEngine() as engine:
        engine.pages["/api/version"] = (200, fixture("ollama-0.12-version.json"), "application/json")
        engine.pages["/api/tags"] = (200, fixture("ollama-0.12-tags.json"), "application/json")
        identity = engine_identity.probe("ollama", engine.url)
    assert identity.version == "0.12.6" and "smollm2-135m:latest" in identity.models


def test_a_key_guarded_endpoint_is_an_error_of_that_endpoint_only():
    with vllm_engine() as engine:
        engine.api_key, engine.guarded = "sk-1", {"/v1/models"}
        without = engine_identity.probe("vllm", engine.url)
        with_key = engine_identity.probe("vllm", engine.url, api_key="sk-1")
    assert without.version == "0.9.1" and "401" in without.errors["/v1/models"]
    assert with_key.errors == {} and with_key.models


def test_an_engine_that_does_not_answer_raises_unless_recoverable():
    with RecordedEngine() as engine:
        url = engine.url
    upstream = Upstream(url)

    def get_json(path):
        return upstream.get_json(path, time.monotonic() + 1)

    with pytest.raises(UpstreamError):
        engine_identity.identify("vllm", get_json)  # the exporter's "engine down"
    upstream.close()
    assert set(engine_identity.probe("vllm", url).errors) == {"/v1/models", "/version"}  # the load generator's note


def test_the_exporter_and_the_load_generator_read_the_same_identity():
    with recorded_llama_server() as engine:
        collector = LlamacppCollector("llamacpp", Upstream(engine.url))
        from_exporter = collector.identity(time.monotonic() + 3)
        collector.upstream.close()
        from_loadgen = engine_identity.probe("llamacpp", engine.url)
    assert from_exporter == from_loadgen
