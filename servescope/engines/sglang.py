"""SGLang's server (sglang.launch_server): what servescope knows about it, from its documentation and its source.

Nothing here was seen live: SGLang cannot be installed on this project's machines. The metric names are those of
its production-metrics page (docs/references/production_metrics.md: the page in
tests/fixtures/sglang-0.5-metrics-from-docs.txt is written from it); a few more come from its metrics collector's
source (python/sglang/srt/metrics/collector.py) and are read only when present: sglang:cached_tokens_total,
sglang:num_retracted_requests_total, sglang:max_total_num_tokens, sglang:queue_time_seconds. The endpoints are its
http_server's: /health, /get_model_info, /get_server_info (its server args and "version"), and the OpenAI API under
/v1 (/v1/models entries carry max_model_len, requests accept ignore_eos).
"""

from __future__ import annotations

from typing import Any

from servescope.contracts import series, thresholds
from servescope.engines.base import (
    ALERT_LASTED,
    BATCH_SLOTS,
    HISTOGRAMS,
    KV_CAPACITY,
    OPENAI_MODELS,
    Alert,
    AlertRules,
    Endpoint,
    Identity,
    Knob,
    Lever,
    MetricsPage,
    RequestTimings,
    Signature,
    Source,
    openai_server,
)

# Its server arguments a run records as its settings (GET /get_server_info), beside max_total_num_tokens, the
# token capacity of its KV pool as the scheduler sized it.
SETTINGS = (
    "max_running_requests",
    "max_total_tokens",
    "context_length",
    "chunked_prefill_size",
    "mem_fraction_static",
    "max_total_num_tokens",
)


def _server_info(payload: object, identity: Identity) -> None:
    if not isinstance(payload, dict):
        raise ValueError("/get_server_info: expected an object")
    version = payload.get("version")
    if isinstance(version, str) and version:
        identity.version = version
    identity.settings.update(
        {key: payload[key] for key in SETTINGS if isinstance(payload.get(key), int | float | str | bool)}
    )


def _is_sglang(status: int, payload: Any) -> bool:
    return status == 200 and isinstance(payload, dict)


MAX_MODEL_LEN = Knob("--context-length", None, "--context-length", ("context_length",))
# Servescope does not start SGLang: its levers are its own flags, with no knob of the stack's behind them.
SLOTS = Lever(
    BATCH_SLOTS,
    Knob("--max-running-requests", None, "--max-running-requests", ("max_running_requests",)),
    advice="raise it",
    name="max_running_requests",
    words="raise --max-running-requests{now}",
)
# Its KV pool is a share of the accelerator's memory (--mem-fraction-static), or a token count (--max-total-tokens).
KV = Lever(
    KV_CAPACITY,
    Knob("--mem-fraction-static", None, "--mem-fraction-static", ("mem_fraction_static",)),
    advice="raise it (or --max-total-tokens), or lower --context-length",
    name="mem_fraction_static_or_context_length",
    words="raise --mem-fraction-static{now} (or --max-total-tokens) or lower --context-length{max_model_len}",
)

E2E = "sglang:e2e_request_latency_seconds"
# The docs page labels every series with model_name; its source adds engine_type, tp_rank, pp_rank and more: counts
# are summed and the token usage averaged over those, as for vLLM's data-parallel ranks (inferred, not seen live).
PAGE = MetricsPage(
    prefix="sglang:",
    model_label="model_name",
    sources=(
        Source(series.REQUESTS_RUNNING, ("sglang:num_running_reqs",)),
        Source(series.REQUESTS_WAITING, ("sglang:num_queue_reqs",)),
        Source(
            series.KV_CACHE_USAGE,
            ("sglang:token_usage",),
            ratio=True,
            mean=True,
            optional=True,
            note="tokens held over the pool's tokens",
        ),
        Source(series.GENERATED_TOKENS, ("sglang:generation_tokens_total",), counter=True),
        Source(series.PROMPT_TOKENS, ("sglang:prompt_tokens_total",), counter=True),
        Source(
            series.PROMPT_CACHED_TOKENS,
            ("sglang:cached_tokens_total",),
            counter=True,
            optional=True,
            note="builds that have it; sglang:cache_hit_rate, a gauge of a recent rate, is no count and is not read",
        ),
        # A retracted request is taken out of the running batch to free KV for others and rerun: its preemption.
        Source(series.PREEMPTIONS, ("sglang:num_retracted_requests_total",), counter=True, optional=True),
        Source(
            series.KV_CAPACITY_TOKENS,
            ("sglang:max_total_num_tokens",),
            optional=True,
            note="builds that have it",
        ),
    ),
    latency={
        "ttft": ("sglang:time_to_first_token_seconds",),
        "itl": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        "e2e": (E2E,),
    },
    how_on="sglang.launch_server: start it with --enable-metrics",
)

ALERTS = AlertRules(
    file="sglang.yml",
    group="sglang-kv-cache-levers",
    waiting=Alert(
        "SglangQueueWithKvCacheToSpare",
        "max-running-requests",
        "SGLang {{ $labels.instance }}: requests queue while the KV cache has room: raise --max-running-requests",
        f"""SGLang {{{{ $labels.instance }}}} has had at least {{{{ $value }}}} request(s) waiting for over
        {ALERT_LASTED} while its token usage stayed below {thresholds.KV_ROOM:.0%}, so the running batch is capped by
        {SLOTS.flag}, not by memory. Raise it and restart SGLang; every extra request needs its own KV tokens.""",
    ),
    kv_full=Alert(
        "SglangQueueWithKvCacheFull",
        "mem-fraction-static",
        f"SGLang {{{{ $labels.instance }}}}: requests queue on a full KV cache: raise {KV.flag} or lower "
        f"{MAX_MODEL_LEN.flag}",
        f"""SGLang {{{{ $labels.instance }}}} has had at least {{{{ $value }}}} request(s) waiting for over
        {ALERT_LASTED} with its token usage at {thresholds.KV_FULL:.0%} or more, so requests wait for KV space.
        Raise {KV.flag} (or --max-total-tokens) or lower {MAX_MODEL_LEN.flag}; raising {SLOTS.flag} would only
        queue more on memory.""",
    ),
)

SGLANG = openai_server(
    "sglang",
    title="SGLang",
    health_path="/health",  # /metrics only with --enable-metrics
    short="SGLang",
    colour="C3",
    own_port=30000,
    signature=Signature("/get_model_info", _is_sglang, rank=30),
    metrics=PAGE,
    explains={series.ENGINE_INFO: "GET /get_server_info version"},
    identity=(OPENAI_MODELS, Endpoint("/get_server_info", _server_info)),
    levers=(SLOTS, KV),
    max_model_len=MAX_MODEL_LEN,
    prefill_in_batch="SGLang: chunked prefill under --chunked-prefill-size",
    alerts=ALERTS,
    # Its OpenAI responses carry no timings: the means of its own histograms over a run's window stand in for them.
    timings=RequestTimings(
        HISTOGRAMS,
        {"queue": "sglang:queue_time_seconds", "server_e2e": E2E},
        why_aggregate="SGLang's OpenAI responses carry no per-request timings",
    ),
)
