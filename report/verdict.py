"""The seed's section 4 as a rule on gauge peaks (which knob to move), plus its section-3 KV cache arithmetic."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from report.gauges import GaugeReport
from report.load import EngineInfo, Run
from servescope import series
from servescope.kv_arithmetic import blocks_for, capacity_tokens, max_concurrency

# "Near 100%" in the seed's words: the paged pool is the bottleneck once the peak reaches this.
KV_FULL = 0.9
RULE = (
    f"From the peaks over the run (seed section 4): requests waiting with KV usage below {KV_FULL:.0%} -> the batch "
    f"slots were the limit (vLLM: raise --max-num-seqs); waiting with KV usage at or above {KV_FULL:.0%} -> the KV "
    f"pool was the limit (raise VLLM_CPU_KVCACHE_SPACE or lower --max-model-len; never --swap-space, which adds no "
    f"blocks on the CPU backend); llama.cpp / Ollama waiting -> raise LLAMACPP_PARALLEL / OLLAMA_NUM_PARALLEL; "
    f"nothing waiting -> no lever needed."
)

RUNNING, WAITING, KV_USAGE = series.REQUESTS_RUNNING, series.REQUESTS_WAITING, series.KV_CACHE_USAGE


@dataclass
class Verdict:
    instance: str
    engine: str
    computable: bool
    lever: str | None  # max_num_seqs, kv_cache_space_or_max_model_len, llamacpp_parallel, llamacpp_ctx,
    #                    ollama_num_parallel, none; None when no verdict could be made
    text: str
    evidence: str = ""
    peak_running: float | None = None
    peak_waiting: float | None = None
    peak_kv_usage: float | None = None


@dataclass
class KvArithmetic:
    instance: str
    block_size_tokens: float | None = None
    blocks: float | None = None
    capacity_tokens: float | None = None  # as reported
    capacity_from_blocks: float | None = None  # blocks x block size
    max_model_len: float | None = None
    max_concurrency_reported: float | None = None
    max_concurrency_computed: float | None = None  # capacity / max_model_len
    burst_size: int | None = None
    tokens_per_sequence: int | None = None  # largest prompt + max_tokens seen in the burst
    blocks_per_sequence: int | None = None
    burst_blocks: int | None = None
    lines: list[str] = field(default_factory=list)


def _flag_int(info: EngineInfo, *names: str) -> int | None:
    return _setting(info, *names)[0]


def _setting(info: EngineInfo, *names: str) -> tuple[int | None, str]:
    """An integer setting and how to say where it came from: " (now 8)" or " (now 8 per this checkout's knobs)"."""
    value, source = info.flag_source(*names)
    try:
        number = int(float(value)) if value is not None and value is not True else None
    except (TypeError, ValueError):
        number = None
    if number is None:
        return None, ""
    return number, f" (now {number})" if source == "run" else f" (now {number} per this checkout's knobs)"


def decide(info: EngineInfo, peaks: dict[str, float | None], *, phases_ran: bool = True) -> Verdict:
    """The verdict for one engine from its gauge peaks alone (plus its flags, to say the current value)."""
    running, waiting, kv = peaks.get(RUNNING), peaks.get(WAITING), peaks.get(KV_USAGE)
    v = Verdict(info.instance, info.kind, False, None, "", peak_running=running, peak_waiting=waiting, peak_kv_usage=kv)
    if waiting is None:
        v.text = f"no verdict: no {WAITING} samples for this engine during the run"
        return v
    kv_text = f"{kv:.1%}" if kv is not None else "unknown"
    v.evidence = f"peak running {_num(running)}, peak waiting {_num(waiting)}, peak KV usage {kv_text}"
    v.computable = True
    if waiting <= 0:
        v.lever = "none"
        v.text = "no lever needed: nothing waited during the run"
        if phases_ran and not running:
            v.text += (
                " (but the gauges never saw a request running either: the phases may be shorter than the "
                "scrape interval, so a queue could have come and gone between scrapes)"
            )
        elif kv is not None and kv < 0.05 and running:
            v.text += f"; the KV pool peaked at {kv:.1%}, oversized for this load (the seed: budget bigger than needed)"
        return v
    if info.kind == "vllm":
        if kv is not None and kv >= KV_FULL:
            v.lever = "kv_cache_space_or_max_model_len"
            _, space = _setting(info, "VLLM_CPU_KVCACHE_SPACE", "kv_cache_space", "kvcache_space")
            _, mml = _setting(info, "max-model-len", "VLLM_MAX_MODEL_LEN", "max_model_len")
            v.text = (
                f"raise VLLM_CPU_KVCACHE_SPACE{space} or lower --max-model-len{mml}: requests waited "
                f"while the KV pool was full (not --swap-space: it adds no blocks on the CPU backend)"
            )
        else:
            v.lever = "max_num_seqs"
            seqs, now = _setting(info, "max-num-seqs", "VLLM_MAX_NUM_SEQS", "max_num_seqs")
            full = (
                " (the running batch hit the cap)"
                if seqs is not None and running is not None and running >= seqs
                else ""
            )
            unknown = "" if kv is not None else " (KV usage unknown: check the KV pool before raising it)"
            v.text = (
                f"raise --max-num-seqs (VLLM_MAX_NUM_SEQS){now}: requests waited while the KV pool had "
                f"room{full}{unknown}"
            )
    elif info.kind == "llamacpp":
        slots, slots_now = _setting(info, "parallel", "np", "LLAMACPP_PARALLEL", "n_parallel", "total_slots", "slots")
        # not the server's n_ctx: /props reports the per-slot context there
        ctx, ctx_now = _setting(info, "ctx-size", "c", "LLAMACPP_CTX", "ctx")
        if kv is not None and kv >= KV_FULL:
            v.lever = "llamacpp_ctx"
            v.text = f"raise LLAMACPP_CTX (-c){ctx_now}: requests waited while the slots' context was full"
        else:
            v.lever = "llamacpp_parallel"
            per_slot = (
                f"; each slot gets -c / --parallel tokens ({ctx} / {slots} = {ctx // slots})" if ctx and slots else ""
            )
            v.text = (
                f"raise LLAMACPP_PARALLEL (--parallel){slots_now}: requests waited for a free slot"
                f"{per_slot}, so raise LLAMACPP_CTX with it to keep the per-slot context"
            )
    elif info.kind == "ollama":
        _, par = _setting(info, "OLLAMA_NUM_PARALLEL", "num_parallel", "num-parallel")
        v.lever = "ollama_num_parallel"
        v.text = f"raise OLLAMA_NUM_PARALLEL{par}: requests waited for the loaded model"
    else:
        v.lever = "unknown"
        v.text = f"requests waited; no rule for engine kind {info.kind!r}"
    return v


def build(run: Run, gauges: GaugeReport) -> list[Verdict]:
    out = []
    for instance, info in run.engines.items():
        if not gauges.available:
            out.append(
                Verdict(
                    instance,
                    info.kind,
                    False,
                    None,
                    f"no verdict can be made: the gauges had no data ({gauges.reason})",
                )
            )
            continue
        eg = gauges.engines.get(instance)
        out.append(decide(info, eg.peaks if eg else {}, phases_ran=bool(run.phases_of(instance))))
    return out


def kv_arithmetic(run: Run, gauges: GaugeReport) -> list[KvArithmetic]:
    """The seed's section 3: blocks x block size = tokens; tokens / max-model-len = max concurrency; does the burst fit."""
    out = []
    for instance, info in run.engines.items():
        eg = gauges.engines.get(instance)
        kv = eg.kv if eg else {}
        a = KvArithmetic(instance)
        a.block_size_tokens = kv.get(series.KV_BLOCK_SIZE)
        a.blocks = kv.get(series.KV_BLOCKS)
        a.capacity_tokens = kv.get(series.KV_CAPACITY_TOKENS)
        a.max_concurrency_reported = kv.get(series.KV_MAX_CONCURRENCY)
        if a.blocks is not None and a.block_size_tokens:
            a.capacity_from_blocks = capacity_tokens(a.blocks, a.block_size_tokens)
        capacity = a.capacity_tokens if a.capacity_tokens is not None else a.capacity_from_blocks
        mml = _flag_int(info, "max-model-len", "VLLM_MAX_MODEL_LEN", "max_model_len")
        if mml is None and capacity and a.max_concurrency_reported:
            mml = round(capacity / a.max_concurrency_reported)
        a.max_model_len = mml
        if capacity and mml:
            a.max_concurrency_computed = max_concurrency(capacity, mml)
        bursts = [p for p in run.phases_of(instance) if p.scenario == "burst"]
        if bursts:
            a.burst_size = max(p.concurrency for p in bursts)
            burst_names = {p.phase for p in bursts}
            recs = [r for r in run.requests_of(instance) if r.phase in burst_names]
            longest = max(((r.prompt_tokens or 0) + (r.max_tokens or 0) for r in recs), default=0)
            if longest:
                a.tokens_per_sequence = longest
                if a.block_size_tokens:
                    a.blocks_per_sequence = blocks_for(longest, a.block_size_tokens)
                    a.burst_blocks = a.blocks_per_sequence * a.burst_size
        a.lines = _kv_lines(a, capacity)
        out.append(a)
    return out


def _kv_lines(a: KvArithmetic, capacity: float | None) -> list[str]:
    lines = []
    if a.blocks is not None and a.block_size_tokens:
        lines.append(
            f"{a.blocks:,.0f} blocks x {a.block_size_tokens:,.0f} tokens/block = {a.capacity_from_blocks:,.0f} tokens"
            + (
                f" (engine reports {a.capacity_tokens:,.0f})"
                if a.capacity_tokens is not None and abs(a.capacity_tokens - a.capacity_from_blocks) >= 1
                else ""
            )
        )
    elif capacity:
        lines.append(f"KV cache capacity {capacity:,.0f} tokens (block count not reported)")
    if capacity and a.max_model_len:
        lines.append(
            f"{capacity:,.0f} tokens / {a.max_model_len:,.0f} tokens max-model-len = "
            f"{a.max_concurrency_computed:.2f}x max concurrency at full length"
            + (f" (engine reports {a.max_concurrency_reported:.2f}x)" if a.max_concurrency_reported else "")
        )
    if a.burst_blocks is not None and a.blocks:
        share = a.burst_blocks / a.blocks
        lines.append(
            f"this run's burst: {a.burst_size} x ceil({a.tokens_per_sequence} tokens / "
            f"{a.block_size_tokens:,.0f}) = {a.burst_blocks} blocks at most, {share:.1%} of the pool"
            + (" -> does not fit: KV space is the limit" if share > 1 else "")
        )
    return lines


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:g}"


def to_json(verdicts: list[Verdict], kv: list[KvArithmetic]) -> dict:
    return {
        "rule": RULE,
        "kv_full_threshold": KV_FULL,
        "verdicts": [asdict(v) for v in verdicts],
        "kv_arithmetic": [asdict(a) for a in kv],
    }
