"""The reference page's three lever gauges per engine over the run (own samples, else Prometheus), peaks, KV arithmetic."""

from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import asdict, dataclass, field

from servescope.contracts import series, thresholds
from servescope.contracts.runfolder import SAMPLES, RunFolder, SampleRecord, read_samples
from servescope.contracts.urls import redact

# The report's Prometheus client: bounded, its answers checked against their shape (servescope/prometheus/prometheus_api.py).
from servescope.prometheus.prometheus_api import Prometheus, PrometheusError
from servescope.prometheus.sampler import combine_models, split_at_gaps
from servescope.report.load import Run
from servescope.text import printable, words

GAUGES = series.LEVER_GAUGES  # running, waiting, KV usage
KV_SERIES = (series.KV_BLOCK_SIZE, series.KV_BLOCKS, series.KV_CAPACITY_TOKENS, series.KV_MAX_CONCURRENCY)
# Counters kept beside the gauges from the run's own samples: prefix-cache reuse (servescope/report/workloads.py).
REUSE_COUNTERS = (series.PROMPT_TOKENS, series.PROMPT_CACHED_TOKENS)
MAX_POINTS = 600  # query_range resolution: a step that gives at most this many points
PAD_S = 5.0  # look a little beyond the run so a scrape just after the last request still counts


@dataclass
class PhaseCoverage:
    """How well the gauges saw one load phase: reads inside it, and how many of them got no values."""

    phase: str
    wall_s: float
    samples: int = 0  # reads with values inside [start, end]
    missing: int = 0  # reads inside it that got no values
    reasons: list[str] = field(default_factory=list)  # why, one line each (distinct)


@dataclass
class EngineGauges:
    """One engine instance's lever gauges over the run: series, peaks per run and phase, KV arithmetic, coverage."""

    instance: str
    engine: str
    source: str = "prometheus"  # "samples" (the run's own, samples.jsonl) or "prometheus" (query_range)
    spacing_s: float | None = None  # the sampling interval, or the query_range step
    # gauge -> [(t, value)], None where a read got no value: plots draw it as a gap, peaks skip it
    series: dict[str, list[tuple[float, float | None]]] = field(default_factory=dict)
    peaks: dict[str, float | None] = field(default_factory=dict)  # gauge -> peak over the engine's window
    phase_peaks: dict[str, dict[str, float | None]] = field(default_factory=dict)  # phase -> gauge -> peak
    kv: dict[str, float | None] = field(default_factory=dict)  # KV arithmetic series -> value at run end
    coverage: dict[str, PhaseCoverage] = field(default_factory=dict)  # phase -> coverage
    kv_while_waiting: tuple[float | None, float | None] = (None, None)  # (highest, mean) KV usage when waiting > 0
    prometheus_peaks: dict[str, float | None] = field(default_factory=dict)  # what the scrapes saw, when samples led


@dataclass
class Member:
    """One instance of a fleet: its peaks over the run and how much of the run it had requests waiting."""

    instance: str
    peaks: dict[str, float | None]
    waiting_share: float | None  # share of its reads with requests waiting (None: waiting never read)


@dataclass
class Fleet:
    """Many instances of one engine kind, summarised instead of shown one by one: behind one of the run's targets (a
    router in front of replicas the exporter or Prometheus read one by one), or the run's own targets of that kind."""

    engine: str
    behind: str | None  # the run's target they answered through; None: they are the run's targets
    members: list[Member]  # the busiest first: by peak waiting, then peak running
    spacing_s: float | None = None
    total: dict[str, list[tuple[float, float | None]]] = field(default_factory=dict)  # derived: combined per read

    @property
    def queued(self) -> list[Member]:
        return [m for m in self.members if (m.peaks.get(series.REQUESTS_WAITING) or 0) > 0]

    def spread(self, gauge: str) -> tuple[float, float, float] | None:
        """(lowest, median, highest) of the members' peaks of one gauge; None when no member read it."""
        peaks = sorted(v for m in self.members if (v := m.peaks.get(gauge)) is not None)
        return (peaks[0], statistics.median(peaks), peaks[-1]) if peaks else None


@dataclass
class GaugeReport:
    """The gauges of a run's engines, and where they came from (own samples or Prometheus) or why there are none."""

    available: bool
    reason: str  # why there is no data (one line), or where the data came from
    url: str
    window: tuple[float, float] | None = None
    step_s: float | None = None
    engines: dict[str, EngineGauges] = field(default_factory=dict)
    reachable: bool = False  # Prometheus answered (even if with no data): worth asking it for more
    warnings: list[str] = field(default_factory=list)  # what could not be read from samples.jsonl
    fleets: list[Fleet] = field(default_factory=list)

    def fleet_of(self, instance: str) -> Fleet | None:
        """The fleet a run's target stands for (behind it) or belongs to (one of many of its kind)."""
        for f in self.fleets:
            if f.behind == instance or (f.behind is None and any(m.instance == instance for m in f.members)):
                return f
        return None


def collect(run: Run, url: str, client: Prometheus | None = None) -> GaugeReport:
    """The gauges over the run: the run's own samples where it has them, else Prometheus; never raises."""
    report = _from_prometheus(run, url, client)
    records, report.warnings = _read_samples(run)
    samples = _grouped(records)
    behind: dict[str, Fleet] = {f.behind: f for f in report.fleets if f.behind is not None}
    for instance, info in run.engines.items():
        mine = _mine(samples, instance, info.kind, run)
        if not mine:
            continue
        by_instance: dict[str, list[SampleRecord]] = {}
        for r in mine:
            by_instance.setdefault(r.instance, []).append(r)
        if len(by_instance) > 1:  # a router's replicas, read one by one: their sum stands for the target
            members = {name: _from_samples(run, name, info.kind, rs) for name, rs in by_instance.items()}
            behind[instance] = _fleet(info.kind, instance, members.values(), run)
            mine = _combined(mine, instance)
        eg = _from_samples(run, instance, info.kind, mine)
        scraped = report.engines.get(instance)
        if scraped is not None and scraped.series:
            eg.prometheus_peaks = scraped.peaks
            eg.kv = {k: v if v is not None else scraped.kv.get(k) for k, v in eg.kv.items()}
        report.engines[instance] = eg
    report.fleets = list(behind.values())
    report.fleets += _fleets_of_targets(report, run)
    sampled = [eg for eg in report.engines.values() if eg.source == "samples"]
    if sampled:
        interval = max(eg.spacing_s or 0.0 for eg in sampled)
        scraped = [eg.instance for eg in report.engines.values() if eg.source == "prometheus" and eg.series]
        prometheus = f"Prometheus ({report.reason}) for {', '.join(scraped)}" if scraped else ""
        if not report.reachable:
            prometheus = f"Prometheus not used: {report.reason}"
        report.reason = "; ".join(
            x for x in (f"the run's own samples every {interval * 1000:g} ms ({SAMPLES})", prometheus) if x
        )
        report.available = True
        report.window = report.window or (run.started_at, run.ended_at)
    return report


def _from_prometheus(run: Run, url: str, client: Prometheus | None) -> GaugeReport:
    """Query the gauges over [run start, run end] from Prometheus."""
    client = client or Prometheus(url)
    url = printable.line(redact(url))  # what the report says and keeps: never the URL's password
    start, end = run.started_at, run.ended_at
    if start is None or end is None:
        return GaugeReport(False, "the run folder has no timed records, so there is no window to query", url)
    window = (start - PAD_S, end + PAD_S)
    step = max(1.0, math.ceil((window[1] - window[0]) / MAX_POINTS))
    report = GaugeReport(False, "", url, window=(start, end), step_s=step)
    try:
        results = {g: client.query_range(g, window[0], window[1], step) for g in GAUGES}
        kv_results = {
            k: client.query(f"max_over_time({k}[{int(window[1] - window[0]) + 60}s])", window[1]) for k in KV_SERIES
        }
    except PrometheusError as exc:
        report.reason = str(exc)
        return report
    report.reachable = True
    for instance, info in run.engines.items():
        eg = EngineGauges(instance, info.kind, spacing_s=step)
        members: dict[str, EngineGauges] = {}
        for gauge, result in results.items():
            picked = _pick(result, instance, info.kind, run)
            values = _merge(picked, gauge)
            if values:
                eg.series[gauge] = values
            by_member: dict[str, list[dict]] = {}
            for s in picked:
                by_member.setdefault(_label_instance(s) or "", []).append(s)
            for name, own in by_member.items():
                member = members.setdefault(name, EngineGauges(name, info.kind, spacing_s=step))
                member.series[gauge] = _merge(own, gauge)
        summarise(eg, run, slack=step)
        if len(members) > 1:  # a router's replicas, scraped one by one: their sum stands for the target
            for member in members.values():
                summarise(member, run, slack=step)
            report.fleets.append(_fleet(info.kind, instance, members.values(), run))
        for name, result in kv_results.items():
            picked = _pick(result, instance, info.kind, run)
            eg.kv[name] = max((float(s["value"][1]) for s in picked), default=None)
        report.engines[instance] = eg
    if not any(eg.series for eg in report.engines.values()):
        names = ", ".join(GAUGES)
        report.reason = (
            f"Prometheus at {url} answered but holds no samples of {names} between the run's start and end "
            f"(was the exporter scraped during the run?)"
        )
        return report
    report.available = True
    report.reason = f"query_range at {url}, step {step:g}s"
    return report


def _read_samples(run: Run) -> tuple[list[SampleRecord], list[str]]:
    if not (run.path / SAMPLES).exists():
        return [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            records = list(read_samples(RunFolder(run.path)))
        except (ValueError, TypeError, AttributeError, OSError) as exc:
            return [], [f"{SAMPLES} unreadable, gauges from Prometheus only: {exc}"]
    notes = [str(w.message) for w in caught]
    usable = [
        r
        for r in records
        if isinstance(r.t, int | float) and isinstance(r.values, dict) and isinstance(r.interval_s, int | float)
    ]
    if len(usable) < len(records):
        notes.append(
            f"{SAMPLES}: {words.count(len(records) - len(usable), 'record')} without a time, interval or values, skipped"
        )
    return usable, notes


def _mine(samples: dict[tuple[str, str], list[SampleRecord]], instance: str, kind: str, run: Run) -> list[SampleRecord]:
    """One engine instance's records, by the exporter's labels (see _pick for the name rule); `samples` grouped by
    (engine, instance) once, so a run against a hundred instances does not walk every record a hundred times."""
    labelled = [{"metric": {"instance": i, "engine": e}, "records": rs} for (e, i), rs in samples.items()]
    return sorted((r for x in _pick(labelled, instance, kind, run) for r in x["records"]), key=lambda s: s.t)


def _grouped(samples: list[SampleRecord]) -> dict[tuple[str, str], list[SampleRecord]]:
    out: dict[tuple[str, str], list[SampleRecord]] = {}
    for s in samples:
        out.setdefault((s.engine, s.instance), []).append(s)
    return out


def fleet_kinds(run: Run) -> set[str]:
    """Engine kinds with FLEET_SUMMARY_INSTANCES or more of the run's targets: summarised, not shown one by one."""
    counts: dict[str, int] = {}
    for info in run.engines.values():
        counts[info.kind] = counts.get(info.kind, 0) + 1
    return {kind for kind, n in counts.items() if n >= thresholds.FLEET_SUMMARY_INSTANCES}


def _from_samples(run: Run, instance: str, kind: str, records: list[SampleRecord]) -> EngineGauges:
    interval = statistics.median(r.interval_s for r in records)
    eg = EngineGauges(instance, kind, source="samples", spacing_s=interval)
    for gauge in (*GAUGES, *REUSE_COUNTERS):
        points = [(r.t, None if r.missing else r.values.get(gauge)) for r in records]
        if any(v is not None for _, v in points):
            eg.series[gauge] = points
    summarise(eg, run, slack=interval)
    for name in KV_SERIES:
        eg.kv[name] = next((r.values[name] for r in reversed(records) if not r.missing and name in r.values), None)
    for phase in run.phases_of(instance):
        inside = [r for r in records if phase.started_at <= r.t <= phase.ended_at]
        cov = PhaseCoverage(phase.phase, phase.wall_s)
        cov.samples = sum(1 for r in inside if not r.missing)
        cov.missing = sum(1 for r in inside if r.missing)
        cov.reasons = list(dict.fromkeys(r.missing for r in inside if r.missing))
        eg.coverage[phase.phase] = cov
    return eg


def summarise(eg: EngineGauges, run: Run, slack: float) -> None:
    """Peaks over the run and per phase (within one sample of its edges), and KV usage while requests waited."""
    start, end = run.started_at, run.ended_at
    for gauge in GAUGES:
        values = eg.series.get(gauge, [])
        eg.peaks[gauge] = _peak(values, start - slack, end + slack) if start is not None and end is not None else None
        for phase in run.phases_of(eg.instance):
            eg.phase_peaks.setdefault(phase.phase, {})[gauge] = _peak(
                values, phase.started_at - slack, phase.ended_at + slack
            )
    kv = dict(eg.series.get(series.KV_CACHE_USAGE, []))
    while_waiting = [
        kv[t] for t, w in eg.series.get(series.REQUESTS_WAITING, []) if w and w > 0 and kv.get(t) is not None
    ]
    if while_waiting:
        eg.kv_while_waiting = (max(while_waiting), statistics.fmean(while_waiting))


def _pick(result: list[dict], instance: str, kind: str, run: Run) -> list[dict]:
    """Series belonging to one engine instance.

    The exporter's `instance` label collides with Prometheus' target label, so it arrives as
    `exported_instance` unless the job uses honor_labels; accept both, and fall back to the
    engine kind when the run has only one instance of that kind.
    """

    by_name = [
        s for s in result if _label_instance(s) == instance and s.get("metric", {}).get("engine") in (kind, None)
    ]
    if by_name:
        return by_name
    same_kind = [i for i, e in run.engines.items() if e.kind == kind]
    if len(same_kind) == 1:
        return [s for s in result if s.get("metric", {}).get("engine") == kind]
    return []


def _label_instance(s: dict) -> str | None:
    m = s.get("metric", {})
    return m.get("exported_instance") or m.get("instance")


def _combined(records: list[SampleRecord], instance: str) -> list[SampleRecord]:
    """Several instances' records as one target's: per read (one read gives every instance the same time), the
    values combined the way one instance's models are (combine_models: counts add up, a usage ratio is the fullest);
    a read with no instance answering stays missing. Derived, and the report says so."""
    by_t: dict[float, list[SampleRecord]] = {}
    for r in records:
        by_t.setdefault(r.t, []).append(r)
    out = []
    for t, group in sorted(by_t.items()):
        answered = [r for r in group if not r.missing]
        values: dict[str, list[float]] = {}
        for r in answered:
            for name, v in r.values.items():
                values.setdefault(name, []).append(v)
        first = group[0]
        out.append(
            SampleRecord(
                t,
                first.read_s,
                first.interval_s,
                first.engine,
                instance,
                first.phase,
                {name: combine_models(name, vs) for name, vs in values.items()},
                None if answered else first.missing,
            )  # fmt: skip
        )
    return out


def _fleet(engine: str, behind: str | None, members, run: Run) -> Fleet:
    """The fleet's members, busiest first, and its derived total (combined per read time), which a fleet behind one
    target does not need: that target's own series is already their sum."""
    summary = []
    spacing = None
    total: dict[str, dict[float, list[float]]] = {}
    for eg in members:
        spacing = max(spacing or 0.0, eg.spacing_s or 0.0) or None
        waiting = [v for _, v in eg.series.get(series.REQUESTS_WAITING, []) if v is not None]
        share = sum(1 for v in waiting if v > 0) / len(waiting) if waiting else None
        summary.append(Member(eg.instance, dict(eg.peaks), share))
        for gauge in GAUGES if behind is None else ():
            for t, v in eg.series.get(gauge, []):
                if v is not None:
                    total.setdefault(gauge, {}).setdefault(t, []).append(v)
    summary.sort(
        key=lambda m: (-(m.peaks.get(series.REQUESTS_WAITING) or 0), -(m.peaks.get(series.REQUESTS_RUNNING) or 0))
    )
    combined = {g: sorted((t, combine_models(g, vs)) for t, vs in pts.items()) for g, pts in total.items()}
    return Fleet(engine, behind, summary, spacing, combined)


def _fleets_of_targets(report: GaugeReport, run: Run) -> list[Fleet]:
    """The run's own targets, when one engine kind has FLEET_SUMMARY_INSTANCES or more of them with gauges."""
    by_kind: dict[str, list[EngineGauges]] = {}
    for instance, eg in report.engines.items():
        if eg.series and report.fleet_of(instance) is None:
            by_kind.setdefault(run.engines[instance].kind, []).append(eg)
    return [
        _fleet(kind, None, egs, run) for kind, egs in by_kind.items() if len(egs) >= thresholds.FLEET_SUMMARY_INSTANCES
    ]


def _merge(picked: list[dict], name: str) -> list[tuple[float, float]]:
    """Several series for one engine (e.g. per model) merged the way the sampler merges them (combine_models)."""
    points: dict[float, list[float]] = {}
    for s in picked:
        for t, v in s.get("values", []):
            value = float(v)
            if math.isfinite(value):
                points.setdefault(float(t), []).append(value)
    return sorted((t, combine_models(name, values)) for t, values in points.items())


def _peak(values: list[tuple[float, float | None]], start: float, end: float) -> float | None:
    inside = [v for t, v in values if start <= t <= end and v is not None]
    return max(inside) if inside else None


def with_gaps(points: list[tuple[float, float | None]], spacing: float | None) -> list[tuple[float, float]]:
    """Points ready to draw: a read without a value, or a pause longer than GAP_FACTOR spacings, becomes NaN (a gap)."""
    return [(t, math.nan if v is None else v) for t, v in split_at_gaps(points, spacing)]


def to_json(report: GaugeReport) -> dict:
    return {
        "available": report.available,
        "reason": report.reason,
        "prometheus_url": report.url,
        "window": list(report.window) if report.window else None,
        "step_s": report.step_s,
        "warnings": report.warnings,
        "engines": {
            i: {
                "engine": e.engine,
                "source": e.source,
                "spacing_s": e.spacing_s,
                "peaks": e.peaks,
                "phase_peaks": e.phase_peaks,
                "prometheus_peaks": e.prometheus_peaks,
                "kv_while_waiting": {"max": e.kv_while_waiting[0], "mean": e.kv_while_waiting[1]},
                "coverage": {p: asdict(c) for p, c in e.coverage.items()},
                "kv": e.kv,
                **(
                    {"series": {}, "series_left_out": "one of a fleet: its reads are in samples.jsonl"}
                    if (f := report.fleet_of(i)) is not None and f.behind is None
                    else {"series": {g: [[t, v] for t, v in pts] for g, pts in e.series.items()}}
                ),
            }
            for i, e in report.engines.items()
        },
        "fleets": [
            {
                "engine": f.engine,
                "behind": f.behind,
                "instances": len(f.members),
                "queued": [m.instance for m in f.queued],
                "spread": {g: f.spread(g) for g in GAUGES},
                "members": [asdict(m) for m in f.members],
                "total": {
                    "derived": "combined per read over the members"
                    + (f": the series of engines[{f.behind!r}]" if f.behind else ""),
                    **{g: [[t, v] for t, v in pts] for g, pts in f.total.items()},
                },
            }
            for f in report.fleets
        ],
    }
