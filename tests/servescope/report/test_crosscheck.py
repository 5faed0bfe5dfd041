"""Engine-side timings vs the client's: Ollama durations and llama.cpp timings from crafted records, by hand."""

from __future__ import annotations

import pytest

from servescope.report import crosscheck
from servescope.report.load import load
from tests.paths import RUNS


def test_ollama_split_and_cold_load():
    run = load(RUNS / "seed-vllm-ollama")
    cc = crosscheck.ollama(run, "ollama")
    assert cc.available and cc.requests == 10
    mean_e2e = (3.709694 + 1.388071 + 3.308657) / 10  # the ten client E2Es
    c = cc.components_mean_s
    assert c["transport"] == pytest.approx(0.010, abs=1e-6)  # total_duration = E2E - 10 ms on every record
    assert c["load"] == pytest.approx((1.5 + 9 * 0.002) / 10, abs=1e-6)  # one cold load of 1.5 s
    assert c["queue"] == pytest.approx((0.5 + 0.8) / 10, abs=1e-6)  # burst arrivals 2 and 3 waited
    assert c["compute"] == pytest.approx(mean_e2e - 0.010 - 0.1518 - 0.13, abs=1e-6)
    assert cc.client_e2e_mean_s == pytest.approx(mean_e2e)
    assert [(x["phase"], x["prompt_id"]) for x in cc.cold_loads] == [("sequential-seed4", "q1")]
    assert cc.cold_loads[0]["load_s"] == pytest.approx(1.5)


def test_llamacpp_compute_vs_queue_and_transport():
    run = load(RUNS / "live-failures")
    cc = crosscheck.llamacpp(run, "llamacpp")
    assert cc.requests == 7  # failed requests carry no timings and are not successful anyway
    assert cc.components_mean_s["compute"] == pytest.approx(0.26)  # 10 ms prompt + 250 ms predicted
    # E2E: four sequential at 0.28 s, three burst at ttft + 0.26 (0.28, 0.56, 0.86)
    e2e = [0.28] * 4 + [0.28, 0.56, 0.86]
    assert cc.components_mean_s["queue+transport"] == pytest.approx(sum(x - 0.26 for x in e2e) / 7)
    assert cc.engine_first_token_mean_s == pytest.approx(0.010)
    assert any("cache_n" in n for n in cc.notes)


def test_vllm_without_prometheus_says_why():
    run = load(RUNS / "seed-vllm-ollama")
    (cc,) = [c for c in crosscheck.build(run, None) if c.engine == "vllm"]
    assert not cc.available and "come from Prometheus" in cc.source


def test_records_without_engine_stats_are_not_invented():
    run = load(RUNS / "live-failures")
    cc = crosscheck.ollama(run, "vllm")  # vLLM's records hold no Ollama durations
    assert not cc.available and "engine_stats empty" in cc.source
