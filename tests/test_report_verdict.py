"""The seed's section-4 rule as a function of gauge peaks, and the section-3 KV arithmetic."""

from __future__ import annotations

import pytest

from report.gauges import GaugeReport
from report.load import EngineInfo
from report.verdict import Verdict, build, decide
from servescope import series

R, W, K = series.REQUESTS_RUNNING, series.REQUESTS_WAITING, series.KV_CACHE_USAGE
VLLM = EngineInfo("vllm", "vllm", flags={"max-num-seqs": 8, "max-model-len": 1024, "VLLM_CPU_KVCACHE_SPACE": 1})
LLAMA = EngineInfo("llamacpp", "llamacpp", flags={"parallel": 2, "ctx-size": 4096})
OLLAMA = EngineInfo("ollama", "ollama", flags={"OLLAMA_NUM_PARALLEL": 1})


def test_waiting_with_kv_room_means_raise_max_num_seqs():
    # what engines.md saw live: running 8 (= max-num-seqs), waiting 4, KV 0.044
    v = decide(VLLM, {R: 8, W: 4, K: 0.044})
    assert v.computable and v.lever == "max_num_seqs"
    assert "raise --max-num-seqs" in v.text and "(now 8)" in v.text and "hit the cap" in v.text
    assert "peak waiting 4" in v.evidence and "4.4%" in v.evidence


def test_waiting_with_kv_full_means_kv_space_or_max_model_len_never_swap():
    v = decide(VLLM, {R: 5, W: 3, K: 0.97})
    assert v.lever == "kv_cache_space_or_max_model_len"
    assert "VLLM_CPU_KVCACHE_SPACE (now 1)" in v.text and "--max-model-len (now 1024)" in v.text
    assert "not --swap-space" in v.text


def test_one_at_a_time_engines_raise_their_parallelism():
    v = decide(LLAMA, {R: 2, W: 3, K: None})
    assert v.lever == "llamacpp_parallel" and "LLAMACPP_PARALLEL (--parallel) (now 2)" in v.text
    assert "4096 / 2 = 2048" in v.text
    o = decide(OLLAMA, {R: 1, W: 2, K: None})
    assert o.lever == "ollama_num_parallel" and "OLLAMA_NUM_PARALLEL (now 1)" in o.text


def test_nothing_waiting_needs_no_lever():
    v = decide(VLLM, {R: 3, W: 0, K: 0.3})
    assert v.lever == "none" and v.text.startswith("no lever needed")
    idle = decide(VLLM, {R: 0, W: 0, K: 0.0})
    assert idle.lever == "none" and "sampling interval" in idle.text
    oversized = decide(VLLM, {R: 3, W: 0, K: 0.02})
    assert "oversized" in oversized.text


def test_no_waiting_gauge_no_verdict():
    v = decide(VLLM, {R: 3, W: None, K: 0.5})
    assert not v.computable and v.lever is None and "no servescope_requests_waiting samples" in v.text


@pytest.mark.parametrize("kind", ["vllm", "llamacpp", "ollama"])
def test_no_gauge_data_means_no_verdict_with_the_reason(kind):
    from types import SimpleNamespace

    info = EngineInfo(kind, kind)
    run = SimpleNamespace(engines={kind: info}, phases_of=lambda i: [])
    gauges = GaugeReport(False, "Prometheus at http://x is unreachable", "http://x")
    (v,) = build(run, gauges)
    assert isinstance(v, Verdict) and not v.computable
    assert v.text == "no verdict can be made: the gauges had no data (Prometheus at http://x is unreachable)"
