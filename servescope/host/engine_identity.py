"""What an engine says about itself (version, served models, serving settings): one reading for the exporter and the load generator.

Which endpoint says what is each adapter's `identity` (servescope/engines/<name>.py): vLLM's /v1/models and
/version, llama-server's /v1/models and /props, Ollama's /api/version and /api/tags.

`identify(kind, get_json, recoverable)` reads each endpoint on its own: an endpoint that fails with
one of the `recoverable` exceptions (or answers an unexpected shape) is noted in `errors` and the rest
is still read; anything else propagates (the exporter's "engine down"). `get_json(path)` is the caller's
transport; `http_get_json` is servescope/host/bounded_http.py's (one deadline over every GET of a probe, bodies capped,
JSON depth checked), the one the load generator and quick use.
"""

from __future__ import annotations

import time
from typing import Any

from servescope import engines
from servescope.engines.base import GetJson, Identity, openai_models, version_of
from servescope.engines.llamacpp import gguf_file_name
from servescope.engines.ollama import models_of as ollama_models
from servescope.host import bounded_http
from servescope.text import printable

__all__ = [
    "GetJson",
    "Identity",
    "gguf_file_name",
    "http_get_json",
    "identify",
    "ollama_models",
    "openai_models",
    "probe",
    "version_of",
]

PROBE_TIMEOUT_S = 5.0
MAX_VERSION_CHARS = 80  # "0.9.1", "b6000-abc", a build's long description: never a screenful


def identify(kind: str, get_json: GetJson, recoverable: tuple[type[BaseException], ...] = (ValueError,)) -> Identity:
    """Every identity endpoint of the engine kind (its adapter's), each read on its own."""
    endpoints = engines.kind(kind).identity
    identity = Identity()
    for endpoint in endpoints:
        try:
            endpoint.read(get_json(endpoint.path), identity)
        except (ValueError, KeyError, TypeError, *recoverable) as exc:
            identity.errors[endpoint.path] = printable.line(exc) or type(exc).__name__
    if identity.version is not None:
        # Echoed in terminal lines, run records and labels: "0.32.0\nok: everything is fine" must not forge a line.
        identity.version = printable.line(identity.version, limit=MAX_VERSION_CHARS) or None
    return identity


def http_get_json(origin: bounded_http.Origin, deadline: float) -> GetJson:
    """GET origin+path as JSON before `deadline`, raising ServiceError for a status >= 400 or a body that is not JSON."""

    def get_json(path: str) -> Any:
        answer = origin.get(path, deadline)
        if answer.status >= 400:
            raise bounded_http.ServiceError(f"GET {answer.url}: HTTP {answer.status}", reason=f"HTTP {answer.status}")
        return answer.json()

    return get_json


def probe(kind: str, root_url: str, *, api_key: str = "", timeout: float = PROBE_TIMEOUT_S) -> Identity:
    """identify() over the bounded client, every endpoint within `timeout` together; never raises for an engine that
    does not answer (its errors say why)."""
    try:
        origin = bounded_http.Origin(root_url, api_key=api_key, accept="application/json")
    except bounded_http.ServiceError as exc:
        return Identity(errors={"/": str(exc)})
    with origin:
        get_json = http_get_json(origin, time.monotonic() + timeout)
        return identify(kind, get_json, recoverable=(bounded_http.ServiceError,))
