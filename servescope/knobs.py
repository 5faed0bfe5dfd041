"""Ports and engine knobs: `.env.example` defaults, overridden by `.env`, overridden by the environment."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def parse_env_file(path: Path) -> dict[str, str]:
    """Parse KEY=VALUE lines (comments and blanks skipped, optional quotes stripped)."""
    values: dict[str, str] = {}
    if not path.is_file():
        return values
    for lineno, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :]
        key, sep, value = line.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ValueError(f"{path}:{lineno}: expected KEY=VALUE, got {raw!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def load(root: Path = REPO_ROOT, environ: dict[str, str] | None = None) -> dict[str, str]:
    """All knobs, with the precedence a Compose user expects: environment > .env > .env.example."""
    environ = os.environ if environ is None else environ
    knobs = parse_env_file(root / ".env.example")
    knobs.update(parse_env_file(root / ".env"))
    for key in list(knobs):
        if key in environ:
            knobs[key] = environ[key]
    return knobs


def get(key: str, default: str | None = None) -> str:
    """One knob by name; an unknown knob without default is a programming error."""
    knobs = load()
    if key in knobs:
        return knobs[key]
    if key in os.environ:
        return os.environ[key]
    if default is None:
        raise KeyError(f"unknown knob {key}: add it to .env.example")
    return default


def get_int(key: str, default: int | None = None) -> int:
    value = get(key, None if default is None else str(default))
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key}={value!r} is not an integer") from None


def path(key: str) -> Path:
    """A directory knob, with ~ expanded (kept outside git by design)."""
    return Path(os.path.expanduser(get(key)))
