"""The `replay` scenario's phase: a trace's requests sent open loop at their own times, scaled by `--speed`."""

from __future__ import annotations

import time
from collections.abc import Iterator

import gevent
from gevent.event import Event

from loadgen.scenarios import Phase, RatePhase, Settings, Work


class ReplayPhase(RatePhase):
    """Open loop like `rate` (the same RateUser drives it), with the arrival times taken from the trace."""

    scenario = "replay"

    def __init__(
        self,
        settings: Settings,
        speed: float = 1.0,
        duration_s: float | None = None,
        requests: int | None = None,
        max_in_flight: int = 256,
    ):
        if speed <= 0:
            raise ValueError("--speed must be > 0")
        Phase.__init__(self, settings, f"replay-{speed:g}x", users=1)
        self.sessions = None
        self.speed = speed
        self.rows = settings.prompt_set.rows
        self.duration_s, self.max_requests = duration_s, requests  # --duration in replayed seconds, --requests
        self.max_in_flight = max_in_flight
        self.issued = 0
        self.stopped = False
        self.slot_free = Event()

    def arrivals(self) -> Iterator[Work]:
        """Request k at start + offset_k / speed: a late send never moves the ones after it (absolute schedule)."""
        t0, epoch0 = time.monotonic(), time.time()
        for index, row in enumerate(self.rows):
            at = row.offset_s / self.speed
            if self.stopped or (self.max_requests is not None and self.issued >= self.max_requests):
                break
            if self.duration_s is not None and at >= self.duration_s:
                break
            gevent.sleep(max(0.0, t0 + at - time.monotonic()))
            if self.stopped:
                break
            while self.in_flight >= self.max_in_flight:  # the client's own ceiling: bounded memory; shows as lag
                self.slot_free.clear()
                self.slot_free.wait(1.0)
            work = Work(
                self.settings.prompt_set.prompts[index], self.name, arrival_index=index, scheduled_at=epoch0 + at
            )
            self.issued += 1
            self.in_flight += 1
            yield work
        self.stopped = True
        self._check_done()

    def describe(self) -> str:
        return f"{self.settings.target.instance} {self.name}: {len(self.rows)} requests at the trace's times"
