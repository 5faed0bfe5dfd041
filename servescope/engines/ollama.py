"""Ollama: what servescope knows about it (no /metrics: the exporter bridges /api/ps, /api/tags and its own proxy)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servescope.contracts import series, thresholds
from servescope.engines import ollama_durations
from servescope.engines import panels as ui
from servescope.engines.base import (
    ALERT_LASTED,
    BATCH_SLOTS,
    DURATIONS,
    OLLAMA_API,
    Alert,
    AlertRules,
    Endpoint,
    EngineKind,
    Identity,
    Knob,
    Lever,
    Native,
    RequestTimings,
    Signature,
    registered_knobs,
    version_endpoint,
    version_object,
)


def models_of(payload: object, path: str = "/api/tags") -> list[dict]:
    """The `models` list of its /api/tags or /api/ps (entries that are not objects are left out)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("models"), list):
        raise ValueError(f"{path}: expected an object with a 'models' list")
    return [entry for entry in payload["models"] if isinstance(entry, dict)]


def _set_installed(payload: object, identity: Identity) -> None:
    names = (entry.get("name") or entry.get("model") for entry in models_of(payload))
    identity.models = {name: None for name in names if isinstance(name, str) and name}


SLOTS = Lever(
    BATCH_SLOTS,
    Knob("OLLAMA_NUM_PARALLEL", "OLLAMA_NUM_PARALLEL", None, ("num_parallel",)),
    advice="raise it",
    name="ollama_num_parallel",
    words="raise OLLAMA_NUM_PARALLEL{now}",
)


def held_s(stats: Mapping[str, Any]) -> float | None:
    """What its final object's durations hold beyond the model's parts (the load generator keeps them as *_ns)."""
    return ollama_durations.held_s(stats, "_ns")


# Ollama reports no queue; its own durations do: read from what the exporter's proxy saw (servescope_proxy_queue_seconds),
# the same rule as the report's TTFT split and its threshold; never from requests in flight against
# OLLAMA_NUM_PARALLEL, which would be the knob's own assumption read back as a measurement.
ALERTS = AlertRules(
    file="ollama.yml",
    group="ollama-concurrency",
    waiting=Alert(
        "OllamaRequestsQueued",
        "ollama-num-parallel",
        "Ollama {{ $labels.instance }}: requests wait inside Ollama for a parallel slot: raise OLLAMA_NUM_PARALLEL",
        f"""For over {ALERT_LASTED} the requests relayed to Ollama {{{{ $labels.instance }}}} through the
        exporter's proxy spent on average {{{{ $value | humanizeDuration }}}} inside Ollama outside
        loading the model, evaluating the prompt and generating (its own total_duration minus
        load_duration, prompt_eval_duration and eval_duration; {thresholds.TTFT_QUEUED_MIN_S * 1000:g} ms or more
        counts as a wait): they queued for one of its {SLOTS.env} slots, and the wait is part of their
        TTFT. Raise {SLOTS.env} in .env (each parallel slot multiplies the context memory of
        the loaded model) or send fewer concurrent requests.""",
    ),
)

# No /metrics: its running and waiting are what the exporter's proxy observed of the requests it relayed, labelled
# source="proxy"; its version and models come from its API.
EXPLAINS = {
    series.REQUESTS_RUNNING: (
        'source="proxy", observed by the exporter\'s proxy, which Ollama itself does not report: requests the proxy '
        "relayed whose answer has begun to stream (first chunk relayed) and not ended, i.e. being generated. Only "
        "requests sent through the proxy count; no series until it relayed one for the model"
    ),
    series.REQUESTS_WAITING: (
        'source="proxy": requests the proxy relayed with no byte of their answer yet: queued for one of '
        "Ollama's parallel slots, waiting for the model to load, or evaluating their prompt (the proxy cannot tell "
        'which; a "stream": false request stays here until its whole answer). Only requests sent through the proxy '
        "count; no series until it relayed one for the model"
    ),
    series.GENERATED_TOKENS: "eval_count / usage.completion_tokens of responses seen by the proxy",
    series.PROMPT_TOKENS: "prompt_eval_count / usage.prompt_tokens of responses seen by the proxy",
    series.ENGINE_INFO: "GET /api/version",
}

# Its own dashboard (servescope-ollama): what the exporter reads of its API, and what its proxy saw.
DASHBOARD = ui.Dashboard(
    about=(
        "Ollama through the exporter: loaded models and their memory, time until unload, "
        "generation speed, cold loads, what the proxy observed in flight and Ollama's own queue time."
    ),
    panels=(
        ui.row("Models"),
        ui.stat(
            "Loaded models",
            "Models in memory now (GET /api/ps).",
            "none",
            ui.query(ui.COUNT, series.OLLAMA_MODEL_SIZE, of=ui.MODEL),
            width=6,
        ),
        ui.stat(
            "Installed models",
            "Models on disk (GET /api/tags).",
            "none",
            ui.query(ui.COUNT, series.OLLAMA_MODEL_INFO, of=ui.ENGINE),
            width=6,
        ),
        ui.stat(
            "Ollama up",
            "1 when the exporter read /api/ps and /api/tags.",
            "none",
            ui.query(ui.GAUGE, series.ENGINE_UP, of=ui.ENGINE),
            width=6,
            up=True,
        ),
        ui.stat(
            f"{SLOTS.env} (configured)",
            "Requests per loaded model Ollama is said to run at once, as given to the exporter: configured, not "
            "observed (Ollama reports no such value).",
            "none",
            ui.query(ui.GAUGE, series.PROXY_NUM_PARALLEL, of=ui.ENGINE),
            width=6,
        ),
        ui.timeseries(
            "Memory and VRAM size",
            "size and size_vram of each loaded model (GET /api/ps).",
            "bytes",
            ui.query(ui.GAUGE, series.OLLAMA_MODEL_SIZE, "size {{model}}", of=ui.MODEL),
            ui.query(ui.GAUGE, series.OLLAMA_MODEL_VRAM, "vram {{model}}", of=ui.MODEL),
        ),
        ui.timeseries(
            "Time until unload",
            "expires_at - now per loaded model: after it Ollama unloads the model "
            "and the next request pays a cold load.",
            "s",
            ui.query(ui.GAUGE, series.OLLAMA_MODEL_EXPIRES, "{{model}}", of=ui.MODEL),
        ),
        ui.timeseries(
            "Context length",
            "context_length of each loaded model.",
            "suffix: tokens",
            ui.query(ui.GAUGE, series.OLLAMA_MODEL_CONTEXT, "{{model}}", of=ui.MODEL),
        ),
        ui.row("Concurrency: what the exporter's proxy observed of the requests it relayed (none sent around it)"),
        ui.timeseries(
            "Streaming and awaiting a first chunk (proxy)",
            "Relayed requests whose answer is streaming (servescope_requests_running, source=proxy) and those "
            "without a byte of it yet (servescope_requests_waiting: queued for a slot, loading the model or "
            "evaluating the prompt; the proxy cannot tell which). No data: nothing went through the proxy. "
            f"Streaming flat at the configured {SLOTS.env} while others await theirs: the slots are full.",
            "short",
            ui.query(ui.SUM, series.REQUESTS_RUNNING, "streaming {{instance}}", of=ui.PROXY),
            ui.query(ui.SUM, series.REQUESTS_WAITING, "awaiting first chunk {{instance}}", of=ui.PROXY),
            ui.query(ui.GAUGE, series.PROXY_NUM_PARALLEL, f"{SLOTS.env} (configured) {{{{instance}}}}", of=ui.ENGINE),
        ),
        ui.timeseries(
            "Queue inside Ollama (its own durations)",
            "Mean per request of total_duration - load_duration - prompt_eval_duration - eval_duration from Ollama's "
            "final object (servescope_proxy_queue_seconds, /api/chat and /api/generate): the time Ollama held it "
            f"outside the model, waiting for one of its {SLOTS.env} slots. 50 ms or more for 2 minutes "
            f"fires {ALERTS.waiting.name}.",
            "s",
            ui.query(ui.MEAN, series.PROXY_QUEUE_SECONDS, of=ui.ENGINE),
        ),
        ui.timeseries(
            "Requests/s through the proxy",
            "servescope_proxy_requests_total by outcome.",
            "reqps",
            ui.query(
                ui.RATE, series.PROXY_REQUESTS, "{{outcome}} {{instance}}", of=ui.ENGINE, by=("instance", "outcome")
            ),
        ),
        ui.row("Speed (from each response's final object: eval_count / eval_duration, load_duration)"),
        ui.timeseries(
            "Generation tokens/s",
            "Per-request eval_count / eval_duration (p50, p95), and the sum of output tokens per second.",
            ui.TOKENS_PER_S,
            ui.query(ui.QUANTILES, series.PROXY_GEN_TOKENS_PER_SECOND, "per request {{instance}}", of=ui.ENGINE),
            ui.query(ui.RATE, series.GENERATED_TOKENS, "total {{instance}}", of=ui.MODEL),
        ),
        ui.timeseries(
            "Load (cold-start) duration",
            "load_duration of responses: large when the model was not "
            "loaded (first request, or after keep-alive expired).",
            "s",
            ui.query(ui.QUANTILES, series.PROXY_LOAD_SECONDS, of=ui.ENGINE),
        ),
        ui.timeseries(
            "First chunk and prompt eval",
            "Proxy-observed time to the first chunk, and prompt_eval_duration.",
            "s",
            ui.query(ui.QUANTILES, series.PROXY_FIRST_CHUNK_SECONDS, "first chunk", of=ui.ENGINE),
            ui.query(ui.QUANTILES, series.PROXY_PROMPT_EVAL_SECONDS, "prompt eval", of=ui.ENGINE),
        ),
    ),
    # The comparison dashboard's words: its running and waiting are what the proxy observed.
    named="Ollama",
    running=(
        "Ollama, source=proxy: requests the exporter's proxy relayed whose answer is streaming, none when nothing "
        "went through it"
    ),
    waiting=(
        "Ollama (source=proxy): relayed requests without a byte of their answer yet, queued, loading or evaluating "
        "the prompt alike: its queue is on the Ollama dashboard, from its own durations."
    ),
)

OLLAMA = EngineKind(
    name="ollama",
    title="Ollama",
    api=OLLAMA_API,
    health_path="/api/version",
    metrics_path=None,
    chat_path="/api/chat",
    accepts_ignore_eos=False,
    proxy_port_env="OLLAMA_PROXY_PORT",
    **registered_knobs("ollama"),
    short="Ollama",
    colour="C1",
    own_port=11434,
    # The stack's Ollama proxy relays /api/version too: the same answer.
    signature=Signature("/api/version", version_object, rank=10),
    explains=EXPLAINS,
    model_env="OLLAMA_MODEL",
    lists_installed=True,
    # /api/version says {"version"}; /api/tags lists the installed models (what it can serve).
    identity=(version_endpoint("/api/version"), Endpoint("/api/tags", _set_installed)),
    levers=(SLOTS,),
    stack_knobs=(SLOTS.env,),
    queue_means_slots=True,  # OLLAMA_NUM_PARALLEL requests per loaded model at once; the rest wait for one
    held_s=held_s,
    alerts=ALERTS,
    timings=RequestTimings(DURATIONS),  # total, load, prompt_eval and eval durations in each final object
    # The native stack starts an installed one, or uses one already answering, and serves it the same GGUF
    # (servescope/stack/ollama.py); none here is "absent", not a failure.
    native=Native("servescope.stack.ollama", found=True),
    dashboard=DASHBOARD,
)
# How servescope's Ollama proxy names itself in the Via header of every response it relays (RFC 9110 7.6.3):
# the load generator reads it to tell the proxy from an Ollama answering on the proxy's port.
PROXY_VIA = "servescope-ollama-proxy"
