"""Ollama: what servescope knows about it (no /metrics: the exporter bridges /api/ps, /api/tags and its own proxy)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servescope import ollama_durations
from servescope.engines.base import BATCH_SLOTS, OLLAMA_API, EngineKind, Knob, Lever

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
    levers=(SLOTS,),
    stack_knobs=(SLOTS.env,),
    queue_means_slots=True,  # OLLAMA_NUM_PARALLEL requests per loaded model at once; the rest wait for one
    held_s=held_s,
)
# How servescope's Ollama proxy names itself in the Via header of every response it relays (RFC 9110 7.6.3):
# the load generator reads it to tell the proxy from an Ollama answering on the proxy's port.
PROXY_VIA = "servescope-ollama-proxy"
