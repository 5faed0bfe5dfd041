"""The reference page's table from a crafted run folder holding its own published numbers, and the matched-set refusals."""

from __future__ import annotations

import shutil

import pytest

from servescope.report import cli, table
from servescope.report.load import load
from tests.paths import RUNS


@pytest.fixture
def seed_rows():
    return {(r.instance, r.phase): r for r in table.build(load(RUNS / "seed-vllm-ollama"))}


def test_sequential_burst_table_reproduces_the_reference_numbers(seed_rows):
    burst = seed_rows[("vllm", "burst-1")]
    # vLLM: 12.393 s matched-set sequential / 3.965 s burst = 3.13x; 81 tokens / 3.965 s = 20.4 tok/s
    assert burst.wall_s == pytest.approx(3.965)
    assert burst.matched_phase == "sequential"
    assert burst.scaling_factor == pytest.approx(12.393 / 3.965)
    assert f"{burst.scaling_factor:.2f}" == "3.13"
    assert burst.output_tokens == 81
    assert burst.tokens_per_s == pytest.approx(81 / 3.965)
    assert burst.reading.startswith("strongly sub-linear")
    assert [c.text() for c in burst.requests] == ["200 1.636s", "200 3.648s", "200 3.951s"]
    # vLLM sequential over 4 prompts: 165 tokens / 19.673 s = 8.4 tok/s; never a scaling partner
    seq4 = seed_rows[("vllm", "sequential-seed4")]
    assert seq4.output_tokens == 165 and f"{seq4.tokens_per_s:.1f}" == "8.4"
    assert seq4.scaling_factor is None and "4 prompts" in seq4.mode
    assert "matched set" in seed_rows[("vllm", "sequential")].mode
    # Ollama: 1.427 / 1.301 = 1.10x, near-linear; 125 tok / 3.765 s = 33.2; 42 tok / 1.301 s = 32.3
    oburst = seed_rows[("ollama", "burst-1")]
    assert f"{oburst.scaling_factor:.2f}" == "1.10"
    assert oburst.reading.startswith("near-linear")
    assert f"{seed_rows[('ollama', 'sequential-seed4')].tokens_per_s:.1f}" == "33.2"
    assert f"{oburst.tokens_per_s:.1f}" == "32.3"


@pytest.mark.parametrize(
    ("factor", "n", "expected"),
    [
        (3.13, 3, "strongly"),  # the reference page's vLLM
        (1.10, 3, "near-linear"),  # the reference page's Ollama
        (1.5, 3, "strongly"),  # 0.5 x 3 = 1.5: on the line
        (1.4, 3, "partially"),
        (1.3, 3, "near-linear"),
        (0.8, 3, "near-linear"),  # burst slower than sequential is still "no overlap"
        (5.9, 12, "partially"),  # 12 requests: needs 6x for "strongly"
        (6.0, 12, "strongly"),
        (1.45, 2, "partially"),  # small bursts: the floor of 1.5 applies
    ],
)
def test_reading_thresholds_scale_with_burst_size(factor, n, expected):
    assert table.reading(factor, n).startswith(expected)


def test_refuses_scaling_factor_on_mismatched_sets():
    rows = {(r.instance, r.phase): r for r in table.build(load(RUNS / "live-failures"))}
    vllm = rows[("vllm", "burst-1")]
    assert vllm.scaling_factor is None
    assert "prompt set seed3" in vllm.refusal and "seed4" in vllm.refusal and "matched-set" in vllm.refusal
    llama = rows[("llamacpp", "burst-1")]
    assert llama.scaling_factor is None
    assert "max_tokens differ (sequential 64, burst 48)" in llama.refusal
    # sweep phases are not the reference page's table
    assert not any(r.scenario == "sweep" for r in rows.values())


def test_failed_requests_are_shown_and_counted_in_the_table():
    rows = {(r.instance, r.phase): r for r in table.build(load(RUNS / "live-failures"))}
    burst = rows[("llamacpp", "burst-1")]
    assert (burst.n_ok, burst.n_failed) == (3, 2)
    texts = [c.text() for c in burst.requests]
    assert "503 FAILED (server busy: no free slot)" in texts
    assert "200 FAILED (stream ended without [DONE])" in texts
    # the cut-off request's 2 partial tokens are not throughput: 3 x 30 tokens / 1.5 s
    assert burst.output_tokens == 90 and burst.tokens_per_s == pytest.approx(60.0)
    assert "2 of 5 failed" in table.notes_text(burst)


def test_table_only_prints_the_table_and_writes_nothing(tmp_path, capsys):
    run = tmp_path / "seed"
    shutil.copytree(RUNS / "seed-vllm-ollama", run)
    before = sorted(p.name for p in run.iterdir())
    assert cli.main(["--run", str(run), "--table-only", "--prometheus", "http://127.0.0.1:9"]) == 0
    out = capsys.readouterr().out
    assert "12.393s / 3.965s = 3.13x -- strongly sub-linear" in out
    assert "1.427s / 1.301s = 1.10x -- near-linear" in out
    assert "200 1.636s / 200 3.648s / 200 3.951s -> wall 3.965s" in out
    assert sorted(p.name for p in run.iterdir()) == before


def test_table_only_defaults_to_the_latest_run(tmp_path, capsys):
    shutil.copytree(RUNS / "seed-vllm-ollama", tmp_path / "20261130-000000-1")
    shutil.copytree(RUNS / "live-failures", tmp_path / "20261130-000100-2")
    assert cli.main(["--results", str(tmp_path), "--table-only"]) == 0
    assert "(run live-failures)" in capsys.readouterr().out
