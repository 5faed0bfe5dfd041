"""The recorded-engine double (tests/doubles/recorded_engine.py) answers as the engines it replays."""

from __future__ import annotations

import requests

from tests.doubles.recorded_engine import RecordedEngine, vllm_engine


def test_serves_pages_and_counts_hits():
    with RecordedEngine() as engine:
        engine.set_text("/metrics", "x 1\n")
        assert requests.get(f"{engine.url}/metrics", timeout=5).text == "x 1\n"
        assert requests.get(f"{engine.url}/missing", timeout=5).status_code == 404
        assert engine.hits == {"/metrics": 1, "/missing": 1}


def test_vllm_stand_in_answers_like_vllm():
    with vllm_engine() as engine:
        models = requests.get(f"{engine.url}/v1/models", timeout=5).json()
        assert models["data"][0]["max_model_len"] == 1024
        assert "vllm:gpu_cache_usage_perc" in requests.get(f"{engine.url}/metrics", timeout=5).text
