"""Client-side latency percentiles (TTFT, ITL, TPOT, E2E) per engine and scenario, failures counted by reason."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

from report import stats
from report.load import Run
from servescope.runfolder import RequestRecord
from servescope.slo import tpot  # one definition: the SLOs judge the TPOT the report shows

METRICS = ("ttft_s", "itl_s", "tpot_s", "e2e_s")
METRIC_TITLES = {"ttft_s": "TTFT", "itl_s": "ITL", "tpot_s": "TPOT", "e2e_s": "E2E", "output_tokens": "output tokens"}
DEFINITIONS = {
    "ttft_s": "TTFT: request sent -> first chunk with non-empty content",
    "itl_s": "ITL: every gap between consecutive content chunks, pooled over the requests",
    "tpot_s": "TPOT: (E2E - TTFT) / (output tokens - 1), one value per request",
    "e2e_s": "E2E: request sent -> last content chunk",
}
FAILURE_POLICY = (
    "Only successful requests enter the latency statistics; failed requests are counted by reason and "
    "their partial timings are left out (a request cut off mid-stream would look fast)."
)


@dataclass
class LatencyGroup:
    instance: str
    engine: str
    scenario: str
    requests: int
    ok: int
    failures: dict[str, int]
    metrics: dict[str, dict]  # metric -> stats.summary
    output_tokens: dict  # stats.summary of output tokens per successful request
    notes: list[str] = field(default_factory=list)


def failure_reason(record: RequestRecord) -> str:
    reason = (record.error or "").strip().splitlines()[0] if record.error else ""
    if record.status and record.status != 200:
        return f"HTTP {record.status}: {reason}" if reason else f"HTTP {record.status}"
    return reason or ("no response" if not record.status else "failed (no reason recorded)")


def samples(records: list[RequestRecord], metric: str) -> list[float]:
    """Raw samples of one metric over successful requests (ITL pools every gap)."""
    ok = [r for r in records if r.ok]
    if metric == "itl_s":
        return [g for r in ok for g in (r.itl_s or []) if g is not None]
    if metric == "tpot_s":
        return [v for v in (tpot(r) for r in ok) if v is not None]
    return [getattr(r, metric) for r in ok if getattr(r, metric) is not None]


def build(run: Run) -> list[LatencyGroup]:
    groups: list[LatencyGroup] = []
    for instance in run.engines:
        records = run.requests_of(instance)
        for scenario in dict.fromkeys(r.scenario for r in records):
            recs = [r for r in records if r.scenario == scenario]
            ok = [r for r in recs if r.ok]
            failures = Counter(failure_reason(r) for r in recs if not r.ok)
            notes = []
            if any(r.tokens_source == "chunks" for r in ok):
                notes.append("some output token counts come from counting chunks (fallback)")
            groups.append(
                LatencyGroup(
                    instance=instance,
                    engine=recs[0].engine,
                    scenario=scenario,
                    requests=len(recs),
                    ok=len(ok),
                    failures=dict(failures.most_common()),
                    metrics={m: stats.summary(samples(recs, m)) for m in METRICS},
                    output_tokens=stats.summary([r.output_tokens for r in ok if r.output_tokens is not None]),
                    notes=notes,
                )
            )
    return groups


def to_json(groups: list[LatencyGroup]) -> list[dict]:
    return [asdict(g) for g in groups]
