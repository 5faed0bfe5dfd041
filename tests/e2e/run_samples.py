"""What a run's own 100 ms samples (samples.jsonl) saw: the gauges' peaks while a phase ran, a counter's last value.

The end-to-end suites judge the queue from these samples, not from Prometheus: a burst on a fast engine ends inside
one scrape interval (Compose scrapes every 5 s), which is why the run samples its engines itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servescope.contracts import series
from servescope.contracts.runfolder import RunFolder, read_samples


@dataclass(frozen=True)
class Peaks:
    samples: int
    running: float
    waiting: float

    def __str__(self) -> str:
        return f"{self.samples} samples, peak running {self.running:g}, peak waiting {self.waiting:g}"


def peaks_during(run: Path, engine: str, scenario: str = "burst") -> Peaks:
    """The engine's peak running and waiting over the samples taken while its first `scenario` phase ran."""
    folder = RunFolder(run)
    phase = next(p for p in folder.phases() if p.engine == engine and p.scenario == scenario)
    inside = [
        s.values
        for s in read_samples(folder)
        if s.engine == engine and s.values and phase.started_at <= s.t <= phase.ended_at
    ]
    return Peaks(
        samples=len(inside),
        running=max((v.get(series.REQUESTS_RUNNING, 0.0) for v in inside), default=0.0),
        waiting=max((v.get(series.REQUESTS_WAITING, 0.0) for v in inside), default=0.0),
    )


def last_value(run: Path, engine: str, name: str) -> float:
    """The engine's last sampled value of `name` (a counter: its count when the run ended)."""
    values = [s.values[name] for s in read_samples(RunFolder(run)) if s.engine == engine and name in s.values]
    assert values, f"no {name} sample for {engine} in {run}"
    return values[-1]
