"""Ports and engine knobs: servescope/contracts/knob_defaults.py's defaults, overridden by `.env`, overridden by the environment."""

from __future__ import annotations

import math
import os
from pathlib import Path

from servescope.contracts.knob_defaults import DEFAULTS

REPO_ROOT = Path(__file__).resolve().parents[2]  # servescope/contracts/knobs.py -> the checkout


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


def env_file(root: Path = REPO_ROOT, environ: dict[str, str] | None = None) -> Path:
    """The overrides file: SERVESCOPE_ENV_FILE when the environment names one, else the checkout's .env."""
    environ = os.environ if environ is None else environ
    named = environ.get("SERVESCOPE_ENV_FILE", "")
    if not named:
        return root / ".env"
    path = Path(os.path.expanduser(named))
    if not path.is_file():  # a named file that is not there is a typo, not "no overrides"
        raise ValueError(f"{path}: SERVESCOPE_ENV_FILE names no file")
    return path


_parsed: dict[Path, tuple[tuple[int, int], dict[str, str]]] = {}


def _file_values(path: Path) -> dict[str, str]:
    """parse_env_file(path), parsed again only when the file changed: `get` runs hundreds of times in a short load
    run (every option's default), and parsing the file each time was a visible part of its start-up."""
    try:
        st = path.stat()
    except OSError:
        return {}
    stamp = (st.st_mtime_ns, st.st_size)
    seen = _parsed.get(path)
    if seen is None or seen[0] != stamp:
        seen = _parsed[path] = (stamp, parse_env_file(path))
    return seen[1]


def load(root: Path = REPO_ROOT, environ: dict[str, str] | None = None) -> dict[str, str]:
    """All knobs, with the precedence a Compose user expects: environment > .env > the table's defaults."""
    environ = os.environ if environ is None else environ
    knobs = dict(DEFAULTS)
    knobs.update(_file_values(env_file(root, environ)))
    for key in list(knobs):
        if key in environ:
            knobs[key] = environ[key]
    return knobs


def get(key: str, default: str | None = None) -> str:
    """One knob by name, with load()'s precedence; an unknown knob without default is a programming error."""
    if key in os.environ:
        return os.environ[key]
    in_file = _file_values(env_file())
    if key in in_file:
        return in_file[key]
    if key in DEFAULTS:
        return DEFAULTS[key]
    if default is None:
        raise KeyError(f"unknown knob {key}: add it to servescope/contracts/knob_defaults.py")
    return default


class KnobError(ValueError):
    """A knob whose value is not of its type or range: one line naming the knob ("KEY='x': expected ..."). A
    ValueError, so every caller that took a knob's ValueError takes this one."""


def get_int(key: str, default: int | None = None) -> int:
    return as_int(key, get(key, None if default is None else str(default)))


def as_int(key: str, value: str) -> int:
    """A knob's text as an integer; KnobError naming the knob otherwise."""
    try:
        return int(value)
    except ValueError:
        raise KnobError(f"{key}={value!r} is not an integer") from None


def get_int_in(key: str, low: int, high: int, why: str = "") -> int:
    """A whole-number knob from low to high; KnobError naming the knob and the bounds (and `why` they are so)."""
    return as_int_in(key, get(key), low, high, why)


def as_int_in(key: str, value: str, low: int, high: int, why: str = "") -> int:
    text = value.strip()
    number = int(text) if text.isascii() and text.lstrip("-").isdigit() and len(text) <= 20 else None
    if number is None or not low <= number <= high:
        raise KnobError(f"{key}={text!r}: expected a whole number from {low} to {high}{f' ({why})' if why else ''}")
    return number


def get_port(key: str) -> int:
    """A TCP port knob: 1 to 65535."""
    return as_port(key, get(key))


def as_port(key: str, value: str) -> int:
    return as_int_in(key, value, 1, 65535, "a TCP port")


def get_choice(key: str, choices: tuple[str, ...]) -> str:
    """A knob that takes one of a few words."""
    return as_choice(key, get(key), choices)


def as_choice(key: str, value: str, choices: tuple[str, ...]) -> str:
    text = value.strip()
    if text not in choices:
        raise KnobError(f"{key}={text!r}: expected {' or '.join(choices)}")
    return text


def get_positive(key: str, unit: str) -> float:
    """A knob holding a number of `unit` above 0; KnobError with one line ("KEY='x': expected ...") otherwise."""
    return as_positive(key, get(key), unit)


def as_positive(key: str, value: str, unit: str) -> float:
    text = value.strip()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise KnobError(f"{key}={text!r}: expected a number of {unit} > 0")
    return value


def under_root(path: Path) -> Path:
    """A relative path knob's place: under the checkout whatever the working directory, or, for a servescope
    installed outside a checkout, under the working directory (site-packages is no place for run folders)."""
    if path.is_absolute():
        return path
    return (REPO_ROOT if (REPO_ROOT / "pyproject.toml").is_file() else Path.cwd()) / path


# A path knob is written into generated configs (nginx.conf, prometheus.yml) and shown in lines: a control character
# in one (SERVESCOPE_STATE with a newline and a server block) injected directives into the router's nginx.conf.
_CONTROL = frozenset(map(chr, [*range(0x20), 0x7F]))


def path(key: str) -> Path:
    """A directory knob, with ~ expanded (kept outside git by design); KnobError for an empty one or one with a
    control character (newline, tab, escape)."""
    return as_path(key, get(key))


def as_path(key: str, text: str) -> Path:
    if not text.strip() or _CONTROL & set(text):
        raise KnobError(f"{key}={text!r}: expected a folder's path (not empty, no control character)")
    return Path(os.path.expanduser(text))
