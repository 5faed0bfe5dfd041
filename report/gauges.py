"""Prometheus over the run's window: the seed's three lever gauges per engine, their peaks, and the KV arithmetic."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import requests

from report.load import Run
from servescope import series

GAUGES = series.LEVER_GAUGES  # running, waiting, KV usage
KV_SERIES = (series.KV_BLOCK_SIZE, series.KV_BLOCKS, series.KV_CAPACITY_TOKENS, series.KV_MAX_CONCURRENCY)
MAX_POINTS = 600  # query_range resolution: a step that gives at most this many points
PAD_S = 5.0  # look a little beyond the run so a scrape just after the last request still counts
TIMEOUT_S = 5.0


class PrometheusError(Exception):
    """Prometheus could not answer: one line saying why."""


class Prometheus:
    """The two HTTP API calls the report needs (query, query_range), with one-line errors."""

    def __init__(self, url: str, timeout: float = TIMEOUT_S, session: requests.Session | None = None):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = session or requests.Session()

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        try:
            resp = self.session.get(f"{self.url}{path}", params=params, timeout=self.timeout)
        except requests.ConnectionError:
            raise PrometheusError(f"Prometheus at {self.url} is unreachable (connection refused or no route)") from None
        except requests.Timeout:
            raise PrometheusError(f"Prometheus at {self.url} did not answer within {self.timeout:g}s") from None
        except requests.RequestException as exc:
            raise PrometheusError(f"Prometheus at {self.url}: {type(exc).__name__}") from None
        try:
            body = resp.json()
        except ValueError:
            raise PrometheusError(f"Prometheus at {self.url} answered HTTP {resp.status_code} without JSON") from None
        if resp.status_code != 200 or body.get("status") != "success":
            raise PrometheusError(f"Prometheus at {self.url}: {body.get('error') or f'HTTP {resp.status_code}'}")
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict]:
        return self._get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"}).get("result", [])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return self._get("/api/v1/query_range", params).get("result", [])


@dataclass
class EngineGauges:
    instance: str
    engine: str
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # gauge -> [(t, value)]
    peaks: dict[str, float | None] = field(default_factory=dict)  # gauge -> peak over the engine's window
    phase_peaks: dict[str, dict[str, float | None]] = field(default_factory=dict)  # phase -> gauge -> peak
    kv: dict[str, float | None] = field(default_factory=dict)  # KV arithmetic series -> value at run end


@dataclass
class GaugeReport:
    available: bool
    reason: str  # why there is no data (one line), or where the data came from
    url: str
    window: tuple[float, float] | None = None
    step_s: float | None = None
    engines: dict[str, EngineGauges] = field(default_factory=dict)
    reachable: bool = False  # Prometheus answered (even if with no data): worth asking it for more


def collect(run: Run, url: str, client: Prometheus | None = None) -> GaugeReport:
    """Query the gauges over [run start, run end]; never raises: no data is a reason, not a crash."""
    start, end = run.started_at, run.ended_at
    if start is None or end is None:
        return GaugeReport(False, "the run folder has no timed records, so there is no window to query", url)
    client = client or Prometheus(url)
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
        eg = EngineGauges(instance, info.kind)
        for gauge, result in results.items():
            values = _merge(_pick(result, instance, info.kind, run), ratio=gauge == series.KV_CACHE_USAGE)
            if values:
                eg.series[gauge] = values
            eg.peaks[gauge] = _peak(values, start, end)
            for phase in run.phases_of(instance):
                eg.phase_peaks.setdefault(phase.phase, {})[gauge] = _peak(
                    values, phase.started_at - step, phase.ended_at + step
                )
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


def _pick(result: list[dict], instance: str, kind: str, run: Run) -> list[dict]:
    """Series belonging to one engine instance.

    The exporter's `instance` label collides with Prometheus' target label, so it arrives as
    `exported_instance` unless the job uses honor_labels; accept both, and fall back to the
    engine kind when the run has only one instance of that kind.
    """

    def label_instance(s: dict) -> str | None:
        m = s.get("metric", {})
        return m.get("exported_instance") or m.get("instance")

    by_name = [s for s in result if label_instance(s) == instance and s.get("metric", {}).get("engine") in (kind, None)]
    if by_name:
        return by_name
    same_kind = [i for i, e in run.engines.items() if e.kind == kind]
    if len(same_kind) == 1:
        return [s for s in result if s.get("metric", {}).get("engine") == kind]
    return []


def _merge(picked: list[dict], ratio: bool) -> list[tuple[float, float]]:
    """Several series for one engine (e.g. per model): counts add up, a usage ratio takes the fullest pool."""
    points: dict[float, float] = {}
    for s in picked:
        for t, v in s.get("values", []):
            value, t = float(v), float(t)
            if math.isfinite(value):
                points[t] = max(points.get(t, value), value) if ratio else points.get(t, 0.0) + value
    return sorted(points.items())


def _peak(values: list[tuple[float, float]], start: float, end: float) -> float | None:
    inside = [v for t, v in values if start <= t <= end]
    return max(inside) if inside else None


def to_json(report: GaugeReport) -> dict:
    return {
        "available": report.available,
        "reason": report.reason,
        "prometheus_url": report.url,
        "window": list(report.window) if report.window else None,
        "step_s": report.step_s,
        "engines": {
            i: {
                "engine": e.engine,
                "peaks": e.peaks,
                "phase_peaks": e.phase_peaks,
                "kv": e.kv,
                "series": {g: [[t, v] for t, v in pts] for g, pts in e.series.items()},
            }
            for i, e in report.engines.items()
        },
    }
