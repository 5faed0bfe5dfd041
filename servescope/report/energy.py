"""A phase's energy as its record carries it (servescope/host/energy.py): joules, per good token and per request, or why not measured.

The one place the report (the goodput section) and the plan read a phase's joules from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servescope.contracts.runfolder import PhaseRecord
from servescope.report.load import Run

NOT_RECORDED = "not measured: this run folder was written before servescope recorded energy"


@dataclass(frozen=True)
class Energy:
    """The machine's energy while a phase ran, or why it was not measured (joules None, reason set)."""

    joules: float | None
    reason: str | None = None  # "not measured: ..." when joules is None
    sources: tuple[str, ...] = ()  # the counters that were read: "intel-rapl", "nvidia-smi"
    missing: tuple[str, ...] = ()  # sources present but unread: their joules are not in the sum

    @property
    def measured(self) -> bool:
        return self.joules is not None

    def per(self, count: int | None) -> float | None:
        """Joules per one of `count` things done in the phase (good tokens, requests); None when either is unknown."""
        return self.joules / count if self.joules is not None and count else None

    def text(self) -> str:
        """The reason as the report prints it: "not measured (why)"."""
        body = (self.reason or "").removeprefix("not measured").removeprefix(": ").replace("; not measured: ", "; ")
        return f"not measured ({body})" if body else "not measured"


def of_record(record: PhaseRecord) -> Energy:
    """A phase record's energy; a record without one (an older run folder) was not measured."""
    data = record.energy
    if not isinstance(data, dict):
        return Energy(None, NOT_RECORDED)
    joules = data.get("joules")
    sources = [s for s in data.get("sources") or [] if isinstance(s, dict)]
    if not isinstance(joules, (int, float)) or isinstance(joules, bool) or not math.isfinite(joules) or joules < 0:
        reason = data.get("reason")
        return Energy(None, reason if isinstance(reason, str) and reason else "not measured")
    return Energy(
        float(joules),
        sources=tuple(str(s.get("source")) for s in sources if isinstance(s.get("joules"), (int, float))),
        missing=tuple(
            str(s["reason"]) for s in sources if s.get("joules") is None and isinstance(s.get("reason"), str)
        ),
    )


def of_phase(run: Run, phase: PhaseRecord | str, instance: str | None = None) -> Energy | None:
    """The energy of one phase of the run (a record of run.phases, or its name and engine instance); None when the
    run has no such phase. A phase name alone must name one phase (names repeat across engines)."""
    if isinstance(phase, PhaseRecord):
        return of_record(phase)
    found = [p for p in run.phases if p.phase == phase and (instance is None or p.instance == instance)]
    if len(found) > 1:
        raise ValueError(f"phase {phase!r} ran on {len(found)} engines: name the instance")
    return of_record(found[0]) if found else None
