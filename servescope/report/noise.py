"""How far each phase can be trusted: host noise carried as a quantity, outlier requests and superseded attempts left out.

A phase measured while other programs took the CPU (servescope/host/hostnoise.flags, the rule the load
generator applies live) is *noisy*: it stays in, with the most its noise could have stretched it
(hostnoise.slowdown_bound), and the estimates built on it carry that bound (the table's scaling
factor widens its CI by it, and leaves a pair out only when its noise could explain the reading:
servescope/report/table.py). A phase is *flagged*, and never averaged in, when it holds an outlier request:
one whose time (the engine's own when it reports one: llama.cpp's prompt + predicted ms, Ollama's
total_duration; else the client's E2E) is more than OUTLIER_RATIO x the median of the same phase
over all repetitions. An attempt that a later retry of the same repetition replaced is superseded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from servescope.contracts.runfolder import PhaseRecord, base_phase
from servescope.contracts.thresholds import NoiseRule
from servescope.host import hostnoise
from servescope.judgements import stats
from servescope.judgements.numpy_on_use import numpy as np
from servescope.report import gauges, query
from servescope.report.crosscheck import PARSED, REQUEST_TIME
from servescope.report.load import Run
from servescope.text import words


@dataclass
class PhaseTrust:
    """How far one phase record can be trusted: its host noise, outlier flags, and whether a retry superseded it."""

    instance: str
    phase: str  # the record's (unique) name
    base: str  # the same phase across repetitions and attempts
    repetition: int
    attempt: int
    noise: dict | None
    host: str  # hostnoise.describe: the figures, one line
    flags: list[str] = field(default_factory=list)  # why it is left out (outlier requests); empty: it is used
    outliers: list[str] = field(default_factory=list)
    superseded: bool = False  # a later attempt of the same repetition replaced it
    noisy: list[str] = field(default_factory=list)  # the host noise rule's findings: used, with `slowdown` carried
    slowdown: float | None = None  # hostnoise.slowdown_bound: the most other programs could have stretched it

    @property
    def flagged(self) -> bool:
        return bool(self.flags)

    @property
    def usable(self) -> bool:
        return not self.flags and not self.superseded

    def rerun(self) -> str:
        return f"{self.instance} {self.phase} ({'; '.join(self.flags)})"


@dataclass
class Assessment:
    """Every phase's trust under one noise rule, by (instance, phase): which records the report may use."""

    rule: NoiseRule
    phases: dict[tuple[str, str], PhaseTrust] = field(default_factory=dict)

    def of(self, instance: str, phase: str) -> PhaseTrust | None:
        return self.phases.get((instance, phase))

    def usable(self, record: PhaseRecord) -> bool:
        trust = self.of(record.instance, record.phase)
        return trust is None or trust.usable

    def flagged(self, instance: str | None = None) -> list[PhaseTrust]:
        return [t for t in self.phases.values() if t.flagged and (instance is None or t.instance == instance)]

    def noisy(self, instance: str | None = None) -> list[PhaseTrust]:
        """Phases measured on a busy host (used, their noise carried), retries' superseded attempts aside."""
        return [
            t
            for t in self.phases.values()
            if t.noisy and not t.superseded and (instance is None or t.instance == instance)
        ]


def worst_slowdown(trusts: list[PhaseTrust]) -> float:
    """The largest slowdown bound among phases (1.0: none was slowed, or none was measured)."""
    return max((t.slowdown or 1.0 for t in trusts), default=1.0)


_TRUSTED = PhaseTrust("", "", "", 1, 1, None, "")


MAX_OUTLIERS = 20  # outlier requests named per phase; the count says the rest


def assess(run: Run, rule: NoiseRule | None = None) -> Assessment:
    rule = rule or NoiseRule.current()
    out = Assessment(rule)
    latest: dict[tuple[str, str, int], int] = {}
    for p in run.phases:
        key = (p.instance, base_phase(p.phase), p.repetition)
        latest[key] = max(latest.get(key, 0), p.attempt)
    # Each successful request's time (REQUEST_TIME), by engine and phase, computed once into a temporary table; a
    # phase's median is over its repetitions. Fetched as one array sorted by phase and cut by the phases' counts: a
    # long run's million times never become Python floats (a short run's few do: no array, stats.SORTED_IN_PYTHON).
    run.con.execute(
        f"CREATE OR REPLACE TEMP TABLE request_times AS SELECT * FROM (SELECT instance, phase, prompt_id, seq, "
        f"{REQUEST_TIME} AS t FROM {PARSED} WHERE ok) WHERE t IS NOT NULL"
    )
    try:
        counts = run.con.execute(
            "SELECT instance, phase, count(*) FROM request_times GROUP BY ALL ORDER BY ALL"
        ).fetchall()
        rows = run.con.execute("SELECT t FROM request_times ORDER BY instance, phase")
        if sum(n for _, _, n in counts) <= stats.SORTED_IN_PYTHON:
            times = [t for (t,) in rows.fetchall()]
        else:
            times = np.asarray(rows.fetchnumpy()["t"], dtype=float)
        by_base: dict[tuple[str, str], list] = {}
        start = 0
        for instance, phase, n in counts:
            by_base.setdefault((instance, base_phase(phase)), []).append(times[start : start + n])
            start += n
        medians = {key: stats.median(_joined(parts)) for key, parts in by_base.items()}
        _judge(run, rule, out, medians, latest)
    finally:
        run.con.execute("DROP TABLE IF EXISTS request_times")
    return out


def _joined(parts: list) -> list | np.ndarray:
    """The phases' times of one base phase as one sequence: a list of lists joined, an array's slices concatenated."""
    if isinstance(parts[0], list):
        return [t for part in parts for t in part]
    return np.concatenate(parts)


def _judge(run: Run, rule: NoiseRule, out: Assessment, medians: dict, latest: dict) -> None:
    """Each phase's trust: its host noise flags and its outlier requests (request_times: the successful ones)."""
    for p in run.phases:
        base = base_phase(p.phase)
        trust = PhaseTrust(p.instance, p.phase, base, p.repetition, p.attempt, p.noise, hostnoise.describe(p.noise))
        trust.noisy = hostnoise.flags(p.noise, p.instance, rule)
        trust.slowdown = hostnoise.slowdown_bound(p.noise)
        mid = medians.get((p.instance, base))
        if mid:
            slow = run.con.execute(
                f"SELECT prompt_id, t FROM request_times WHERE instance = ? AND phase = ? AND t > ? "
                f"ORDER BY {query.ORDER}",
                [p.instance, p.phase, rule.outlier_ratio * mid],
            ).fetchall()
            trust.outliers = [f"{prompt_id} {t:.3f}s" for prompt_id, t in slow[:MAX_OUTLIERS]]
            if len(slow) > MAX_OUTLIERS:
                trust.outliers.append(f"and {len(slow) - MAX_OUTLIERS} more")
        if trust.outliers:
            trust.flags.append(
                f"outlier {words.noun(len(trust.outliers), 'request')}: {', '.join(trust.outliers)} against the "
                f"phase's median {mid:.3f}s "
                f"(more than {rule.outlier_ratio:g}x)"
            )
        trust.superseded = p.attempt < latest[(p.instance, base, p.repetition)]
        out.phases[(p.instance, p.phase)] = trust


def clean(run: Run, assessment: Assessment) -> Run:
    """The run without its flagged and superseded phases (and their requests): what conclusions may rest on."""
    keep = [p for p in run.phases if assessment.usable(p)]
    dropped = [(p.instance, p.phase) for p in run.phases if not assessment.usable(p)]
    return run.without(dropped, keep)


def clean_gauges(report: gauges.GaugeReport, run: Run, assessment: Assessment) -> gauges.GaugeReport:
    """The gauges without what was read while a flagged phase of the same engine ran (peaks recomputed on `run`)."""
    out = dataclasses.replace(report, engines={})
    for instance, eg in report.engines.items():
        windows = [
            (p.started_at, p.ended_at)
            for p in run.phases
            if p.instance == instance and (t := assessment.of(instance, p.phase)) is not None and not t.usable
        ]
        if not windows:
            out.engines[instance] = eg
            continue
        kept = dataclasses.replace(eg, peaks={}, phase_peaks={}, kv_while_waiting=(None, None))
        kept.series = {
            name: [(t, v) for t, v in points if not any(a <= t <= b for a, b in windows)]
            for name, points in eg.series.items()
        }
        kept.coverage = {k: c for k, c in eg.coverage.items() if (assessment.of(instance, k) or _TRUSTED).usable}
        gauges.summarise(kept, clean(run, assessment), slack=eg.spacing_s or 0.0)
        out.engines[instance] = kept
    return out


def rerun_text(flagged: list[PhaseTrust]) -> str:
    return "rerun " + "; ".join(t.rerun() for t in flagged)


def to_json(assessment: Assessment) -> dict:
    return {
        "rule": assessment.rule.text(),
        "thresholds": dataclasses.asdict(assessment.rule),
        "phases": [dataclasses.asdict(t) for t in assessment.phases.values()],
    }
