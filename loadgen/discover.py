"""Which LLM servers answer on this machine's usual ports, and what each one is (`python -m loadgen quick`).

A server is told by the endpoint only its engine has (each adapter's signature, servescope/engines/<name>.py,
beside the servers servescope knows but cannot measure), asked most particular first (the first that answers
decides):

  Ollama     GET /api/version  {"version"}        (the stack's Ollama proxy relays it: the same answer)
  llama.cpp  GET /props        total_slots / default_generation_settings
  SGLang     GET /get_model_info
  LM Studio  GET /api/v0/models                   (servescope has no engine kind for it: named, not measured)
  vLLM       GET /version      {"version"}
  other      GET /v1/models    an OpenAI model list and none of the above: "an OpenAI-compatible server"

Then servescope/host/engine_identity.py reads the version and models of the kinds servescope has. The ports
probed are the stack's port knobs and each engine's own default, or QUICK_PORTS / --ports when given; only 127.0.0.1 is probed. An Ollama reached both on its own port and through the stack's proxy
(OLLAMA_PROXY_PORT, the same version, models and loaded models) is measured once, through the proxy: its
gauges are what the proxy relayed (Ollama reports no requests in flight itself), its own port shows none.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from servescope import engines
from servescope.contracts.settings import KnobTable
from servescope.contracts.urls import parse_http_url, redact_address
from servescope.host import bounded_http, engine_identity
from servescope.text import printable

HOST = "127.0.0.1"
TIMEOUT_S = (
    1.0  # per GET while looking, all of it: a local server answers in milliseconds, a port nobody listens on at once
)
# What a signature GET may answer: a version, a model list (Ollama's tags of a few hundred models: tens of KB).
MAX_ANSWER_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Usual:
    """One port discovery asks at: whose port it is, in words, and the knob or default that puts a server there."""

    port: int
    what: str  # whose port it is, in words
    source: str  # the knob that sets it, or whose default it is


@dataclass(frozen=True)
class Known:
    """A server servescope can tell but not measure: where it listens by default and its signature."""

    what: str
    port: int
    signature: engines.base.Signature


def _answers(status: int, payload: Any) -> bool:
    return status == 200 and isinstance(payload, dict)


def _models(status: int, payload: Any) -> bool:
    return _answers(status, payload) and isinstance(payload.get("data"), list)


# Known but not measured (an adapter of the same name, once there is one, takes its place: see unmeasured()).
UNMEASURED = (Known("LM Studio", 1234, engines.base.Signature("/api/v0/models", _answers, rank=40)),)
OPENAI_COMPATIBLE = Known("an OpenAI-compatible server", 0, engines.base.Signature("/v1/models", _models, rank=90))


def unmeasured() -> list[Known]:
    """The servers servescope can tell but has no adapter for."""
    measured = {kind.said for kind in engines.ENGINES.values()}
    return [k for k in UNMEASURED if k.what not in measured]


class DiscoverError(ValueError):
    """A bad port list or URL: one line."""


def usual_ports(knobs: KnobTable) -> list[Usual]:
    """The ports quick looks at with no URL: QUICK_PORTS when set, else the stack's knobs and the engines' defaults
    (per engine: the stack's proxy in front of it first, then its own default, then the stack's knob)."""
    listed = knobs.text("QUICK_PORTS").strip()
    if listed:
        return parse_ports(listed, "QUICK_PORTS")
    table: list[Usual] = []
    for kind in engines.ENGINES.values():
        if kind.proxy_port_env:
            table.append(Usual(knobs.int(kind.proxy_port_env), f"the stack's {kind.said} proxy", kind.proxy_port_env))
        port = kind.port_in(knobs)
        if kind.own_port and kind.own_port != port:  # the same port: the knob is what set it
            table.append(Usual(kind.own_port, kind.said, f"{kind.said}'s default"))
        table.append(Usual(port, kind.said, kind.port_env))
    table += [Usual(k.port, k.what, f"{k.what}'s default") for k in unmeasured()]
    seen: set[int] = set()
    return [u for u in table if not (u.port in seen or seen.add(u.port))]


def parse_ports(text: str, where: str = "--ports") -> list[Usual]:
    ports = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or not 0 < int(part) < 65536:
            raise DiscoverError(f"{where} {text!r}: expected ports from 1 to 65535, comma-separated (e.g. 8009,8081)")
        ports.append(Usual(int(part), f"port {part}", where))
    if not ports:
        raise DiscoverError(f"{where} {text!r}: expected at least one port")
    return ports


@dataclass
class Server:
    """What answered at one URL (or that nothing did)."""

    url: str  # root URL, http://host:port
    answered: bool
    what: str = ""  # "vLLM", "llama.cpp", "Ollama", "SGLang", "LM Studio", "an OpenAI-compatible server"
    kind: str | None = None  # servescope's engine kind; None: servescope cannot measure it
    error: str = ""  # why nothing answered, one line
    identity: engine_identity.Identity | None = None
    port: Usual | None = None  # the usual port it was found on (None: a URL given)
    fingerprint: dict[str, Any] = field(default_factory=dict)  # Ollama: version, models and loaded models
    stack_proxy_port: int | None = None  # where the stack's proxy for its kind listens here (the knobs'), if it has one

    @property
    def version(self) -> str | None:
        return self.identity.version if self.identity else None

    @property
    def is_stack_proxy(self) -> bool:
        """An engine the stack proxies (Ollama) answering on its proxy port of this machine: the proxy in front of it."""
        parts = urlsplit(self.url)
        return (
            self.stack_proxy_port is not None
            and parts.hostname in (HOST, "localhost")
            and parts.port == self.stack_proxy_port
        )

    def title(self) -> str:
        title = engines.kind(self.kind).title if self.kind else self.what
        return f"{title} {self.version}" if self.version else title


def root_url(text: str) -> str:
    """A URL as given (http://host:port, host:port or a bare port on 127.0.0.1) -> http://host:port."""
    text = str(text).strip().rstrip("/")
    if text.isdigit():
        text = f"http://{HOST}:{text}"
    elif "://" not in text:
        text = f"http://{text}"
    shown = printable.line(redact_address(text))
    try:
        parts = parse_http_url(text)
    except ValueError as exc:
        raise DiscoverError(f"{shown!r}: {exc}") from None
    path = parts.path.rstrip("/")
    if path not in ("", "/v1"):
        raise DiscoverError(f"{shown!r}: give the server's address (http://host:port), not a path")
    return f"{parts.scheme}://{parts.netloc}"


def _get(origin: bounded_http.Origin, path: str) -> tuple[int, Any]:
    """(status, JSON or None), the GET bounded as a whole by TIMEOUT_S (servescope/host/bounded_http.py); an answer that
    is too large, not HTTP or not JSON is no JSON (this server does not answer as that engine). ServiceError when
    nothing answers: refused, unreachable, or no answer in time."""
    try:
        answer = origin.get(path, time.monotonic() + TIMEOUT_S, max_bytes=MAX_ANSWER_BYTES)
    except bounded_http.ServiceError as exc:
        if exc.timed_out or exc.unreachable:
            raise
        return 0, None
    try:
        return answer.status, answer.json()
    except bounded_http.ServiceError:
        return answer.status, None


def identify(url: str, port: Usual | None = None, *, knobs: KnobTable | None = None) -> Server:
    """What serves at `url` (a root URL); never raises for a server that does not answer. `knobs`: where the stack's
    proxy of an engine kind listens here (None: a server is never taken for it)."""
    try:
        origin = bounded_http.Origin(url, accept="application/json", user_agent="servescope-quick")
    except bounded_http.ServiceError as exc:
        return Server(url, False, error=exc.reason, port=port)
    with origin:
        try:
            status, version = _get(origin, "/api/version")
            server = _fingerprint(origin, url, version if status == 200 else None)
        except bounded_http.ServiceError as exc:
            return Server(url, False, error=_reason(exc), port=port)
    server.port = port
    if server.kind is not None:
        server.identity = engine_identity.probe(server.kind, url)
        proxy_port_env = engines.kind(server.kind).proxy_port_env
        if proxy_port_env and knobs is not None:
            server.stack_proxy_port = knobs.int(proxy_port_env)
    return server


def _fingerprint(origin: bounded_http.Origin, url: str, version: Any) -> Server:
    """The first signature, most particular first, the server answers as its engine's; `version`: what /api/version
    said (already asked, to see whether anything listens)."""
    asked: dict[str, tuple[int, Any]] = {"/api/version": (200, version) if version is not None else (404, None)}
    signatures = [(k.signature, k) for k in engines.ENGINES.values() if k.signature]
    signatures += [(k.signature, k) for k in (*unmeasured(), OPENAI_COMPATIBLE)]
    for signature, who in sorted(signatures, key=lambda pair: pair[0].rank):
        if signature.path not in asked:
            asked[signature.path] = _get(origin, signature.path)
        status, payload = asked[signature.path]
        if not signature.matches(status, payload):
            continue
        if isinstance(who, Known):
            return Server(url, True, who.what)
        fingerprint = _ollama_fingerprint(origin, payload) if who.api == engines.OLLAMA_API else {}
        return Server(url, True, who.said, who.name, fingerprint=fingerprint)
    status = asked[OPENAI_COMPATIBLE.signature.path][0]
    return Server(url, True, "an HTTP server that is no LLM server servescope knows", error=f"GET /v1/models: {status}")


def _ollama_fingerprint(origin: bounded_http.Origin, version: dict) -> dict[str, Any]:
    """What tells one Ollama from another: its version, installed models (with digests) and loaded models."""
    out: dict[str, Any] = {"version": version.get("version")}
    for path in ("/api/tags", "/api/ps"):
        try:
            status, payload = _get(origin, path)
            entries = engine_identity.ollama_models(payload, path) if status == 200 else None
        except (bounded_http.ServiceError, ValueError):
            entries = None
        out[path] = (
            None
            if entries is None
            else sorted((str(e.get("name")), str(e.get("digest")), str(e.get("expires_at", ""))) for e in entries)
        )
    return out


@dataclass
class Found:
    """Discovery's answer: servers to measure, and one line for each one found but left alone."""

    servers: list[Server]
    skipped: list[str]
    probed: list[Usual]


def discover(ports: list[Usual] | None, knobs: KnobTable, host: str = HOST) -> Found:
    """Every server answering on the ports (None: the usual ones), in the ports' order, one Ollama counted once."""
    ports = usual_ports(knobs) if ports is None else ports
    with ThreadPoolExecutor(max_workers=max(1, len(ports))) as pool:
        answers = list(pool.map(lambda u: identify(f"http://{host}:{u.port}", u, knobs=knobs), ports))
    servers = [s for s in answers if s.answered]
    skipped: list[str] = []
    for proxy in [s for s in servers if s.is_stack_proxy]:
        for other in [s for s in servers if s.kind == proxy.kind and s is not proxy]:
            if other.fingerprint == proxy.fingerprint:
                servers.remove(other)
                skipped.append(
                    f"Ollama at {other.url} is the Ollama behind the stack's proxy at {proxy.url} (the same version, "
                    f"models and loaded models): measured once, through the proxy, whose gauges are what it relayed"
                )
    return Found(servers, skipped, ports)


def _reason(exc: bounded_http.ServiceError) -> str:
    """Why nothing answered, in a few words."""
    if exc.timed_out:
        return f"no answer within {TIMEOUT_S:g} s"
    return exc.reason
