"""Engine targets from `--engine NAME=URL`, and what each engine says about itself (version, models, settings)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests

from servescope import engine_identity, engines, hostnoise, knobs, pidrecords
from servescope.urls import parse_http_url, redact


class TargetError(ValueError):
    """A bad --engine value: the message is one line for the terminal."""


@dataclass
class Target:
    kind: str  # engine kind: vllm, llamacpp, ollama (the `engine` label)
    instance: str  # kind, or kind:name when several of one kind run
    url: str  # base URL the chat path is appended to (may end in /v1 for Ollama's OpenAI API)
    api: str  # "openai" or "ollama"
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


def parse_engine(spec: str, ignore_eos: bool = True) -> Target:
    """`vllm=http://127.0.0.1:8009`, `llamacpp:small=URL`, `ollama=http://host:11434/v1` (OpenAI API), or just `vllm`."""
    name, sep, url = spec.partition("=")
    kind_name, _, label = name.strip().partition(":")
    try:
        kind = engines.kind(kind_name)
    except ValueError as exc:
        raise TargetError(f"--engine {redact(spec)!r}: {exc}") from None
    url_from = None
    if not sep:
        url, url_from = default_url(kind.name), default_url_source(kind.name)
    url = url.strip().rstrip("/")
    try:
        parts = parse_http_url(url)
    except ValueError as exc:
        raise TargetError(f"--engine {redact(spec)!r}: {exc}") from None
    api, chat_path = kind.api, kind.chat_path
    if parts.path.endswith("/v1"):
        # Ollama's (or any engine's) OpenAI-compatible API under /v1.
        api, chat_path = "openai", "/chat/completions"
    elif parts.path:
        raise TargetError(f"--engine {redact(spec)!r}: the URL takes no path other than /v1")
    return Target(
        kind=kind.name,
        instance=f"{kind.name}:{label}" if label else kind.name,
        url=url,
        api=api,
        chat_path=chat_path,
        ignore_eos=(ignore_eos if kind.accepts_ignore_eos else None),
        url_from=url_from,
    )


def default_url(kind_name: str) -> str:
    """Where an engine of this kind is when no URL is given: its *_URL knob, else its default port on 127.0.0.1."""
    kind = engines.kind(kind_name)
    return knobs.get(kind.url_env, "") or kind.default_url()


def default_url_source(kind_name: str) -> str:
    """The knob default_url() read: the kind's *_URL when set, else its *_PORT."""
    kind = engines.kind(kind_name)
    return kind.url_env if knobs.get(kind.url_env, "") else kind.port_env


def chosen_url_line(kind_name: str, url: str) -> str:
    """What to tell the user when an engine URL was not given: which one is used, and which knob chose it."""
    kind = engines.kind(kind_name)
    url = redact(url)
    if default_url_source(kind_name) == kind.url_env:
        return f"{kind_name}: no engine URL given, using {url} (from {kind.url_env})"
    return f"{kind_name}: no engine URL given, using {url} ({kind.port_env} on 127.0.0.1; {kind.url_env} is not set)"


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


def probe(target: Target, model_override: str | None = None, session: requests.Session | None = None) -> Target:
    """Ask the engine its version, models and serving settings (servescope.engine_identity); fill target.model and
    target.info.

    Never raises: an engine that doesn't answer is recorded as such and the run goes on.
    """
    identity = engine_identity.probe(target.kind, target.root_url, session=session)
    info: dict[str, Any] = {"version": identity.version, "models": list(identity.models)}
    settings = dict(identity.settings)
    max_model_len = next(iter(identity.models.values()), None)
    if target.kind != "ollama" and max_model_len:
        settings["max_model_len"] = max_model_len
    if settings:
        info["settings"] = settings
    launch = launch_flags(target.root_url)
    if launch:
        info["flags"] = launch
    if identity.errors:
        info["probe_errors"] = [f"{path}: {reason}" for path, reason in identity.errors.items()]
    target.info = info
    if model_override:
        target.model = model_override
    elif info["models"] and (target.kind != "ollama" or not _knob_model(target)):
        target.model = info["models"][0]
    else:
        target.model = _knob_model(target)
    return target


def _knob_model(target: Target) -> str:
    return knobs.get("OLLAMA_MODEL" if target.kind == "ollama" else "SERVED_MODEL_NAME", "")
