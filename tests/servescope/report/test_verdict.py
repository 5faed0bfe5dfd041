"""The reference page's section-4 rule as a function of gauge peaks, and the section-3 KV arithmetic."""

from __future__ import annotations

import pytest

from servescope.contracts import series
from servescope.report.gauges import GaugeReport
from servescope.report.load import EngineInfo
from servescope.report.verdict import Verdict, build, decide

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
    if kind == "ollama":  # and it says what else it lacks
        assert v.text == (
            "no verdict: Ollama's running/waiting were not observed (Prometheus at http://x is unreachable), and "
            "nothing else in this run tells whether requests waited: the records carry no Ollama durations, and "
            "there is no burst"
        )
    else:
        assert v.text == "no verdict can be made: the gauges had no data (Prometheus at http://x is unreachable)"


def _burst(kind: str, ttfts: list[float], queued: int, served_after: int, wall: float = 1.7):
    from servescope.report.sweep import BurstDrain

    return BurstDrain(
        kind, kind, "burst-1", len(ttfts), wall, max(ttfts), None, list(enumerate(ttfts)), queued, served_after, 0.0
    )


def _sampled(instance: str, kind: str, samples: int, missing: int = 0, reasons=(), running: float = 1):
    from servescope.report.gauges import EngineGauges, PhaseCoverage

    eg = EngineGauges(instance, kind, source="samples", spacing_s=5.0, series={W: [(0.0, 0.0)]})
    eg.coverage["burst-1"] = PhaseCoverage("burst-1", 1.7, samples, missing, list(reasons))
    eg.phase_peaks["burst-1"] = {R: running, W: 0}
    return eg


def test_the_issues_llamacpp_burst_is_never_nothing_waited():
    """Live: --parallel 1, TTFT 0.021 / 0.586 / 1.135 s, gauges read 0 waiting: the verdict follows the clients."""
    from servescope.report.verdict import QueueEvidence

    queue = QueueEvidence([_burst("llamacpp", [0.021, 0.586, 1.135], queued=2, served_after=2)])
    v = decide(LLAMA, {R: 1, W: 0, K: 0.01}, gauges=_sampled("llamacpp", "llamacpp", samples=0), queue=queue)
    assert v.computable and v.lever == "llamacpp_parallel" and "raise LLAMACPP_PARALLEL" in v.text
    assert "nothing waited" not in v.text
    assert v.disagreement == (
        "the clients saw requests wait, the gauges did not: gauges under-sampled: 0 samples during a 1.7 s burst "
        "(samples every 5000 ms)"
    )
    assert (
        "TTFT by arrival 0.021/0.586/1.135 s, 2 of 3 first tokens only after another request had finished" in v.evidence
    )


def test_missing_samples_during_the_burst_are_named_as_the_reason():
    from servescope.report.verdict import QueueEvidence

    queue = QueueEvidence([_burst("vllm", [0.05, 0.3, 0.55], queued=2, served_after=2)])
    gauges = _sampled("vllm", "vllm", samples=1, missing=6, reasons=["the exporter could not read this engine"])
    v = decide(VLLM, {R: 1, W: 0, K: 0.01}, gauges=gauges, queue=queue)
    assert "6 of 7 samples during burst-1 are missing (the exporter could not read this engine)" in v.disagreement
    assert v.lever == "undetermined" and "nothing waited" not in v.text  # burst 3 < max-num-seqs 8: not the cap


def test_between_the_thresholds_neither_lever_is_claimed():
    v = decide(VLLM, {R: 5, W: 2, K: 0.85})
    assert v.lever == "kv_undecided" and "between 80% and 90%" in v.text
    # The same rule as the knee's and the tune's: undecided, no knob named first.
    assert v.text.startswith("undecided") and "neither" in v.text and "raise" not in v.text


def test_a_queue_without_the_kv_pools_usage_names_no_vllm_lever():
    v = decide(VLLM, {R: 5, W: 2, K: None})
    assert v.lever == "undetermined" and "cannot be told apart" in v.text and "raise" not in v.text


def test_gauges_waiting_the_clients_did_not_see_is_said():
    from servescope.report.verdict import QueueEvidence

    queue = QueueEvidence([_burst("vllm", [0.1, 0.11, 0.12], queued=0, served_after=0)])
    v = decide(VLLM, {R: 8, W: 4, K: 0.04}, queue=queue)
    assert v.lever == "max_num_seqs" and "no request of this run's bursts was served late" in v.disagreement


def test_the_engines_own_queue_timings_count_as_evidence():
    from servescope.report.ttft_split import RequestSplit, TtftSplit, _finish
    from servescope.report.verdict import QueueEvidence

    split = TtftSplit("ollama", "ollama", True, "Ollama's final object")
    split.requests = [
        RequestSplit("ramp-2users", "p1", None, 0.2, {"queue": 0.0, "prompt": 0.1}),
        RequestSplit("ramp-2users", "p2", None, 1.2, {"queue": 1.0, "prompt": 0.1}),
    ]
    _finish(split)
    v = decide(OLLAMA, {R: 1, W: 0, K: None}, queue=QueueEvidence([], split))
    assert v.lever == "ollama_num_parallel" and "the engine's timings saw requests wait" in v.disagreement
    assert "queue 71% of the mean TTFT" in v.evidence


# --- Ollama: its own durations and the bursts decide; the proxy's running/waiting stand beside them


def _ollama_split(queues: list[float], load: float = 0.002, prompt: float = 0.02, ttft: float = 0.1):
    """Ollama's own durations of some requests (servescope/report/ttft_split.py's parts): one queue each."""
    from servescope.report.ttft_split import RequestSplit, TtftSplit, _finish

    split = TtftSplit("ollama", "ollama", True, "Ollama's final object: *_duration (ns), per request")
    split.requests = [
        RequestSplit("burst-1", f"p{i}", i, ttft + q, {"queue": q, "load": load, "prompt": prompt, "transport": 0.0})
        for i, q in enumerate(queues)
    ]
    return _finish(split)


def test_ollamas_waiting_alone_never_names_the_knob_it_was_split_from():
    """BUG at 7b2f789: waiting was in flight beyond OLLAMA_NUM_PARALLEL, and the verdict read it
    back as "raise OLLAMA_NUM_PARALLEL". The proxy's waiting counts prompt evaluation too: alone, it is undetermined."""
    v = decide(OLLAMA, {R: 1, W: 2, K: None})
    assert v.computable and v.lever == "undetermined", v.text
    assert "the only evidence is the proxy's count of relayed requests without their first chunk (up to 2)" in v.text
    assert "no Ollama durations and no burst" in v.text and "raise" not in v.text
    assert (
        "proxy (source=proxy): answers streaming at once at most 1, relayed requests without their first chunk "
        "(queued, loading or evaluating the prompt) at most 2" in v.evidence
    )


def test_ollamas_own_durations_decide_over_the_proxys_waiting():
    from servescope.report.verdict import QueueEvidence

    busy = decide(OLLAMA, {R: 1, W: 2, K: None}, queue=QueueEvidence([], _ollama_split([0.0, 0.5, 0.8])))
    assert busy.lever == "ollama_num_parallel" and busy.text.startswith(
        "raise OLLAMA_NUM_PARALLEL (now 1): Ollama's own durations say requests waited for a slot: 2 of 3 spent 50 "
        "ms or more inside Ollama outside load, prompt evaluation and generation, 0.433 s on average"
    )
    assert busy.text.endswith("; answers streaming at once through the proxy: at most 1")
    assert busy.evidence.startswith("Ollama's own durations (3 requests): 2 held 50 ms or more outside load")
    # The proxy saw requests without their first chunk, but Ollama held none of them outside its model: prefill.
    calm = decide(OLLAMA, {R: 1, W: 2, K: None}, queue=QueueEvidence([], _ollama_split([0.0, 0.01, 0.02])))
    assert calm.lever == "none" and calm.text.startswith(
        "no lever needed: Ollama's own durations show no request waiting inside it (3 requests"
    )


def test_late_first_tokens_that_ollama_did_not_queue_are_not_a_slot_lever():
    """The bursts' first tokens came one by one, yet Ollama's durations put the time in loading: not the knob."""
    from servescope.report.verdict import QueueEvidence

    queue = QueueEvidence([_burst("ollama", [0.1, 0.6, 0.9], queued=2, served_after=0)], _ollama_split([0, 0, 0], 0.5))
    v = decide(OLLAMA, {R: 1, W: 2, K: None}, queue=queue)
    assert v.lever == "none" and "no OLLAMA_NUM_PARALLEL lever" in v.text
    assert "the time went to loading the model (mean load_duration 0.500 s" in v.text
    assert "the clients saw first tokens late, Ollama's durations no queue" in v.disagreement


def test_without_ollamas_durations_the_bursts_decide_and_say_so():
    from servescope.report.verdict import QueueEvidence

    after = QueueEvidence([_burst("ollama", [0.1, 0.6, 0.9], queued=2, served_after=2)])
    v = decide(OLLAMA, {R: 1, W: 2, K: None}, queue=after)
    assert v.lever == "ollama_num_parallel" and "2 first tokens came only after another request had finished" in v.text
    assert "the records carry no Ollama durations to confirm it" in v.text
    late = QueueEvidence([_burst("ollama", [0.1, 0.3, 0.5], queued=2, served_after=0)])
    u = decide(OLLAMA, {R: 1, W: 2, K: None}, queue=late)
    assert u.lever == "undetermined" and "a queue for a slot or prompts evaluated one at a time" in u.text


def test_a_run_that_went_around_the_proxy_is_not_observed_whatever_the_proxy_counted():
    """The manifest says the requests went to Ollama directly: the proxy's numbers are other traffic's."""
    from types import SimpleNamespace

    from servescope.report.gauges import EngineGauges

    direct = EngineInfo("ollama", "ollama", flags={"OLLAMA_NUM_PARALLEL": 1}, route="direct")
    eg = EngineGauges("ollama", "ollama", source="samples", spacing_s=0.1, series={W: [(0.0, 2.0)], R: [(0.0, 1.0)]})
    eg.peaks = {R: 1.0, W: 2.0, K: None}
    run = SimpleNamespace(engines={"ollama": direct}, phases_of=lambda i: [])
    (v,) = build(run, GaugeReport(True, "samples", "", engines={"ollama": eg}))
    assert not v.computable and v.lever is None
    assert v.text.startswith(
        "no verdict: Ollama's running/waiting were not observed (this run went to Ollama directly, not through the "
        "exporter's proxy)"
    )
    (through,) = build(
        SimpleNamespace(engines={"ollama": OLLAMA}, phases_of=lambda i: []),
        GaugeReport(True, "samples", "", engines={"ollama": eg}),
    )
    assert through.lever == "undetermined"  # the proxy's waiting, alone
