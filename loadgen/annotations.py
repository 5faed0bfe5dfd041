"""Each finished load phase as a Grafana annotation, only when a Grafana URL is set; a failure is one line and the run goes on."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from servescope.contracts.urls import redact

if TYPE_CHECKING:
    from loadgen.scenarios import Phase


class _Capture(logging.Handler):
    """Keeps the reason `post_phase` logs, so the user sees it as one line of ours."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class PhaseAnnotator:
    """Posts a region annotation (first send .. last finish) per phase through `dashboards.annotations.post_phase`.

    With no URL nothing is ever called. After the first failure (Grafana down, refused, no
    credential) it says so once and stops trying: a Grafana that does not answer must not add its
    timeout to every later phase.
    """

    def __init__(self, url: str | None, *, post: Callable[..., bool] | None = None, err: TextIO | None = None):
        self.url = url.rstrip("/") if url else None
        self.enabled = self.url is not None
        self._post = post
        self.err = err
        self.posted = 0

    def phase_done(self, phase: Phase) -> bool:
        if not self.enabled:
            return False
        records = phase.phase_records()
        if not records:
            return False  # nothing finished: no window to mark
        started = min(r.started_at for r in records)
        ended = max(r.ended_at for r in records)
        target = phase.settings.target
        requests = sum(r.requests for r in records)
        text = f"{target.instance} · {phase.scenario} · {phase.title}: {requests} requests in {ended - started:.1f} s"
        post = self._post
        if post is None:
            from dashboards.annotations import post_phase as post
        capture = _Capture()
        logger = logging.getLogger("servescope.annotations")
        level = logger.level
        logger.addHandler(capture)
        logger.setLevel(logging.INFO)  # post_phase says why at INFO; the root logger's WARNING would drop it
        try:
            ok = post(
                phase.name, started, ended, engine=target.instance, scenario=phase.scenario, text=text, url=self.url
            )
        except Exception as exc:  # noqa: BLE001 -- an annotation is never worth the run
            capture.messages.append(f"grafana annotation skipped for phase {phase.name}: {type(exc).__name__}: {exc}")
            ok = False
        finally:
            logger.removeHandler(capture)
            logger.setLevel(level)
        if ok:
            self.posted += 1
            return True
        self.enabled = False
        reason = capture.messages[-1] if capture.messages else f"grafana annotation for phase {phase.name} not accepted"
        print(
            f"loadgen: {redact(' '.join(reason.split()))} (GRAFANA_URL={redact(self.url)}); "
            f"later phases are not annotated",
            file=self.err or sys.stderr,
            flush=True,
        )
        return False
