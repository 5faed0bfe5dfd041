"""The one registry of engine kinds: one adapter module per engine (servescope/engines/<name>.py), listed here.

`engines.kind(name)` is the adapter of a kind, `engines.ENGINES` all of them in the order the stack and reports
list them; the adapter's fields are in servescope/engines/base.py.
"""

from __future__ import annotations

from servescope.engines.base import OLLAMA_API, OPENAI_API, EngineKind
from servescope.engines.llamacpp import LLAMACPP
from servescope.engines.ollama import OLLAMA, PROXY_VIA
from servescope.engines.sglang import SGLANG
from servescope.engines.vllm import VLLM

__all__ = [
    "ENGINES",
    "LLAMACPP",
    "OLLAMA",
    "OLLAMA_API",
    "OPENAI_API",
    "PROXY_VIA",
    "SGLANG",
    "VLLM",
    "EngineKind",
    "kind",
]

ENGINES: dict[str, EngineKind] = {adapter.name: adapter for adapter in (VLLM, LLAMACPP, OLLAMA, SGLANG)}


def kind(name: str) -> EngineKind:
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine kind {name!r}: expected one of {', '.join(ENGINES)}") from None
