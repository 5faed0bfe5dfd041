"""Where finished requests and phases go: the run folder (appended as they finish), client metrics, a progress line."""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from servescope.contracts.runfolder import PHASES, REQUESTS, PhaseRecord, RequestRecord, RunFolder
from servescope.host import energy, hostnoise

if TYPE_CHECKING:  # prometheus_client: imported only where the metrics are served
    from loadgen.client_metrics import ClientMetrics


class Recorder:
    """Appends each record as it finishes. A run folder that stops taking writes (permissions, a full disk) ends
    the writing, not the process: `on_failure` hears why once, and what was written before stays as it is."""

    def __init__(
        self,
        folder: RunFolder | None = None,
        metrics: ClientMetrics | None = None,
        out: TextIO | None = sys.stdout,
        t0: float | None = None,
        on_failure: Callable[[str], None] | None = None,
    ):
        self.folder = folder
        self.metrics = metrics
        self.out = out
        self.t0 = time.monotonic() if t0 is None else t0
        self.tokens: dict[tuple[str, str], int] = defaultdict(int)
        self.on_failure = on_failure
        self.annotate: Callable[[PhaseRecord], None] | None = None  # adds the host's noise before a phase is written
        self.failure: str | None = None

    def _append(self, write: Callable[[], None], name: str) -> None:
        if self.folder is None or self.failure is not None:
            return
        try:
            write()
        except OSError as exc:
            self.failure = f"run folder {self.folder.path}: cannot write {name} ({exc.strerror or exc})"
            if self.on_failure is not None:
                self.on_failure(self.failure)

    def line(self, text: str) -> None:
        if self.out is not None:
            print(f"[{time.monotonic() - self.t0:7.1f}s] {text}", file=self.out, flush=True)

    def begin(self, phase, work):
        """A request is about to be sent; what comes back goes with its record to request() (a distributed
        worker's key for it: loadgen/distributed.py)."""
        return None

    def request(self, record: RequestRecord, key=None) -> None:
        self._append(lambda: self.folder.append_request(record), REQUESTS)
        if self.metrics is not None:
            self.metrics.observe(record)
        if record.ok and record.output_tokens:
            self.tokens[(record.instance, record.phase)] += record.output_tokens
        if self.out is None:
            return  # --quiet: no line, none made
        ttft = f"{record.ttft_s:.3f}s" if record.ttft_s is not None else "-"
        e2e = f"{record.e2e_s:.3f}s" if record.e2e_s is not None else "-"
        status = "ok" if record.ok else f"FAILED ({record.error})"
        self.line(
            f"{record.instance} {record.phase} {record.prompt_id}: {status} ttft={ttft} e2e={e2e} "
            f"tokens={record.output_tokens if record.output_tokens is not None else '-'}"
        )

    def phase(self, record: PhaseRecord) -> None:
        if self.annotate is not None:
            self.annotate(record)
        self._append(lambda: self.folder.append_phase(record), PHASES)
        tokens = self.tokens.get((record.instance, record.phase), 0)
        rate = tokens / record.wall_s if record.wall_s > 0 else 0.0
        noise = ""
        if record.noise is not None:
            noise = "; " + "; ".join(
                [hostnoise.describe(record.noise), *hostnoise.flags(record.noise, record.instance)]
            )
        if record.energy is not None:
            noise += "; " + energy.describe(record.energy)
        self.line(
            f"{record.instance} {record.phase} done: {record.requests} requests, wall {record.wall_s:.3f}s, "
            f"{tokens} tokens, {rate:.1f} tok/s{noise}"
        )

    def users(self, engine: str, scenario: str, users: int) -> None:
        if self.metrics is not None:
            self.metrics.set_users(engine, scenario, users)
