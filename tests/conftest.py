"""Shared pytest fixtures: free ports, readiness waits, a real Prometheus per test, and the missing-tool policy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from servescope.host import ports
from servescope.stack import provision

# A suite started in the background by a non-interactive shell (`make test &`) inherits SIGINT ignored, and so would
# every program it starts: the Ctrl-C tests would then fail on the shell, not the code. Python's own handler puts
# it back (an exec resets a handler to the default, never an ignored signal).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def in_ci() -> bool:
    """CI sets CI=true: there a test that cannot run is a failure, not a skip."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """The one missing-tool policy: locally one clear skip line, with CI=true a failure of the run."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a test that cannot run fails the run)", pytrace=False)
    pytest.skip(reason)


def require_tool(name: str) -> None:
    """Skip (locally) or fail (CI) unless every command of servescope.stack.provision's tool `name` is on PATH."""
    tool = provision.TOOLS[name]
    missing = tool.missing_commands()
    if missing:
        unavailable(
            f"{tool.name} not installed ({', '.join(missing)}): {tool.how_to_install}; "
            "`make test` installs it when run as root on Debian"
        )


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "tool(name): needs servescope.stack.provision's tool `name` (skip locally, fail in CI)"
    )


def pytest_collection_modifyitems(config, items):
    """Modules with a `slow` test first, each kept whole (its module fixtures start once): under pytest-xdist
    (`make test`, --dist loadscope) the long ones start early and the short ones fill in, no worker left last."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


def pytest_runtest_setup(item):
    for mark in item.iter_markers(name="tool"):
        for name in mark.args:
            require_tool(name)


@pytest.fixture(autouse=True)
def quiet_host_rule(monkeypatch):
    """The suite runs on shared, busy machines: tests of other features never have their phases flagged as noisy.

    The host-noise rule (servescope/contracts/thresholds.NoiseRule) is judged by its own tests, which set the thresholds
    they test; everywhere else (and in the load generators the tests start) nothing is loud enough to flag, and no
    comparison adds repetitions while a factor is undecided (its own tests ask for it: tests/loadgen/test_trials.py).
    """
    for knob, value in (
        ("LOADGEN_MAX_REPETITIONS", "1"),
        ("LOADGEN_HOST_BASELINE_S", "0"),  # no compare waits to read the host; its own test reads it
        ("NOISE_GROUP_CPU_CORES", "1000"),
        ("NOISE_FOREIGN_CPU_CORES", "1000"),
        ("NOISE_STEAL_SHARE", "1"),
        ("OUTLIER_RATIO", "1e9"),
    ):
        monkeypatch.setenv(knob, value)


@pytest.fixture(autouse=True)
def no_cpu_priority(monkeypatch):
    """The suite's load generators and stacks never move themselves (or the pytest process listening as a test engine)
    into the real CPU priority group: its own tests (tests/servescope/host/test_cpu_priority.py) ask for it, in groups of
    their own. tests/harness.py gives the same default to a child started with an environment of its own."""
    monkeypatch.setenv("CPU_PRIORITY", "off")


def free_port() -> int:
    """A loopback port free right now, from this xdist worker's own share of the listening range."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker) if worker.isdigit() else 0
    return ports.free_port(share=(index % count, count))


def wait_until(predicate, timeout: float = 5.0) -> bool:
    """Whether `predicate()` came true within `timeout` s, asked every 20 ms: an ordering waited on, not slept through."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> requests.Response:
    """Poll url until it answers 200; fail early if the process behind it exits."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process behind {url} exited with {proc.returncode}")
        try:
            resp = requests.get(url, timeout=2)
            if resp.status_code == 200:
                return resp
            last = f"HTTP {resp.status_code}"
        except requests.RequestException as exc:
            last = str(exc)
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout}s: {last}")


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Terminate, then kill if it doesn't go within `timeout`; always reaped."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class JsonReplyHandler(BaseHTTPRequestHandler):
    """Base for the small HTTP stand-ins tests write (Grafana's and Docker's APIs): JSON replies, no access log."""

    extra_headers: dict[str, str] = {}

    def reply_json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for key, value in self.extra_headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def serve_in_thread(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A real HTTP server on a free loopback port, served from a daemon thread; .shutdown() it after."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


class PrometheusServer:
    """A real Prometheus (Debian's package) on a free port with a config written by the test."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(
        self, config_yaml: str, extra_files: dict[str, str] | None = None, timeout: float = 60
    ) -> PrometheusServer:
        for name, text in (extra_files or {}).items():
            (self.workdir / name).write_text(text)
        config = self.workdir / "prometheus.yml"
        config.write_text(config_yaml)
        self.log = open(self.workdir / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_http(f"{self.url}/-/ready", timeout=timeout, proc=self.proc)
        return self

    def query(self, promql: str) -> list[dict]:
        resp = requests.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        resp.raise_for_status()
        return resp.json()["data"]["result"]

    def wait_for(self, promql: str, timeout: float = 30.0) -> list[dict]:
        """Poll an instant query until it returns at least one series."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query(promql)
            if result:
                return result
            time.sleep(0.5)
        raise TimeoutError(f"no data for {promql!r} after {timeout}s; log: {self.workdir / 'prometheus.log'}")

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc)
        if getattr(self, "log", None):
            self.log.close()


@pytest.fixture
def prometheus_server(tmp_path):
    """Factory-free fixture: call .start(config_yaml) in the test; stopped afterwards."""
    require_tool("prometheus")
    server = PrometheusServer(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def engine_core():
    """Core 0 for an engine double pinned there (`--cpus 0`), every other process this test starts on the other cores:
    a CPU-bound double's own CPU is what the binding rule reads, and the load generator must not take it."""
    cores = os.sched_getaffinity(0)
    rest = cores - {0}
    if not rest:
        pytest.skip("one core: an engine's core of its own cannot be kept apart here")
    os.sched_setaffinity(0, rest)
    try:
        yield 0
    finally:
        os.sched_setaffinity(0, cores)
