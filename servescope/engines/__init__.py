"""The one registry of engine kinds: API flavour, health and metrics paths, default port and its env var."""

from __future__ import annotations

from dataclasses import dataclass

from servescope import knobs


@dataclass(frozen=True)
class EngineKind:
    name: str  # the `engine` label value everywhere: vllm, llamacpp, ollama
    title: str  # how reports and dashboards name it
    api: str  # "openai" (SSE chat completions) or "ollama" (native NDJSON /api/chat)
    health_path: str  # a GET that answers 200 once the engine can serve
    metrics_path: str | None  # Prometheus text exposition, None when the engine has none
    port_env: str  # the knob that moves its port
    url_env: str  # the knob that points the exporter/loadgen at an existing instance
    chat_path: str  # where chat requests go
    accepts_ignore_eos: bool  # whether the engine honours `ignore_eos` in a request
    api_key_env: str | None  # the knob holding the key of an engine started with --api-key; None: it has no such flag
    # The knob of the port where the stack's exporter relays this engine's requests (Ollama: its proxy, the only
    # place its requests in flight can be seen); None: load goes to the engine itself.
    proxy_port_env: str | None = None

    @property
    def default_port(self) -> int:
        return knobs.get_int(self.port_env)

    def default_url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.default_port}"


VLLM = EngineKind(
    name="vllm",
    title="vLLM-CPU",
    api="openai",
    health_path="/v1/models",
    metrics_path="/metrics",
    port_env="VLLM_PORT",
    url_env="VLLM_URL",
    chat_path="/v1/chat/completions",
    accepts_ignore_eos=True,
    api_key_env="VLLM_API_KEY",
)
LLAMACPP = EngineKind(
    name="llamacpp",
    title="llama.cpp server",
    api="openai",
    health_path="/health",
    metrics_path="/metrics",
    port_env="LLAMACPP_PORT",
    url_env="LLAMACPP_URL",
    chat_path="/v1/chat/completions",
    accepts_ignore_eos=True,
    api_key_env="LLAMACPP_API_KEY",
)
# Ollama has no /metrics: the exporter bridges /api/ps, /api/tags and its own proxy.
OLLAMA = EngineKind(
    name="ollama",
    title="Ollama",
    api="ollama",
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

ENGINES: dict[str, EngineKind] = {kind.name: kind for kind in (VLLM, LLAMACPP, OLLAMA)}


def kind(name: str) -> EngineKind:
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine kind {name!r}: expected one of {', '.join(ENGINES)}") from None
