"""The other load testers' results read back under servescope's definitions, from their real output files.

The fixtures were recorded from servebench 1.1.3 and AIPerf 0.13.0 against tests/doubles/synthetic_openai.py (TTFT
0.2 s, ITL 0.02 s, 64 tokens); the failed request in each was added by hand in the form its model gives
(servebench: ok false and its error; AIPerf: the record's `error`, ErrorDetails)."""

from __future__ import annotations

import shutil

import pytest

from bench import peers
from tests.paths import FIXTURES


def test_servebench_s_requests_give_ttft_and_the_gaps_between_content_chunks(tmp_path):
    shutil.copy(FIXTURES / "servebench-1.1.3-run.json", tmp_path / f"{peers.RESULT}.json")
    got = peers.SERVEBENCH.stamps(tmp_path)
    assert got.completed == 2  # the failed one is left out
    assert got.ttfts == pytest.approx([0.204214, 0.20213], abs=1e-6)
    assert len(got.itls) == 2 * 63  # 64 content chunks: 63 gaps each
    assert 0.01 < min(got.itls) and max(got.itls) < 0.03  # 20 ms each, as the server sent them


def test_aiperf_s_records_give_ttft_and_inter_chunk_gaps_in_seconds_and_skip_an_errored_one(tmp_path):
    (tmp_path / peers.RESULT).mkdir()
    shutil.copy(FIXTURES / "aiperf-0.13.0-profile_export.jsonl", tmp_path / peers.RESULT / "profile_export.jsonl")
    got = peers.AIPERF.stamps(tmp_path)
    assert got.completed == 2  # the third carries an error, though its TTFT is there
    assert all(0.2 < t < 0.25 for t in got.ttfts)
    assert len(got.itls) == 2 * 63
    assert 0.005 < sorted(got.itls)[len(got.itls) // 2] < 0.03


def test_each_peer_s_command_asks_for_the_same_traffic(tmp_path):
    for peer in peers.PEERS:
        cmd = peer.command("http://127.0.0.1:9", 4, 32, 64, tmp_path)
        joined = " ".join(cmd)
        assert cmd[0] == str(peer.program)
        assert "http://127.0.0.1:9" in joined and " 4 " in f"{joined} " and " 32 " in f"{joined} " and " 64 " in joined


def test_aiperf_runs_without_the_hub_s_offline_switches(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    env = peers.AIPERF.env()
    assert "HF_HUB_OFFLINE" not in env and "TRANSFORMERS_OFFLINE" not in env
    assert peers.SERVEBENCH.env()["HF_HUB_OFFLINE"] == "1"
