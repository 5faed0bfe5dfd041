"""Latency percentiles from the raw records of a crafted run, failures counted by reason and kept out of the stats."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.report import latency
from servescope.report.load import load
from tests.paths import RUNS


def group(groups, instance, scenario):
    (g,) = [g for g in groups if g.instance == instance and g.scenario == scenario]
    return g


def test_percentiles_from_the_seed_fixture():
    groups = latency.build(load(RUNS / "seed-vllm-ollama"))
    burst = group(groups, "vllm", "burst")
    ttft = burst.metrics["ttft_s"]  # 0.2, 0.4, 0.6
    assert (ttft["n"], ttft["p50"], ttft["mean"]) == (3, pytest.approx(0.4), pytest.approx(0.4))
    assert ttft["p90"] == pytest.approx(0.56) and ttft["p99"] == pytest.approx(0.596)
    itl = burst.metrics["itl_s"]  # pooled gaps: 0.04 0.06 | 0.08 0.10 | 0.12
    assert itl["n"] == 5 and itl["p50"] == pytest.approx(0.08) and itl["p90"] == pytest.approx(0.112)
    e2e = burst.metrics["e2e_s"]  # 1.6356 3.647941 3.951341; p90 rank 1.8
    assert e2e["p50"] == pytest.approx(3.647941)
    assert e2e["p90"] == pytest.approx(3.647941 + 0.8 * (3.951341 - 3.647941))
    tpot = burst.metrics["tpot_s"]  # (e2e - ttft) / (tokens - 1) per request
    expected = sorted([(1.6356 - 0.2) / 29, (3.647941 - 0.4) / 26, (3.951341 - 0.6) / 23])
    assert tpot["p50"] == pytest.approx(expected[1]) and tpot["max"] == pytest.approx(expected[2])
    assert burst.output_tokens["p50"] == 27 and burst.output_tokens["mean"] == pytest.approx(27.0)
    assert burst.failures == {}


def test_failures_are_counted_by_reason_and_left_out_of_the_percentiles():
    groups = latency.build(load(RUNS / "live-failures"))
    burst = group(groups, "llamacpp", "burst")
    assert (burst.requests, burst.ok) == (5, 3)
    assert burst.failures == {"HTTP 503: server busy: no free slot": 1, "stream ended without [DONE]": 1}
    ttft = burst.metrics["ttft_s"]  # successful only: 0.02, 0.30, 0.60 (the cut-off one had 0.0005)
    assert ttft["n"] == 3 and ttft["min"] == pytest.approx(0.02) and ttft["p50"] == pytest.approx(0.30)
    assert burst.metrics["e2e_s"]["min"] == pytest.approx(0.28)
    assert burst.metrics["itl_s"]["n"] == 3


def test_tpot_is_computed_when_the_record_lacks_it(tmp_path):
    """One rule in two forms: servescope.judgements.slo.tpot on a record, latency.TPOT_SQL in the engine; they agree."""
    from servescope.contracts.runfolder import RequestRecord, RunFolder
    from servescope.judgements.slo import tpot

    def record(sent, output_tokens, tpot_s=None):
        return RequestRecord(
            "vllm", "vllm", "burst", "b", "openai", "m", "s", "h", "p", 48, sent, True, 200,
            ttft_s=0.5, e2e_s=2.5, output_tokens=output_tokens, tpot_s=tpot_s,
        )  # fmt: skip

    records = [record(1.0, 5), record(2.0, 1), record(3.0, 5, tpot_s=0.7), record(4.0, None)]
    assert [tpot(r) for r in records] == [pytest.approx(0.5), None, 0.7, None]  # (2.5 - 0.5) / 4
    folder = RunFolder.create(tmp_path, "tpot")
    for r in records:
        folder.append_request(r)
    run = load(folder.path)
    from_engine = run.con.execute(f"SELECT {latency.TPOT_SQL} FROM requests ORDER BY seq").fetchall()
    assert [v for (v,) in from_engine] == [tpot(r) for r in records]


def _ok_ttfts(folder: Path, phases: set[str]) -> list[float]:
    """TTFT of the successful requests of those phases, read from requests.jsonl without the report's engine."""
    import json

    records = [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines() if line.strip()]
    return [r["ttft_s"] for r in records if r["phase"] in phases and r["ok"]]


@pytest.mark.parametrize(
    ("folder", "levels"),
    [
        # quick on llama.cpp: 1 user, 2 users, 1 user again (issue 40: pooled, TTFT p50 was neither level's)
        ("quick-llamacpp", {"1 user": {"knee-c1-1", "knee-c1-2"}, "2 users": {"knee-c2-1"}}),
        ("knee-vllm", {"1 user": {"knee-c1-1"}, "2 users": {"knee-c2-1", "knee-c2-2"}, "3 users": {"knee-c3-1"},
                       "4 users": {"knee-c4-1"}}),
        ("sweep-llamacpp", {"1 user": {"sweep-c1"}, "2 users": {"sweep-c2"}, "4 users": {"sweep-c4"}}),
    ],
)  # fmt: skip
def test_a_knee_or_sweep_has_a_latency_row_per_load_level(folder, levels):
    """Recorded runs: one row per load, lowest first, each with its own requests' percentiles (numpy on the raw
    records), never one row pooling the levels."""
    import numpy as np

    from servescope.report import figures

    run = load(RUNS / folder)
    try:
        groups = latency.build(run)
        boxes = figures.latency_boxes(run)
    finally:
        run.close()
    assert [g.level for g in groups] == list(levels)
    for g in groups:
        assert set(g.phases) == levels[g.level]
        ttfts = _ok_ttfts(RUNS / folder, levels[g.level])
        assert g.metrics["ttft_s"]["n"] == g.ok == len(ttfts) > 0
        assert g.metrics["ttft_s"]["p50"] == pytest.approx(float(np.median(ttfts)))
        assert g.metrics["ttft_s"]["p95"] == pytest.approx(float(np.percentile(ttfts, 95)))
    assert [label.split(", ")[-1] for label in boxes["labels"]] == list(levels)  # the plot's boxes: the same rows


def test_a_comparison_run_keeps_a_row_per_mode():
    """Sequential and burst are one load each, whatever their repetitions: no load column, no split."""
    run = load(RUNS / "compare-vllm-llamacpp")
    try:
        groups = latency.build(run)
    finally:
        run.close()
    assert [(g.instance, g.scenario, g.level) for g in groups] == [
        ("vllm", "sequential", ""), ("vllm", "burst", ""), ("llamacpp", "sequential", ""), ("llamacpp", "burst", ""),
    ]  # fmt: skip
