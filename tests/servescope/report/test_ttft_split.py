"""The per-request TTFT split from the engines' own timings (crafted run folders, worked by hand)."""

from __future__ import annotations

import pytest

from servescope.report import crosscheck, ttft_split
from servescope.report.load import load
from tests.paths import RUNS


def test_llamacpp_queue_is_the_ttft_left_over_above_a_request_that_never_queued():
    run = load(RUNS / "live-failures")
    split = ttft_split.llamacpp(run, "llamacpp")
    assert split.available and not split.aggregate and split.count == 7  # failed requests have no timings
    assert {r.phase for r in split.requests} == {"burst-1"}  # listed one by one: the bursts' requests
    burst = sorted((r for r in split.requests if r.phase == "burst-1"), key=lambda r: r.arrival_index)
    prompt, first = 0.010, 0.250 / 30  # prompt_ms; predicted_ms / predicted_n
    transport = 0.02 - prompt - first  # the smallest leftover: every request at 0.02 s TTFT
    for r, ttft in zip(burst, (0.02, 0.3, 0.6), strict=True):
        assert r.parts_s["prompt"] == pytest.approx(prompt)
        assert r.parts_s["first_token"] == pytest.approx(first)
        assert r.parts_s["transport"] == pytest.approx(transport)
        assert r.parts_s["queue"] == pytest.approx(ttft - 0.02)
        assert sum(r.parts_s.values()) == pytest.approx(r.ttft_s)
    assert split.queued == 2  # the two later arrivals of the burst
    assert split.queue_share == pytest.approx(((0.3 - 0.02) + (0.6 - 0.02)) / 7 / split.ttft_mean_s)


def test_ollama_parts_from_its_durations_per_request():
    run = load(RUNS / "seed-vllm-ollama")
    split = ttft_split.ollama(run, "ollama")
    assert split.available and split.count == 10 and len(split.requests) == 3  # the burst's three, listed
    second = next(r for r in split.requests if r.phase == "burst-1" and r.arrival_index == 1)
    # total 1.106994 = load 0.002 + prompt 0.020 + eval 0.584994 + 0.5 s outside the model: the queue
    assert second.parts_s["queue"] == pytest.approx(0.5)
    assert second.parts_s["load"] == pytest.approx(0.002)
    assert second.parts_s["prompt"] == pytest.approx(0.020)
    assert second.parts_s["first_token"] == pytest.approx(0.584994 / 14)
    assert second.parts_s["transport"] == pytest.approx(0.6 - 0.5 - 0.002 - 0.020 - 0.584994 / 14)


def test_vllm_is_labelled_aggregate_from_its_histograms():
    run = load(RUNS / "seed-vllm-ollama")
    check = crosscheck.CrossCheck("vllm", "vllm", True, "Prometheus")
    check.histogram_means_s = {"queue": 0.05, "prefill": 0.1, "decode": 3.85}
    split = ttft_split.histograms(run, "vllm", check)
    assert split.available and split.aggregate and not split.requests
    assert split.source.startswith("aggregate: vLLM 0.32 gives no per-request timings")
    assert split.means_s["queue"] == 0.05 and split.means_s["prompt"] == 0.1
    assert split.means_s["transport"] == pytest.approx(split.ttft_mean_s - 0.15)
    unavailable = ttft_split.histograms(run, "vllm", None)
    assert not unavailable.available and "unavailable" in unavailable.source
