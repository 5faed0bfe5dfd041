"""The loader: tolerant of torn lines and missing optional fields, one-line errors for what is not a run folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from servescope.report.load import RunError, load, resolve
from tests.paths import RUNS


def test_torn_last_line_is_skipped_with_a_warning():
    run = load(RUNS / "live-failures")
    assert run.request_count == 46
    assert run.warnings == ["requests.jsonl: 1 record skipped, torn last record (run killed mid-write?) (line 47)"]


def test_missing_optional_fields_get_contract_defaults():
    run = load(RUNS / "live-failures")
    (cut,) = [r for r in run.requests_of("llamacpp") if r.error == "stream ended without [DONE]"]
    assert cut.instance == "llamacpp" and cut.itl_s == [] and cut.engine_stats == {}


def test_manifest_engines_as_dict_with_argv_flags():
    run = load(RUNS / "live-failures")
    assert list(run.engines) == ["vllm", "llamacpp"]
    assert run.engines["vllm"].flag("max-num-seqs") == "8"
    assert run.engines["vllm"].flag("VLLM_MAX_NUM_SEQS", "max_num_seqs") == "8"
    assert run.engines["llamacpp"].ignore_eos is True and run.engines["llamacpp"].title == "llama.cpp server"


def test_records_without_required_fields_and_middle_garbage_are_skipped(tmp_path):
    shutil.copytree(RUNS / "seed-vllm-ollama", tmp_path / "r")
    path = tmp_path / "r" / "requests.jsonl"
    lines = path.read_text().splitlines()
    broken = json.loads(lines[0])
    del broken["started_at"]
    path.write_text("\n".join([lines[1], "garbage", json.dumps(broken), *lines[2:]]) + "\n")
    run = load(tmp_path / "r")
    assert run.request_count == len(lines) - 1
    assert "requests.jsonl: 1 record skipped, not a JSON record (line 2)" in run.warnings
    assert "requests.jsonl: 1 record skipped, missing started_at (line 3)" in run.warnings


def test_phases_are_reconstructed_when_phases_jsonl_is_missing(tmp_path):
    shutil.copytree(RUNS / "seed-vllm-ollama", tmp_path / "r")
    (tmp_path / "r" / "phases.jsonl").unlink()
    (tmp_path / "r" / "manifest.json").unlink()
    run = load(tmp_path / "r")
    burst = [p for p in run.phases if p.instance == "vllm" and p.phase == "burst-1"][0]
    assert burst.concurrency == 3 and burst.wall_s == pytest.approx(3.951341 + 0.002, abs=1e-6)
    assert any("reconstructed" in w for w in run.warnings) and any("no manifest.json" in w for w in run.warnings)


def test_resolve_by_id_path_and_latest(tmp_path):
    shutil.copytree(RUNS / "seed-vllm-ollama", tmp_path / "20261130-000000-1")
    shutil.copytree(RUNS / "live-failures", tmp_path / "20261130-000100-2")
    assert resolve(None, tmp_path) == tmp_path / "20261130-000100-2"
    assert resolve("20261130-000000-1", tmp_path) == tmp_path / "20261130-000000-1"
    assert resolve(str(tmp_path / "20261130-000000-1"), Path("/nonexistent")) == tmp_path / "20261130-000000-1"
    with pytest.raises(RunError, match="no run folder 'nope'"):
        resolve("nope", tmp_path)
    with pytest.raises(RunError, match="no run folder with a manifest.json"):
        resolve(None, tmp_path / "empty")
    (tmp_path / "notarun").mkdir()
    with pytest.raises(RunError, match="is not a run folder"):
        load(tmp_path / "notarun")


def test_a_run_whose_workers_were_lost_or_stepped_says_so_in_its_warnings(tmp_path):
    """The load generator writes what lost workers never sent, what its port dropped and the clock steps it saw into
    the manifest (loadgen/distributed.py): the report says each in one line, where the numbers it shows are."""
    shutil.copytree(RUNS / "seed-vllm-ollama", tmp_path / "r")
    path = tmp_path / "r" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["distributed"] = {"unsent": {"rate-10rps": 23}, "dropped_messages": {"a forged record": 6}}
    manifest["workers"] = [
        {"index": 0, "lost": None, "clock_steps_s": [], "records_put_on_master_clock": 0},
        {"index": 1, "lost": "it quit", "clock_steps_s": [30.0001], "records_put_on_master_clock": 2},
    ]
    path.write_text(json.dumps(manifest))
    warnings = load(tmp_path / "r").warnings
    assert "rate-10rps: 23 requests were never sent (a load generator worker was lost in it)" in warnings
    assert "load generator workers' port: 6 messages dropped (not from this run's workers, or malformed)" in warnings
    assert (
        "load generator worker 1: its clock stepped +30.000 s; 2 records put on the master's clock as they arrived"
        in warnings
    )


def test_a_run_under_a_home_that_does_not_exist_is_one_line(tmp_path):
    with pytest.raises(RunError, match="no such user's home directory"):
        resolve("~nosuchuser-servescope/run", tmp_path)
