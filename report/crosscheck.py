"""Engine-side timings against the client's: how much of each request's wait was queue, compute or transport."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from report.gauges import PAD_S, Prometheus, PrometheusError
from report.load import Run
from servescope.runfolder import RequestRecord

COLD_LOAD_S = 1.0  # an Ollama load_duration above this means the model was (re)loaded for the request
VLLM_HISTOGRAMS = {
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "server_e2e": "vllm:e2e_request_latency_seconds",
}
COMPONENTS = ("load", "queue", "compute", "queue+transport", "transport")
COMPONENT_HELP = {
    "load": "model load inside the request (Ollama load_duration)",
    "queue": "waiting inside the engine before compute",
    "compute": "prompt processing + generation as the engine timed it",
    "queue+transport": "client E2E minus engine compute (llama.cpp reports no queue time, so the two are one)",
    "transport": "client E2E minus the engine's own total (HTTP, streaming, client)",
}


@dataclass
class CrossCheck:
    instance: str
    engine: str
    available: bool
    source: str  # where the engine-side numbers came from, or why there are none
    requests: int = 0
    components_mean_s: dict[str, float] = field(default_factory=dict)
    client_e2e_mean_s: float | None = None
    client_ttft_mean_s: float | None = None
    engine_first_token_mean_s: float | None = None  # what the engine says it spent before the first token
    histogram_means_s: dict[str, float] = field(default_factory=dict)  # vLLM: queue, prefill, decode, server_e2e
    cold_loads: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _ns(stats: dict[str, Any], key: str) -> float | None:
    for name in (f"{key}_ns", key):
        value = stats.get(name)
        if isinstance(value, (int, float)):
            return value / 1e9
    return None


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def ollama_durations(r: RequestRecord) -> tuple[float, float, float, float] | None:
    """(total, load, prompt eval, eval) seconds from Ollama's final object; None without them."""
    st = r.engine_stats or {}
    total, load, pe, ev = (
        _ns(st, k) for k in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")
    )
    if total is None:
        return None
    return total, load or 0.0, pe or 0.0, ev or 0.0


def llamacpp_timings(r: RequestRecord) -> tuple[float, float, Any, Any] | None:
    """(prompt s, predicted s, cache_n, predicted_n) from llama.cpp's `timings`; None without them."""
    st = r.engine_stats or {}
    t = st.get("timings") if isinstance(st.get("timings"), dict) else st
    pm, dm = t.get("prompt_ms"), t.get("predicted_ms")
    if not isinstance(pm, (int, float)) or not isinstance(dm, (int, float)):
        return None
    return pm / 1000.0, dm / 1000.0, t.get("cache_n"), t.get("predicted_n")


def ollama(instance: str, records: list[RequestRecord]) -> CrossCheck:
    rows = []
    for r in records:
        durations = ollama_durations(r)
        if durations is None or r.e2e_s is None:
            continue
        rows.append((r, *durations))
    cc = CrossCheck(
        instance,
        "ollama",
        bool(rows),
        "Ollama's final object: *_duration (ns)" if rows else "no Ollama durations in the records (engine_stats empty)",
        requests=len(rows),
    )
    if not rows:
        return cc
    cc.components_mean_s = {
        "load": statistics.fmean(x[2] for x in rows),
        "queue": statistics.fmean(max(0.0, x[1] - x[2] - x[3] - x[4]) for x in rows),
        "compute": statistics.fmean(x[3] + x[4] for x in rows),
        "transport": statistics.fmean(max(0.0, x[0].e2e_s - x[1]) for x in rows),
    }
    cc.client_e2e_mean_s = statistics.fmean(x[0].e2e_s for x in rows)
    cc.client_ttft_mean_s = _mean([x[0].ttft_s for x in rows if x[0].ttft_s is not None])
    cc.engine_first_token_mean_s = statistics.fmean(x[2] + x[3] for x in rows)
    cc.cold_loads = [
        {"prompt_id": x[0].prompt_id, "phase": x[0].phase, "load_s": x[2]} for x in rows if x[2] > COLD_LOAD_S
    ]
    cc.notes.append(
        "queue = total - load - prompt eval - eval (time in Ollama outside the model); "
        "transport = client E2E - total_duration, floored at 0"
    )
    return cc


def llamacpp(instance: str, records: list[RequestRecord]) -> CrossCheck:
    rows = []
    for r in records:
        timings = llamacpp_timings(r)
        if timings is None or r.e2e_s is None:
            continue
        rows.append((r, *timings))
    cc = CrossCheck(
        instance,
        "llamacpp",
        bool(rows),
        "llama.cpp's `timings` (prompt_ms, predicted_ms)"
        if rows
        else "no llama.cpp timings in the records (engine_stats empty)",
        requests=len(rows),
    )
    if not rows:
        return cc
    cc.components_mean_s = {
        "compute": statistics.fmean(x[1] + x[2] for x in rows),
        "queue+transport": statistics.fmean(max(0.0, x[0].e2e_s - x[1] - x[2]) for x in rows),
    }
    cc.client_e2e_mean_s = statistics.fmean(x[0].e2e_s for x in rows)
    cc.client_ttft_mean_s = _mean([x[0].ttft_s for x in rows if x[0].ttft_s is not None])
    cc.engine_first_token_mean_s = statistics.fmean(x[1] for x in rows)
    cached = [x[3] for x in rows if isinstance(x[3], (int, float))]
    if cached:
        cc.notes.append(f"prompt tokens reused from the cache (cache_n): mean {statistics.fmean(cached):.1f}")
    mismatched = sum(
        1 for x in rows if isinstance(x[4], int) and x[0].output_tokens is not None and x[4] != x[0].output_tokens
    )
    if mismatched:
        cc.notes.append(f"{mismatched} request(s) where predicted_n differs from the client's output token count")
    return cc


def vllm(instance: str, records: list[RequestRecord], run: Run, client: Prometheus | None) -> CrossCheck:
    ok = [r for r in records if r.e2e_s is not None]
    if client is None:
        return CrossCheck(
            instance,
            "vllm",
            False,
            "vLLM's queue/prefill histograms come from Prometheus, which did not answer (see section 5)",
        )
    phases = run.phases_of(instance)
    if not phases or not ok:
        return CrossCheck(instance, "vllm", False, "no phases or successful requests for this engine")
    start, end = min(p.started_at for p in phases), max(p.ended_at for p in phases)
    window = f"{int(end - start + 2 * PAD_S) + 1}s"
    means: dict[str, float] = {}
    try:
        for name, metric in VLLM_HISTOGRAMS.items():
            expr = f"sum(increase({metric}_sum[{window}])) / sum(increase({metric}_count[{window}]))"
            result = client.query(expr, end + PAD_S)
            if result:
                value = float(result[0]["value"][1])
                if value == value:  # NaN when no request finished in the window
                    means[name] = value
    except PrometheusError as exc:
        return CrossCheck(instance, "vllm", False, f"no vLLM histograms: {exc}")
    if "queue" not in means:
        return CrossCheck(
            instance,
            "vllm",
            False,
            f"no {VLLM_HISTOGRAMS['queue']} samples in the run window (is raw vLLM /metrics scraped?)",
        )
    cc = CrossCheck(
        instance, "vllm", True, f"Prometheus: vLLM histograms, mean over the run window ({window})", requests=len(ok)
    )
    cc.client_e2e_mean_s = statistics.fmean(r.e2e_s for r in ok)
    cc.client_ttft_mean_s = _mean([r.ttft_s for r in ok if r.ttft_s is not None])
    cc.histogram_means_s = means
    cc.components_mean_s["queue"] = means["queue"]
    if "prefill" in means or "decode" in means:
        cc.components_mean_s["compute"] = means.get("prefill", 0.0) + means.get("decode", 0.0)
    if "server_e2e" in means:
        cc.components_mean_s["transport"] = max(0.0, cc.client_e2e_mean_s - means["server_e2e"])
    cc.engine_first_token_mean_s = means["queue"] + means.get("prefill", 0.0)
    cc.notes.append(
        "histogram means over every request vLLM finished in the window (warm-up included if it fell inside)"
    )
    return cc


def build(run: Run, client: Prometheus | None) -> list[CrossCheck]:
    out = []
    for instance, info in run.engines.items():
        ok = [r for r in run.requests_of(instance) if r.ok]
        if info.kind == "ollama":
            out.append(ollama(instance, ok))
        elif info.kind == "llamacpp":
            out.append(llamacpp(instance, ok))
        elif info.kind == "vllm":
            out.append(vllm(instance, ok, run, client))
        else:
            out.append(CrossCheck(instance, info.kind, False, f"no engine-side timings known for {info.kind!r}"))
    return out


def to_json(checks: list[CrossCheck]) -> list[dict]:
    return [asdict(c) for c in checks]
