"""A private exporter for one quick measurement: `python -m exporter` as a child process on a free 127.0.0.1 port, watching exactly one engine.

The knee reads its server samples from an exporter (servescope/prometheus/sampler.py, SAMPLE_EXPORTER_URL). The
stack's exporter watches the stack's engines under instance names of its own; an engine found on
another port would be sampled under the wrong name or not at all. So quick starts one of its own per
engine, from a config file naming only that engine (no other URL knob leaks in, no proxy port of the
stack's is taken), and stops it afterwards. For Ollama it also runs the proxy, on a free port: the
load goes through it, and running / waiting are what it relayed (Ollama reports neither itself). The load
generator never imports the exporter (the architecture rule): it is a separate process, talked to over HTTP.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from servescope import engines
from servescope.contracts import knobs, series
from servescope.contracts.settings import KnobTable
from servescope.engines.base import BATCH_SLOTS
from servescope.host import bounded_http, children
from servescope.host.ports import free_port
from servescope.prometheus.exposition import parse_exposition

HOST = "127.0.0.1"
START_TIMEOUT_S = 20.0  # the exporter imports in about a second; a loaded 2-core machine takes longer
PAGE_TIMEOUT_S = 5.0  # one read of its page, all of it


class ExporterError(RuntimeError):
    """The exporter could not be started or cannot read the engine: one line."""


class SideExporter:
    """`with SideExporter("vllm", url) as exp: exp.url` (exp.proxy_url for Ollama: where the load goes)."""

    def __init__(self, kind: str, engine_url: str, *, proxy: bool = False, knobs: KnobTable | None = None):
        """`knobs`: the stack's settings of the engine the proxy relays to (its batch slots), as quick read them."""
        self.kind, self.engine_url = kind, engine_url
        self.table = knobs
        self.adapter = engines.kind(kind)
        self.proxy = proxy and self.adapter.proxy_port_env is not None
        self.port = 0
        self.proxy_port: int | None = None
        self.proc: subprocess.Popen | None = None
        self._dir = Path(tempfile.mkdtemp(prefix="servescope-quick-exporter-"))
        self.log = self._dir / "exporter.log"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def proxy_url(self) -> str | None:
        return f"http://{HOST}:{self.proxy_port}" if self.proxy_port else None

    def _config(self) -> Path:
        lines = [f"listen_address: {HOST}", f"port: {self.port}", "engines:", f"  - kind: {self.kind}"]
        lines += [f"    name: {self.kind}", f"    url: {self.engine_url}"]
        if self.adapter.proxy_port_env:
            lines.append(f"    proxy_port: {self.proxy_port if self.proxy_port else 'null'}")
            slots = self.table.text(self.adapter.lever(BATCH_SLOTS).env, "1") if self.table is not None else "1"
            lines.append(f"    num_parallel: {slots}")
        path = self._dir / "exporter.yml"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self) -> SideExporter:
        """Start it and wait until its page shows the engine read (servescope_engine_up 1); ExporterError if not."""
        for attempt in (1, 2):  # a port taken between choosing it and the exporter binding it: once more
            self.port = free_port()
            self.proxy_port = free_port() if self.proxy else None
            with open(self.log, "w") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "exporter", "--config", str(self._config())],
                    cwd=knobs.REPO_ROOT,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                )
            try:
                self._wait_ready()
                return self
            except ExporterError:
                self.stop()
                if attempt == 2 or "in use" not in self.last_log_line():
                    raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ExporterError(f"the exporter exited ({self.last_log_line() or f'exit {self.proc.returncode}'})")
            try:
                up = self.engine_up()
            except (bounded_http.ServiceError, ValueError):
                time.sleep(0.2)
                continue
            if up == 1.0:
                return
            last = "it cannot read the engine" if up is not None else "the engine is not on its page"
            time.sleep(0.3)
        raise ExporterError(f"the exporter did not come up within {START_TIMEOUT_S:g} s ({last})")

    def engine_up(self) -> float | None:
        """servescope_engine_up of the engine on the exporter's page (None: not there)."""
        answer = bounded_http.get(f"{self.url}/metrics?name[]={series.ENGINE_UP}", PAGE_TIMEOUT_S, redirects=0)
        if answer.status != 200:
            raise ValueError(f"HTTP {answer.status}")
        page = answer.text()
        for labels, value in parse_exposition(page, frozenset({series.ENGINE_UP})).get(series.ENGINE_UP, ()):
            if labels.get("engine") == self.kind and labels.get("instance") == self.kind:
                return value
        return None

    def last_log_line(self) -> str:
        try:
            lines = [line for line in self.log.read_text().splitlines() if line.strip()]
        except OSError:
            return ""
        return lines[-1].strip() if lines else ""

    def stop(self) -> None:
        if self.proc is not None:
            children.stop(self.proc)
        self.proc = None

    def close(self) -> None:
        self.stop()
        for path in (self.log, self._dir / "exporter.yml"):
            path.unlink(missing_ok=True)
        try:
            self._dir.rmdir()
        except OSError:
            pass

    def __enter__(self) -> SideExporter:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
