"""Which server resource ran out at a load, from the phase's own server samples, and the engine knob that adds more of it.

The seed's section 4, applied to one load level: requests waiting while the KV pool had room ->
the batch slots ran out (vLLM --max-num-seqs, llama.cpp --parallel, OLLAMA_NUM_PARALLEL); waiting
with the pool near full -> KV capacity (VLLM_CPU_KVCACHE_SPACE or a shorter --max-model-len,
llama.cpp's context -c); nothing waiting while latency still grew with the load -> compute: every
request was admitted and each step just took longer, and no serving knob buys more of that. The KV
pool's state while requests waited is thresholds.kv_pool_state, the rule the report's verdict and
the alert rules use.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from servescope import series, thresholds
from servescope.runfolder import SampleRecord

BATCH_SLOTS = "batch slots"
KV_CAPACITY = "KV capacity"
COMPUTE = "compute"
UNKNOWN = "unknown"
RESOURCES = (BATCH_SLOTS, KV_CAPACITY, COMPUTE, UNKNOWN)


@dataclass(frozen=True)
class Knob:
    env: str  # the knob in .env.example that the native stack and Compose pass to the engine
    flag: str  # what the engine calls it
    advice: str  # what to do with it


KNOBS: dict[tuple[str, str], Knob] = {
    ("vllm", BATCH_SLOTS): Knob("VLLM_MAX_NUM_SEQS", "--max-num-seqs", "raise it"),
    ("vllm", KV_CAPACITY): Knob(
        "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_KVCACHE_SPACE (GiB)", "raise it, or lower --max-model-len"
    ),
    ("llamacpp", BATCH_SLOTS): Knob("LLAMACPP_PARALLEL", "--parallel", "raise it, and LLAMACPP_CTX with it"),
    ("llamacpp", KV_CAPACITY): Knob("LLAMACPP_CTX", "-c (--ctx-size)", "raise it"),
    ("ollama", BATCH_SLOTS): Knob("OLLAMA_NUM_PARALLEL", "OLLAMA_NUM_PARALLEL", "raise it"),
}


def knob_for(engine: str, resource: str) -> Knob | None:
    """The engine's knob for a resource; None for compute (no serving knob adds cores) or a pairing with no rule."""
    return KNOBS.get((engine, resource))


@dataclass
class Binding:
    resource: str  # one of RESOURCES
    evidence: str  # the numbers it was read from, in words
    samples: int = 0  # readable samples of the phase(s)
    waiting_share: float | None = None  # share of them that saw a request waiting
    peak_waiting: float | None = None
    peak_running: float | None = None
    kv_max_while_waiting: float | None = None
    kv_mean_while_waiting: float | None = None
    kv_peak: float | None = None

    def to_json(self) -> dict:
        return asdict(self)

    def advice(self, engine: str, current: str | None = None) -> str:
        """The binding resource and what to turn, in one line."""
        knob = knob_for(engine, self.resource)
        if self.resource == COMPUTE:
            return f"{COMPUTE}: no serving knob adds more (fewer or shorter requests, more cores, a smaller model)"
        if knob is None:
            return f"{self.resource}: no knob rule for {engine}"
        now = f" (now {current})" if current not in (None, "") else ""
        return f"{self.resource}: {knob.advice} - {knob.flag}, knob {knob.env}{now}"


def classify(samples: Iterable[SampleRecord]) -> Binding:
    """The binding resource over one load level's samples (one instance, one or more phases at that level)."""
    readable = [s for s in samples if not s.missing and series.REQUESTS_WAITING in s.values]
    if not readable:
        return Binding(UNKNOWN, "no readable server samples at this load (is the exporter up? SAMPLE_INTERVAL_MS > 0?)")
    waiting = [s.values[series.REQUESTS_WAITING] for s in readable]
    running = [s.values[series.REQUESTS_RUNNING] for s in readable if series.REQUESTS_RUNNING in s.values]
    kv_all = [s.values[series.KV_CACHE_USAGE] for s in readable if series.KV_CACHE_USAGE in s.values]
    waited = [s for s in readable if s.values[series.REQUESTS_WAITING] > 0]
    kv_waiting = [s.values[series.KV_CACHE_USAGE] for s in waited if series.KV_CACHE_USAGE in s.values]
    b = Binding(
        UNKNOWN,
        "",
        samples=len(readable),
        waiting_share=len(waited) / len(readable),
        peak_waiting=max(waiting),
        peak_running=max(running) if running else None,
        kv_max_while_waiting=max(kv_waiting) if kv_waiting else None,
        kv_mean_while_waiting=sum(kv_waiting) / len(kv_waiting) if kv_waiting else None,
        kv_peak=max(kv_all) if kv_all else None,
    )
    seen = f"waiting > 0 in {len(waited)} of {len(readable)} samples (peak {b.peak_waiting:g})"
    if b.waiting_share < thresholds.BINDING_WAITING_SHARE:
        kv = f", KV peaked at {b.kv_peak:.0%}" if b.kv_peak is not None else ""
        run = f", running peaked at {b.peak_running:g}" if b.peak_running is not None else ""
        b.resource = COMPUTE
        b.evidence = f"nothing queued: {seen}{run}{kv}; every request was admitted and latency grew with the batch"
        return b
    pool = thresholds.kv_pool_state(b.kv_max_while_waiting, b.kv_mean_while_waiting)
    if pool in ("full", "between"):
        b.resource = KV_CAPACITY
        b.evidence = (
            f"requests waited on the KV pool: {seen}, KV usage while they waited mean "
            f"{b.kv_mean_while_waiting:.0%}, highest {b.kv_max_while_waiting:.0%}"
            + (
                f" (between {thresholds.KV_ROOM:.0%} and {thresholds.KV_FULL:.0%}: KV first, as the verdict says)"
                if pool == "between"
                else ""
            )
        )
    else:
        b.resource = BATCH_SLOTS
        kv = (
            f"KV usage stayed below {thresholds.KV_ROOM:.0%} (highest {b.kv_max_while_waiting:.0%})"
            if pool == "room"
            else "KV usage unknown"
        )
        run = f", running peaked at {b.peak_running:g}" if b.peak_running is not None else ""
        b.evidence = f"requests waited for a slot: {seen}{run}; {kv}"
    return b
