"""Engine targets from `--engine NAME=URL`, and what each engine says about itself (version, models, settings)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from servescope import engines
from servescope.contracts.settings import KnobTable
from servescope.contracts.urls import parse_http_url, redact
from servescope.host import bounded_http, engine_identity, hostnoise, pidrecords
from servescope.text import printable


class TargetError(ValueError):
    """A bad --engine value: the message is one line for the terminal."""


@dataclass
class Target:
    """One engine to load: its kind, instance name, URL and chat API, and what it reported about itself."""

    kind: str  # engine kind: vllm, llamacpp, ollama (the `engine` label)
    instance: str  # kind, or kind:name when several of one kind run
    url: str  # base URL the chat path is appended to (may end in /v1 for Ollama's OpenAI API)
    api: str  # engines.OPENAI_API or engines.OLLAMA_API
    chat_path: str
    model: str = ""
    ignore_eos: bool | None = None  # None: the engine does not accept it (recorded as unavailable)
    url_from: str | None = None  # where the URL came from when --engine gave none: the knob that set it
    info: dict[str, Any] = field(default_factory=dict)  # what the engine reported about itself

    @property
    def root_url(self) -> str:
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"

    def manifest(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "url": redact(self.url),
            "api": self.api,
            "chat_path": self.chat_path,
            "model": self.model,
            "ignore_eos": "unavailable" if self.ignore_eos is None else self.ignore_eos,
            "url_from": self.url_from or "--engine",
            **self.info,
        }


def _shown(spec: str) -> str:
    """An --engine value in a line: credentials masked, control characters gone, cut to a line's worth (a form's
    1 MB host is not echoed whole)."""
    return repr(printable.line(spec, 120))


def parse_engine(spec: str, ignore_eos: bool = True, knobs: KnobTable | None = None) -> Target:
    """`vllm=http://127.0.0.1:8009`, `llamacpp:small=URL`, `ollama=http://host:11434/v1` (OpenAI API), or just `vllm`
    (then `knobs` say where it is: the kind's *_URL, *_PORT, the stack's proxy)."""
    name, sep, url = spec.partition("=")
    kind_name, _, label = name.strip().partition(":")
    try:
        kind = engines.kind(kind_name)
    except ValueError as exc:
        raise TargetError(f"--engine {_shown(spec)}: {exc}") from None
    url_from = None
    if not sep:
        if knobs is None:
            raise TargetError(f"--engine {_shown(spec)}: no URL, and no knobs to find its default in")
        url, url_from = _default(kind.name, knobs)  # Ollama: asks the stack's proxy port whether it is the proxy
    url = url.strip().rstrip("/")
    try:
        parts = parse_http_url(url)
    except ValueError as exc:
        raise TargetError(f"--engine {_shown(spec)}: {exc}") from None
    api, chat_path = kind.api, kind.chat_path
    if parts.path.endswith("/v1"):
        # Ollama's (or any engine's) OpenAI-compatible API under /v1.
        api, chat_path = engines.OPENAI_API, "/chat/completions"
    elif parts.path:
        raise TargetError(f"--engine {_shown(spec)}: the URL takes no path other than /v1")
    return Target(
        kind=kind.name,
        instance=f"{kind.name}:{label}" if label else kind.name,
        url=url,
        api=api,
        chat_path=chat_path,
        ignore_eos=(ignore_eos if kind.accepts_ignore_eos else None),
        url_from=url_from,
    )


def default_url(kind_name: str, knobs: KnobTable) -> str:
    """Where an engine of this kind is when no URL is given: the stack's proxy in front of it when one answers as
    servescope's and relays that engine (Ollama: the only place its requests can be observed), else its *_URL
    knob, else its default port on 127.0.0.1."""
    return _default(kind_name, knobs)[0]


def default_url_source(kind_name: str, knobs: KnobTable) -> str:
    """The knob default_url() read: the kind's proxy port, its *_URL when set, else its *_PORT."""
    return _default(kind_name, knobs)[1]


def _default(kind_name: str, knobs: KnobTable) -> tuple[str, str]:
    kind = engines.kind(kind_name)
    configured = knobs.text(kind.url_env)
    if kind.proxy_port_env:
        proxy, upstream = stack_proxy(kind, knobs)
        # The proxy relays one Ollama: the stack's. A *_URL naming another one is honoured as given.
        relays_it = not configured or (upstream is not None and hostnoise.same_endpoint(upstream, configured))
        if relays_it and answers_as_proxy(proxy):
            return proxy, kind.proxy_port_env
    if configured:
        return configured, kind.url_env
    return kind.default_url(knobs), kind.port_env


# A proxy on this host answers in milliseconds or refuses at once; a port that hangs must not hold the run up.
PROXY_PROBE_TIMEOUT_S = 2.0


def answers_as_proxy(url: str, timeout: float = PROXY_PROBE_TIMEOUT_S) -> bool:
    """Whether servescope's Ollama proxy answers at `url`: it names itself in the Via header of every response
    (servescope.engines.PROXY_VIA, RFC 9110 7.6.3); Ollama itself, or anything else on that port, does not."""
    parts = urlsplit(url)
    try:  # its head only: the Via header is all this asks, whatever body follows
        answer = bounded_http.get(f"{parts.scheme}://{parts.netloc}/api/version", timeout, head_only=True)
    except (bounded_http.ServiceError, ValueError):
        return False
    via = answer.headers.get("via", "")
    return any(hop.split()[1:2] == [engines.PROXY_VIA] for hop in via.split(","))


def stack_proxy(
    kind: engines.EngineKind, knobs: KnobTable, records: dict[str, pidrecords.LiveRecord] | None = None
) -> tuple[str, str | None]:
    """(where the stack's proxy for `kind` listens, the engine URL it relays to when known): the native exporter's
    --listen-address, --proxy-port and --ollama-url from its pid record while it runs, else the kind's proxy-port
    knob on 127.0.0.1 (Compose publishes it there) with its upstream unknown."""
    records = pidrecords.live() if records is None else records
    exporter = records.get("exporter")
    argv = _options(exporter.cmdline) if exporter is not None else {}
    port = argv.get("--proxy-port") or knobs[kind.proxy_port_env]
    host = argv.get("--listen-address", "127.0.0.1")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"  # listening everywhere: reach it on loopback
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}", argv.get(f"--{kind.name}-url")


def _options(cmdline: tuple[str, ...]) -> dict[str, str]:
    """--flag value and --flag=value pairs of a command line."""
    out: dict[str, str] = {}
    for i, arg in enumerate(cmdline):
        flag, eq, value = arg.partition("=")
        if eq and flag.startswith("--"):
            out[flag] = value
        elif arg.startswith("--") and i + 1 < len(cmdline):
            out[arg] = cmdline[i + 1]
    return out


def route_text(kind_name: str, url: str, via_proxy: bool, knobs: KnobTable) -> str:
    """What going to `url` means for the gauges of an engine the stack proxies (Ollama): one clause; "" for the
    other kinds, whose gauges come from the engine itself."""
    kind = engines.kind(kind_name)
    if not kind.proxy_port_env:
        return ""
    if via_proxy:
        return (
            f"through servescope's {kind.title} proxy: {kind.title}'s running/waiting gauges (source=\"proxy\") are "
            f"what the proxy observes of this load"
        )
    proxy, _ = stack_proxy(kind, knobs)
    elsewhere = (
        f"servescope's proxy answers at {redact(proxy)}: give that URL to go through it"
        if answers_as_proxy(proxy)
        else f"no servescope proxy answers at {redact(proxy)}"
    )
    return (
        f"to {kind.title} directly ({elsewhere}): the exporter sees none of this load, so {kind.title}'s "
        f"running/waiting gauges are not observed for it"
    )


def chosen_url_line(kind_name: str, url: str, knobs: KnobTable) -> str:
    """What to tell the user when an engine URL was not given: which one is used, which knob chose it, and (an
    engine the stack proxies) whether the load goes through the proxy and what that means for its gauges."""
    kind = engines.kind(kind_name)
    shown = redact(url)
    configured = knobs.text(kind.url_env)
    if kind.proxy_port_env and url == stack_proxy(kind, knobs)[0] and url != configured:
        # default_url() chose the proxy because it answered as servescope's
        return (
            f"{kind_name}: no engine URL given, using {shown} ({kind.proxy_port_env}: the stack's proxy), "
            + route_text(kind_name, url, True, knobs)
        )
    if configured:
        line = f"{kind_name}: no engine URL given, using {shown} (from {kind.url_env})"
    else:
        line = (
            f"{kind_name}: no engine URL given, using {shown} ({kind.port_env} on 127.0.0.1; {kind.url_env} is not set)"
        )
    route = route_text(kind_name, url, answers_as_proxy(url), knobs) if kind.proxy_port_env else ""
    return f"{line}, {route}" if route else line


def route_line(target: Target, knobs: KnobTable) -> str:
    """The one line saying whether a given URL of an engine the stack proxies is the proxy; "" for other kinds."""
    route = target.info.get("route")
    if route is None:
        return ""
    text = route_text(target.kind, target.url, route == "proxy", knobs)
    return f"{target.instance}: {redact(target.url)} goes " + text


# A flag whose value is a credential: kept out of the manifest.
SECRET_FLAG = re.compile(r"key|token|password|secret", re.IGNORECASE)


def launch_flags(url: str, records: dict[str, pidrecords.LiveRecord] | None = None) -> list[str]:
    """The command line the native stack started the engine at `url` with (its pid record), credentials masked;
    [] for an engine the stack did not start. The report quotes these as the run's settings ("now 2"), where
    the checkout's knobs may say otherwise (`VLLM_MAX_NUM_SEQS=2 make up`, then `make report` without it)."""
    records = pidrecords.live() if records is None else records
    for rec in records.values():
        if rec.is_engine and rec.cmdline and rec.url and hostnoise.same_endpoint(rec.url, url):
            argv: list[str] = []
            for arg in rec.cmdline:
                flag, eq, _value = arg.partition("=")
                if eq and flag.startswith("-") and SECRET_FLAG.search(flag):
                    arg = f"{flag}=***"
                elif argv and argv[-1].startswith("-") and SECRET_FLAG.search(argv[-1]) and not arg.startswith("-"):
                    arg = "***"
                argv.append(arg)
            return argv
    return []


def probe(target: Target, knobs: KnobTable, model_override: str | None = None) -> Target:
    """Ask the engine its version, models and serving settings (servescope.host.engine_identity); fill target.model and
    target.info.

    Never raises: an engine that doesn't answer is recorded as such and the run goes on.
    """
    adapter = engines.kind(target.kind)
    identity = engine_identity.probe(target.kind, target.root_url)
    info: dict[str, Any] = {"version": identity.version, "models": list(identity.models)}
    settings = dict(identity.settings)
    max_model_len = next(iter(identity.models.values()), None)
    if not adapter.lists_installed and max_model_len:
        settings["max_model_len"] = max_model_len
    if settings:
        info["settings"] = settings
    launch = launch_flags(target.root_url)
    if launch:
        info["flags"] = launch
    if identity.errors:
        info["probe_errors"] = [f"{path}: {reason}" for path, reason in identity.errors.items()]
    if adapter.proxy_port_env:
        # Whether the stack's proxy saw this load: the report's verdict weighs its gauges only then.
        info["route"] = "proxy" if answers_as_proxy(target.root_url) else "direct"
    target.info = info
    if model_override:
        target.model = model_override
    elif info["models"] and (not adapter.lists_installed or not _knob_model(target, knobs)):
        target.model = info["models"][0]
    else:
        target.model = _knob_model(target, knobs)
    return target


def _knob_model(target: Target, knobs: KnobTable) -> str:
    return knobs.text(engines.kind(target.kind).model_env)
