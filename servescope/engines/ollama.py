"""Ollama: what servescope knows about it (no /metrics: the exporter bridges /api/ps, /api/tags and its own proxy)."""

from __future__ import annotations

from servescope.engines.base import OLLAMA_API, EngineKind

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
)
# How servescope's Ollama proxy names itself in the Via header of every response it relays (RFC 9110 7.6.3):
# the load generator reads it to tell the proxy from an Ollama answering on the proxy's port.
PROXY_VIA = "servescope-ollama-proxy"
