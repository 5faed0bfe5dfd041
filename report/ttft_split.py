"""Each request's TTFT split into queue wait, model load, prompt processing, first token and transport, where the engine gives the parts.

- Ollama (per request, its final object's nanosecond durations): load = load_duration; prompt =
  prompt_eval_duration; first token = one decode step, eval_duration / eval_count; queue = what
  total_duration holds beyond load, prompt eval and eval (time in Ollama outside the model);
  transport = the client's TTFT left over.
- llama.cpp (per request, `timings`): prompt = prompt_ms; first token = one decode step,
  predicted_ms / predicted_n. It reports no queue time: the TTFT left over is queue + transport,
  and the smallest leftover of the engine's requests (one that never queued) is taken as the
  transport of each, the rest as its queue.
- vLLM 0.32 (aggregate only: its responses carry no timings): the means of its queue-time and
  prefill-time histograms over the run window, against the client's mean TTFT.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from report.crosscheck import CrossCheck, llamacpp_timings, ollama_durations
from report.load import Run
from servescope import thresholds
from servescope.runfolder import RequestRecord

PARTS = ("queue", "load", "prompt", "first_token", "transport")
PART_HELP = {
    "queue": "waiting inside the engine before its prompt was processed",
    "load": "loading the model for the request (Ollama load_duration)",
    "prompt": "prompt processing (prefill)",
    "first_token": "one decode step (the engine's generation time / tokens)",
    "transport": "what the client's TTFT holds beyond the engine's parts (HTTP, streaming, client)",
}


@dataclass
class RequestSplit:
    phase: str
    prompt_id: str
    arrival_index: int | None
    ttft_s: float
    parts_s: dict[str, float]


@dataclass
class TtftSplit:
    instance: str
    engine: str
    available: bool
    source: str  # where the parts came from, or why there are none
    aggregate: bool = False  # True: means over the window, not per request
    requests: list[RequestSplit] = field(default_factory=list)
    means_s: dict[str, float] = field(default_factory=dict)
    ttft_mean_s: float | None = None
    queued: int = 0  # requests whose queue part reached thresholds.TTFT_QUEUED_MIN_S (aggregate: 0 or 1)
    notes: list[str] = field(default_factory=list)

    @property
    def queue_share(self) -> float | None:
        """The engine's queue as a share of the client's TTFT (the cross-check's queue share)."""
        queue = self.means_s.get("queue")
        return queue / self.ttft_mean_s if queue is not None and self.ttft_mean_s else None


def _timed(records: list[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.ok and r.ttft_s is not None]


def _finish(split: TtftSplit) -> TtftSplit:
    if split.requests:
        split.ttft_mean_s = statistics.fmean(r.ttft_s for r in split.requests)
        names = [p for p in PARTS if any(p in r.parts_s for r in split.requests)]
        split.means_s = {p: statistics.fmean(r.parts_s.get(p, 0.0) for r in split.requests) for p in names}
        split.queued = sum(1 for r in split.requests if r.parts_s.get("queue", 0.0) >= thresholds.TTFT_QUEUED_MIN_S)
    return split


def ollama(instance: str, records: list[RequestRecord]) -> TtftSplit:
    split = TtftSplit(instance, "ollama", False, "no Ollama durations in the records (engine_stats empty)")
    for r in _timed(records):
        durations = ollama_durations(r)
        if durations is None:
            continue
        total, load, prompt, generation = durations
        eval_count = (r.engine_stats or {}).get("eval_count") or r.output_tokens
        first = generation / eval_count if isinstance(eval_count, int | float) and eval_count > 0 else 0.0
        queue = max(0.0, total - load - prompt - generation)
        transport = max(0.0, r.ttft_s - load - queue - prompt - first)
        parts = {"queue": queue, "load": load, "prompt": prompt, "first_token": first, "transport": transport}
        split.requests.append(RequestSplit(r.phase, r.prompt_id, r.arrival_index, r.ttft_s, parts))
    if split.requests:
        split.available, split.source = True, "Ollama's final object: *_duration (ns), per request"
    return _finish(split)


def llamacpp(instance: str, records: list[RequestRecord]) -> TtftSplit:
    split = TtftSplit(instance, "llamacpp", False, "no llama.cpp timings in the records (engine_stats empty)")
    rows = []
    for r in _timed(records):
        timings = llamacpp_timings(r)
        if timings is None:
            continue
        prompt, generation, _cache_n, predicted_n = timings
        n = predicted_n if isinstance(predicted_n, int) and predicted_n > 0 else r.output_tokens
        first = generation / n if n else 0.0
        rows.append((r, prompt, first, r.ttft_s - prompt - first))
    if not rows:
        return split
    transport = max(0.0, min(left for *_, left in rows))
    for r, prompt, first, left in rows:
        parts = {"queue": max(0.0, left - transport), "prompt": prompt, "first_token": first, "transport": transport}
        split.requests.append(RequestSplit(r.phase, r.prompt_id, r.arrival_index, r.ttft_s, parts))
    split.available, split.source = True, "llama.cpp's `timings` (prompt_ms, predicted_ms), per request"
    split.notes.append(
        f"llama.cpp reports no queue time: transport is the smallest TTFT left over beyond prompt and first "
        f"token ({transport * 1000:.1f} ms, a request that never queued), queue the rest of each one's"
    )
    return _finish(split)


def vllm(instance: str, records: list[RequestRecord], check: CrossCheck | None) -> TtftSplit:
    means = check.histogram_means_s if check is not None else {}
    if "queue" not in means:
        reason = check.source if check is not None else "no cross-check for this engine"
        return TtftSplit(instance, "vllm", False, f"vLLM histograms unavailable: {reason}")
    timed = _timed(records)
    split = TtftSplit(
        instance,
        "vllm",
        bool(timed),
        "aggregate: vLLM 0.32 gives no per-request timings; means of vllm:request_queue_time_seconds and "
        "vllm:request_prefill_time_seconds over the run window",
        aggregate=True,
    )
    if not timed:
        return split
    split.ttft_mean_s = statistics.fmean(r.ttft_s for r in timed)
    split.means_s = {"queue": means["queue"]}
    if "prefill" in means:
        split.means_s["prompt"] = means["prefill"]
    split.means_s["transport"] = max(0.0, split.ttft_mean_s - sum(split.means_s.values()))
    split.queued = int(means["queue"] >= thresholds.TTFT_QUEUED_MIN_S)
    split.notes.append("the histograms count every request vLLM finished in the window, warm-up included")
    return split


def build(run: Run, checks: list[CrossCheck]) -> list[TtftSplit]:
    by_instance = {c.instance: c for c in checks}
    out = []
    for instance, info in run.engines.items():
        records = run.requests_of(instance)
        if info.kind == "ollama":
            out.append(ollama(instance, records))
        elif info.kind == "llamacpp":
            out.append(llamacpp(instance, records))
        elif info.kind == "vllm":
            out.append(vllm(instance, records, by_instance.get(instance)))
        else:
            out.append(TtftSplit(instance, info.kind, False, f"no engine-side timings known for {info.kind!r}"))
    return out


def to_json(splits: list[TtftSplit]) -> dict:
    return {
        "parts": PART_HELP,
        "engines": [{**asdict(s), "queue_share": s.queue_share} for s in splits],
    }
