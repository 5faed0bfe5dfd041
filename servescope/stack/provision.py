"""The tools the stack and the test suite drive (Prometheus, Compose, Chromium, Docker, nginx): found, or installed.

One table says which commands each tool brings and which Debian packages provide them. `make up` asks for
what the native stack needs, `make test` for what the suite drives; both go through `ensure()`:
apt-get when running as root on Debian, elsewhere one line naming what to install.

    python -m servescope.stack provision --for test     # what `make test` runs before pytest
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from servescope.stack import paths
from servescope.stack.progress import Step, say, tail


@dataclass(frozen=True)
class Tool:
    """One tool the stack or the suite drives: the commands that make it present, the Debian packages bringing them."""

    name: str  # how messages and tests name it
    commands: tuple[str, ...]  # every one must be on PATH for the tool to count as present
    packages: tuple[str, ...]  # Debian packages that bring them
    purpose: str  # what needs it, for the one line a user reads

    def missing_commands(self, which: Callable[[str], str | None] | None = None) -> list[str]:
        which = which or shutil.which
        return [command for command in self.commands if which(command) is None]

    def present(self, which: Callable[[str], str | None] | None = None) -> bool:
        return not self.missing_commands(which)

    @property
    def how_to_install(self) -> str:
        return f"apt-get install {' '.join(self.packages)} (Debian/Ubuntu), or your system's packages for {', '.join(self.commands)}"


PROMETHEUS = Tool(
    "prometheus", ("prometheus", "promtool"), ("prometheus",), "the native stack's Prometheus; rule and config tests"
)
COMPOSE = Tool("docker-compose", ("docker-compose",), ("docker-compose",), "validating and running docker-compose.yml")
CHROMIUM = Tool(
    "chromium",
    ("chromium", "chromedriver"),
    ("chromium", "chromium-driver"),
    "Locust web UI tests in a headless browser",
)
DOCKER = Tool("docker", ("dockerd", "docker"), ("docker.io",), "the Compose end-to-end suite's Docker engine")
DEBOOTSTRAP = Tool("debootstrap", ("debootstrap",), ("debootstrap",), "the Compose suite's locally built base image")
NGINX = Tool("nginx", ("nginx",), ("nginx",), "the router in front of replicas (make replicas) and its tests")

TOOLS: dict[str, Tool] = {tool.name: tool for tool in (PROMETHEUS, COMPOSE, CHROMIUM, DOCKER, DEBOOTSTRAP, NGINX)}
# What each entry point drives.
PURPOSES: dict[str, tuple[str, ...]] = {
    "up": ("prometheus",),
    "test": ("prometheus", "docker-compose", "chromium", "docker", "debootstrap", "nginx"),
}


def can_use_apt() -> bool:
    return os.geteuid() == 0 and Path("/etc/debian_version").exists() and shutil.which("apt-get") is not None


def _apt(args: list[str], log: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with open(log, "a") as out:
        out.write(f"$ apt-get {' '.join(args)}\n")
        out.flush()
        return subprocess.run(["apt-get", *args], stdout=out, stderr=subprocess.STDOUT, env=env)


def apt_install(packages: Iterable[str], log: Path) -> bool:
    """apt-get install, refreshing the package lists once when the first try fails (a fresh machine has none)."""
    packages = sorted(set(packages))
    install = ["install", "-y", "-q", "--no-install-recommends", *packages]
    with Step(f"installing Debian packages: {' '.join(packages)} (log {log})"):
        if _apt(install, log).returncode == 0:
            return True
        if _apt(["update", "-q"], log).returncode != 0:
            return False
        return _apt(install, log).returncode == 0


def ensure(names: Iterable[str], which: Callable[[str], str | None] | None = None) -> list[Tool]:
    """Install what is missing where we can; returns the tools still missing (each already named in one line)."""
    wanted = [TOOLS[name] for name in names]
    missing = [tool for tool in wanted if not tool.present(which)]
    if missing and can_use_apt():
        log = paths.install_logs() / "apt.log"
        if not apt_install([p for tool in missing for p in tool.packages], log):
            say(f"apt-get failed: the last lines of {log}:\n{tail(log, 8)}")
        missing = [tool for tool in missing if not tool.present(which)]
    for tool in missing:
        say(
            f"missing: {tool.name} ({', '.join(tool.missing_commands(which))}) for {tool.purpose}: {tool.how_to_install}"
        )
    return missing


def main(purpose: str) -> int:
    """`python -m servescope.stack provision --for PURPOSE`: exit 0 even when something is missing (the suite skips or fails it)."""
    missing = ensure(PURPOSES[purpose])
    if not missing:
        say(f"provision: everything `{purpose}` drives is here ({', '.join(PURPOSES[purpose])})")
    return 0
