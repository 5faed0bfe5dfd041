"""Each request's TTFT split into queue wait, model load, prompt processing, first token and transport, where the engine gives the parts.

- Ollama (per request, its final object's nanosecond durations): load = load_duration; prompt =
  prompt_eval_duration; first token = one decode step, eval_duration / eval_count; queue = what
  total_duration holds beyond load, prompt eval and eval (time in Ollama outside the model);
  transport = the client's TTFT left over.
- llama.cpp (per request, `timings`): prompt = prompt_ms; first token = one decode step,
  predicted_ms / predicted_n. It reports no queue time: the TTFT left over is queue + transport,
  and the smallest leftover of the engine's requests (one that never queued) is taken as the
  transport of each, the rest as its queue.
- vLLM 0.32 (aggregate only: its responses carry no timings; any engine whose adapter names histograms): the
  means of its queue-time and prefill-time histograms over the run window, against the client's mean TTFT.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from servescope import engines
from servescope.contracts import thresholds
from servescope.engines.base import DURATIONS, HISTOGRAMS, TIMINGS
from servescope.report.crosscheck import (
    HAS_LLAMACPP,
    LLAMACPP_GENERATION,
    LLAMACPP_PROMPT,
    OLLAMA,
    CrossCheck,
    columns,
    fmean,
    per_engine,
    timing,
)
from servescope.report.load import Run

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
    """One request's TTFT and the parts the engine's timings split it into (seconds)."""

    phase: str
    prompt_id: str
    arrival_index: int | None
    ttft_s: float
    parts_s: dict[str, float]


@dataclass
class TtftSplit:
    """One engine instance's TTFT split: per-request parts where the engine gives them, and their means."""

    instance: str
    engine: str
    available: bool
    source: str  # where the parts came from, or why there are none
    aggregate: bool = False  # True: means over the window, not per request
    count: int = 0  # requests split (the means are over all of them)
    requests: list[RequestSplit] = field(default_factory=list)  # those with an arrival index (burst requests)
    means_s: dict[str, float] = field(default_factory=dict)
    ttft_mean_s: float | None = None
    queued: int = 0  # requests whose queue part reached thresholds.TTFT_QUEUED_MIN_S (aggregate: 0 or 1)
    notes: list[str] = field(default_factory=list)

    @property
    def queue_share(self) -> float | None:
        """The engine's queue as a share of the client's TTFT (the cross-check's queue share)."""
        queue = self.means_s.get("queue")
        return queue / self.ttft_mean_s if queue is not None and self.ttft_mean_s else None


TIMED = "ok AND instance = ? AND ttft_s IS NOT NULL"


def _finish(
    split: TtftSplit, c: dict[str, np.ndarray] | None = None, parts: dict[str, np.ndarray] | None = None
) -> TtftSplit:
    """Means over every split request (c: their columns, parts: their parts; without them, split.requests); the
    requests of bursts (an arrival index) listed one by one."""
    if c is None or parts is None:
        listed = split.requests
        c = {"ttft": np.array([r.ttft_s for r in listed], dtype=float)}
        names = [p for p in PARTS if any(p in r.parts_s for r in listed)]
        parts = {p: np.array([r.parts_s.get(p, 0.0) for r in listed], dtype=float) for p in names}
    else:
        for i in np.flatnonzero(np.isfinite(c["arrival"])):
            split.requests.append(
                RequestSplit(
                    c["phase"][i],
                    c["prompt_id"][i],
                    int(c["arrival"][i]),
                    float(c["ttft"][i]),
                    {p: float(v[i]) for p, v in parts.items()},
                )
            )
    split.count = len(c["ttft"])
    if split.count:
        split.ttft_mean_s = fmean(c["ttft"])
        split.means_s = {p: fmean(parts[p]) for p in PARTS if p in parts}
        split.queued = int(np.count_nonzero(parts.get("queue", np.zeros(0)) >= thresholds.TTFT_QUEUED_MIN_S))
    return split


def _base(run: Run, instance: str, where: str, **exprs: str) -> dict[str, np.ndarray]:
    return columns(
        run,
        f"{TIMED} AND {where}",
        [instance],
        ttft="ttft_s",
        phase="phase",
        prompt_id="prompt_id",
        arrival="arrival_index",
        **exprs,
    )


def ollama(run: Run, instance: str, engine: str = engines.OLLAMA.name) -> TtftSplit:
    split = TtftSplit(instance, engine, False, "no Ollama durations in the records (engine_stats empty)")
    eval_count = "CASE WHEN json_type(s.eval_count) IN ('BIGINT', 'UBIGINT', 'DOUBLE') THEN s.eval_count::DOUBLE END"
    c = _base(
        run,
        instance,
        f"{OLLAMA['total']} IS NOT NULL",
        **OLLAMA,
        # eval_count when the engine gave a non-zero one, else the client's count of output tokens
        count=f"CASE WHEN coalesce({eval_count}, 0) <> 0 THEN {eval_count} ELSE output_tokens END",
    )
    if not len(c["ttft"]):
        return split
    with np.errstate(divide="ignore", invalid="ignore"):
        first = np.where(np.nan_to_num(c["count"]) > 0, c["generation"] / c["count"], 0.0)
    queue = np.maximum(0.0, c["total"] - c["load"] - c["prompt"] - c["generation"])
    transport = np.maximum(0.0, c["ttft"] - c["load"] - queue - c["prompt"] - first)
    parts = {"queue": queue, "load": c["load"], "prompt": c["prompt"], "first_token": first, "transport": transport}
    split.available, split.source = True, "Ollama's final object: *_duration (ns), per request"
    return _finish(split, c, parts)


def llamacpp(run: Run, instance: str, engine: str = engines.LLAMACPP.name) -> TtftSplit:
    split = TtftSplit(instance, engine, False, "no llama.cpp timings in the records (engine_stats empty)")
    predicted_n = timing("predicted_n", integer=True)
    c = _base(
        run,
        instance,
        HAS_LLAMACPP,
        prompt=LLAMACPP_PROMPT,
        generation=LLAMACPP_GENERATION,
        # predicted_n when the engine gave a positive integer, else the client's count of output tokens
        count=f"CASE WHEN {predicted_n} > 0 THEN {predicted_n} ELSE output_tokens END",
    )
    if not len(c["ttft"]):
        return split
    with np.errstate(divide="ignore", invalid="ignore"):
        first = np.where(np.nan_to_num(c["count"]) != 0, c["generation"] / c["count"], 0.0)
    left = c["ttft"] - c["prompt"] - first
    transport = max(0.0, float(left.min()))
    parts = {
        "queue": np.maximum(0.0, left - transport),
        "prompt": c["prompt"],
        "first_token": first,
        "transport": np.full(len(left), transport),
    }
    split.available, split.source = True, "llama.cpp's `timings` (prompt_ms, predicted_ms), per request"
    split.notes.append(
        f"llama.cpp reports no queue time: transport is the smallest TTFT left over beyond prompt and first "
        f"token ({transport * 1000:.1f} ms, a request that never queued), queue the rest of each one's"
    )
    return _finish(split, c, parts)


def histograms(run: Run, instance: str, check: CrossCheck | None, engine: str = engines.VLLM.name) -> TtftSplit:
    """Means of the engine's queue and prefill histograms over the window (the cross-check read them), not per request."""
    adapter = engines.kind(engine)
    timings, who = adapter.timings, adapter.said
    means = check.histogram_means_s if check is not None else {}
    if "queue" not in means:
        reason = check.source if check is not None else "no cross-check for this engine"
        return TtftSplit(instance, engine, False, f"{who} histograms unavailable: {reason}")
    ttft = columns(run, TIMED, [instance], ttft="ttft_s")["ttft"]
    used = " and ".join(timings.histograms[p] for p in ("queue", "prefill") if p in timings.histograms)
    split = TtftSplit(
        instance,
        engine,
        bool(len(ttft)),
        f"aggregate: {timings.why_aggregate}; means of {used} over the run window",
        aggregate=True,
    )
    if not len(ttft):
        return split
    split.count = len(ttft)
    split.ttft_mean_s = fmean(ttft)
    split.means_s = {"queue": means["queue"]}
    if "prefill" in means:
        split.means_s["prompt"] = means["prefill"]
    split.means_s["transport"] = max(0.0, split.ttft_mean_s - sum(split.means_s.values()))
    split.queued = int(means["queue"] >= thresholds.TTFT_QUEUED_MIN_S)
    split.notes.append(f"the histograms count every request {who} finished in the window, warm-up included")
    return split


def build(run: Run, checks: list[CrossCheck]) -> list[TtftSplit]:
    by_instance = {c.instance: c for c in checks}
    readers = {
        DURATIONS: lambda instance, kind: ollama(run, instance, kind),
        TIMINGS: lambda instance, kind: llamacpp(run, instance, kind),
        HISTOGRAMS: lambda instance, kind: histograms(run, instance, by_instance.get(instance), kind),
    }
    return per_engine(
        run,
        readers,
        lambda instance, kind: TtftSplit(instance, kind, False, f"no engine-side timings known for {kind!r}"),
    )


def to_json(splits: list[TtftSplit]) -> dict:
    return {
        "parts": PART_HELP,
        "engines": [{**asdict(s), "queue_share": s.queue_share} for s in splits],
    }
