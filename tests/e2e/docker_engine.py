"""A Docker engine for the Compose suite: the one that answers (DOCKER_HOST, the default socket or ours), else a dockerd
of our own on its own socket and data root under the cache folder (images and layer cache kept between runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

import docker
from servescope.stack import paths

START_TIMEOUT_S = 60.0


def answers(host: str | None) -> bool:
    """True when a Docker engine answers a ping at `host` (None: DOCKER_HOST or the default socket)."""
    try:
        client = docker.DockerClient(base_url=host, timeout=3) if host else docker.from_env(timeout=3)
    except docker.errors.DockerException:
        return False
    try:
        return bool(client.ping())
    except Exception:  # noqa: BLE001 -- refused, missing socket, garbage: all mean "not this one"
        return False
    finally:
        client.close()


class DockerEngine:
    """`host` is what DOCKER_HOST must say; `stop()` stops the dockerd only when this object started it."""

    def __init__(self, root: Path | None = None):
        self.root = root or paths.cache_dir() / "docker"
        self.socket = self.root / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.proc: subprocess.Popen | None = None
        self.log_path = self.root / "dockerd.log"

    @classmethod
    def find_or_start(cls) -> DockerEngine:
        env_host = os.environ.get("DOCKER_HOST")
        if answers(None):
            engine = cls()
            engine.host = env_host or "unix:///var/run/docker.sock"
            return engine
        engine = cls()
        if not answers(engine.host):
            engine.start()
        return engine

    def start(self) -> None:
        if shutil.which("dockerd") is None:
            raise RuntimeError("dockerd is not installed (apt-get install docker.io)")
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        self._clear_stale_pidfile()
        # The exec root holds containerd's sockets: a short path under /tmp keeps them below the 108-byte limit.
        exec_root = tempfile.mkdtemp(prefix="ssd-")
        self._log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [
                "dockerd",
                "-H",
                self.host,
                "--data-root",
                str(self.root / "data"),
                "--exec-root",
                exec_root,
                "--pidfile",
                str(self.root / "dockerd.pid"),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not answers(self.host):
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd exited with {self.proc.returncode}; log: {self.log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"dockerd did not answer within {START_TIMEOUT_S:.0f}s; log: {self.log_path}")
            time.sleep(0.5)

    def _clear_stale_pidfile(self) -> None:
        """dockerd refuses to start over a pid file it left when it was killed: drop one whose process is gone."""
        pidfile = self.root / "dockerd.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            pidfile.unlink(missing_ok=True)
            return
        if not psutil.pid_exists(pid) or "dockerd" not in " ".join(psutil.Process(pid).cmdline()):
            pidfile.unlink(missing_ok=True)

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.host, timeout=600)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        self.proc = None
