"""What an engine says about itself (version, served models, serving settings): one reading for the exporter and the load generator.

Which endpoint says what is each adapter's `identity` (servescope/engines/<name>.py): vLLM's /v1/models and
/version, llama-server's /v1/models and /props, Ollama's /api/version and /api/tags.

`identify(kind, get_json, recoverable)` reads each endpoint on its own: an endpoint that fails with
one of the `recoverable` exceptions (or answers an unexpected shape) is noted in `errors` and the rest
is still read; anything else propagates (the exporter's "engine down"). `get_json(path)` is the caller's
transport; `http_get_json` is a plain `requests` one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from servescope import engines
from servescope.engines.base import GetJson, Identity, openai_models, version_of
from servescope.engines.llamacpp import gguf_file_name
from servescope.engines.ollama import models_of as ollama_models

# requests is imported where it is used: the exporter reads engines without it and keeps a smaller process
if TYPE_CHECKING:
    import requests

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


def identify(kind: str, get_json: GetJson, recoverable: tuple[type[BaseException], ...] = (ValueError,)) -> Identity:
    """Every identity endpoint of the engine kind (its adapter's), each read on its own."""
    endpoints = engines.kind(kind).identity
    identity = Identity()
    for endpoint in endpoints:
        try:
            endpoint.read(get_json(endpoint.path), identity)
        except (ValueError, KeyError, TypeError, *recoverable) as exc:
            identity.errors[endpoint.path] = " ".join(str(exc).split())[:200] or type(exc).__name__
    return identity


def http_get_json(
    root_url: str, *, session: requests.Session | None = None, api_key: str = "", timeout: float = PROBE_TIMEOUT_S
) -> GetJson:
    """GET root_url+path with `requests`, raising for a status >= 400; an API key goes as a Bearer token."""
    import requests

    session = session or requests.Session()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def get_json(path: str) -> Any:
        resp = session.get(root_url.rstrip("/") + path, headers=headers, timeout=timeout)
        resp.raise_for_status()
        return resp.json()

    return get_json


def probe(
    kind: str,
    root_url: str,
    *,
    session: requests.Session | None = None,
    api_key: str = "",
    timeout: float = PROBE_TIMEOUT_S,
) -> Identity:
    """identify() over plain HTTP; never raises for an engine that does not answer (its errors say why)."""
    import requests

    get_json = http_get_json(root_url, session=session, api_key=api_key, timeout=timeout)
    return identify(kind, get_json, recoverable=(requests.RequestException,))
