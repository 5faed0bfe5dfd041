"""llama.cpp's llama-server: what servescope knows about it."""

from __future__ import annotations

from servescope.engines.base import OPENAI_API, EngineKind

LLAMACPP = EngineKind(
    name="llamacpp",
    title="llama.cpp server",
    api=OPENAI_API,
    health_path="/health",
    metrics_path="/metrics",
    port_env="LLAMACPP_PORT",
    url_env="LLAMACPP_URL",
    chat_path="/v1/chat/completions",
    accepts_ignore_eos=True,
    api_key_env="LLAMACPP_API_KEY",
)
