"""Ollama: what servescope knows about it (no /metrics: the exporter bridges /api/ps, /api/tags and its own proxy)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servescope.contracts import series, thresholds
from servescope.engines import ollama_durations
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
    RequestTimings,
    Signature,
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

OLLAMA = EngineKind(
    name="ollama",
    title="Ollama",
    api=OLLAMA_API,
    health_path="/api/version",
    metrics_path=None,
    port_env="OLLAMA_PORT",
    url_env="OLLAMA_URL",
    chat_path="/api/chat",
    accepts_ignore_eos=False,
    api_key_env=None,
    proxy_port_env="OLLAMA_PROXY_PORT",
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
)
# How servescope's Ollama proxy names itself in the Via header of every response it relays (RFC 9110 7.6.3):
# the load generator reads it to tell the proxy from an Ollama answering on the proxy's port.
PROXY_VIA = "servescope-ollama-proxy"
