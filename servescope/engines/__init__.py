"""The engine kinds' adapters: one module per engine (servescope/engines/<name>.py), imported as its registration line says.

`engines.kind(name)` is the adapter of a kind, `engines.ENGINES` all of them in the order of their registration lines
(servescope/contracts/engine_kinds.py: the one line an engine adds besides its adapter); the adapter's fields are in
servescope/engines/base.py. The four kinds named below are re-exported for the code that speaks of one of them.
"""

from __future__ import annotations

from importlib import import_module

from servescope.contracts.engine_kinds import REGISTERED
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

# Each registered kind's adapter: the EngineKind its module names after the kind's knob prefix (vllm.VLLM, tgi.TGI).
ENGINES: dict[str, EngineKind] = {
    entry.name: getattr(import_module(f"servescope.engines.{entry.name}"), entry.knobs) for entry in REGISTERED
}


def kind(name: str) -> EngineKind:
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine kind {name!r}: expected one of {', '.join(ENGINES)}") from None
