"""The engine adapter: everything servescope knows about one engine kind, as data and pure functions."""

from __future__ import annotations

from dataclasses import dataclass

from servescope import knobs

# The request APIs the load generator speaks: OpenAI's SSE chat completions, Ollama's native NDJSON /api/chat.
OPENAI_API = "openai"
OLLAMA_API = "ollama"


@dataclass(frozen=True)
class EngineKind:
    """One engine kind. The fields say where it listens and how it is asked; servescope/engines/<name>.py fills them."""

    name: str  # the `engine` label value everywhere: vllm, llamacpp, ollama
    title: str  # how reports and dashboards name it
    api: str  # OPENAI_API or OLLAMA_API
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
