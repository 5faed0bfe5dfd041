"""The engine kinds servescope knows, one registration line each: its adapter's module and its knobs' names and port.

The list lives on the bottom floor because the knob table (servescope/contracts/knob_defaults.py) writes each engine's
port, URL and API-key rows from it, and the knob table cannot import the adapters a floor above; the engines package
(servescope/engines/__init__.py) imports the adapters this list names, in its order.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Registration:
    """One engine kind's registration line: its adapter's name, its knobs' prefix and its default port."""

    name: str  # the kind's name, and its adapter: servescope/engines/<name>.py, whose EngineKind is named <knobs>
    knobs: str  # its knobs' prefix: <knobs>_PORT, <knobs>_URL and, with api_key, <knobs>_API_KEY
    port: str  # <knobs>_PORT's default: where the stack starts it, or where the load generator looks for it
    port_help: str = ""  # said above <knobs>_PORT in .env.example and docs/knobs.md
    api_key: bool = True  # False: the engine has no --api-key, so no key knob (Ollama)

    @property
    def port_env(self) -> str:
        return f"{self.knobs}_PORT"

    @property
    def url_env(self) -> str:
        return f"{self.knobs}_URL"

    @property
    def api_key_env(self) -> str | None:
        return f"{self.knobs}_API_KEY" if self.api_key else None


# The order is the one the stack, the reports and the knob files list engines in.
REGISTERED: tuple[Registration, ...] = (
    Registration("vllm", "VLLM", "8009"),
    Registration("llamacpp", "LLAMACPP", "8081"),
    Registration("ollama", "OLLAMA", "11434", api_key=False),
    Registration(
        "sglang",
        "SGLANG",
        "30000",
        "SGLang (its own default): the stack does not start it; `loadgen --engine sglang` without a URL goes here.",
    ),
)

BY_NAME: dict[str, Registration] = {entry.name: entry for entry in REGISTERED}


def registration(name: str) -> Registration:
    """The registration of an engine kind (KeyError: an adapter whose kind has no line above)."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"engine kind {name!r} has no line in servescope/contracts/engine_kinds.REGISTERED") from None
