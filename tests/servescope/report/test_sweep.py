"""Sweeps (throughput per concurrency level, the knee) and bursts (queue drain, TTFT by arrival) from crafted runs."""

from __future__ import annotations

import pytest

from servescope.report import sweep
from servescope.report.load import load
from tests.paths import RUNS


def test_sweep_levels_and_knee():
    (sw,) = sweep.sweeps(load(RUNS / "live-failures"))
    assert (sw.instance, sw.scenario) == ("vllm", "sweep")
    # each level c ran 2c requests of 40 tokens; walls 4.0, 4.0, 4.9, 9.0 s
    tps = [lv.tokens_per_s for lv in sw.levels]
    assert [lv.concurrency for lv in sw.levels] == [1, 2, 4, 8]
    assert tps == pytest.approx([80 / 4.0, 160 / 4.0, 320 / 4.9, 640 / 9.0])
    # best 71.1 tok/s; 90% of it is 64.0; c4 has 65.3 -> the knee
    assert sw.knee_concurrency == 4 and "92%" in sw.knee_text
    assert sw.levels[2].e2e["p50"] == pytest.approx(2.0)


def test_no_knee_when_throughput_still_rises():
    lv = [sweep.SweepLevel(c, [], 1, 0, 1.0, 0, float(c), None, {}, {}) for c in (1, 2, 4)]
    knee, text = sweep.knee_of(lv)
    assert knee is None and "not saturated" in text


def test_burst_drain_and_ttft_by_arrival():
    run = load(RUNS / "seed-vllm-ollama")
    drains = {d.instance: d for d in sweep.bursts(run)}
    # Ollama, one at a time: TTFTs 0.1, 0.6, 0.9 s, sent at +0, +1, +2 ms
    assert drains["ollama"].drain_s == pytest.approx(0.002 + 0.9)
    assert [t for _, t in drains["ollama"].ttft_by_arrival] == pytest.approx([0.1, 0.6, 0.9])
    by_arrival = sweep.mean_ttft_by_arrival(list(drains.values()), "vllm")
    assert [i for i, _ in by_arrival] == [0, 1, 2] and [t for _, t in by_arrival] == pytest.approx([0.2, 0.4, 0.6])
    failed = {d.instance: d for d in sweep.bursts(load(RUNS / "live-failures"))}["llamacpp"]
    assert [t for _, t in failed.ttft_by_arrival][3:] == [None, None]  # failures stay visible as gaps
