"""The seed's comparison table: per engine and mode, requests, wall time, aggregate tokens/s and the scaling factor."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from report.load import Run
from servescope.runfolder import PhaseRecord, RequestRecord
from servescope.scaling import BURST, SEQUENTIAL, scaling_factor

# The seed reads 3.13x for a burst of 3 as "strongly sub-linear (batching overlap visible)" and 1.10x
# as "near-linear (little/no overlap benefit)". A burst of N can at best be N times faster than the
# same N requests one after another, so the thresholds scale with N.
NEAR_LINEAR_MAX = 1.3
STRONG_FRACTION_OF_N = 0.5
STRONG_MIN = 1.5
READING_RULE = (
    f"scaling factor = matched-set sequential wall / burst wall, only when both phases used the same prompt set "
    f"(sha256) and the same max_tokens (the seed's matched-set rule). Reading for a burst of N: "
    f"factor >= max({STRONG_FRACTION_OF_N:g} x N, {STRONG_MIN:g}) -> strongly sub-linear (batching overlap visible); "
    f"factor <= {NEAR_LINEAR_MAX:g} -> near-linear (requests handled one at a time); in between -> partial overlap."
)


@dataclass
class RequestCell:
    prompt_id: str
    status: int
    ok: bool
    e2e_s: float | None
    error: str | None
    arrival_index: int | None

    def text(self) -> str:
        if self.ok:
            return f"{self.status} {self.e2e_s:.3f}s" if self.e2e_s is not None else f"{self.status} ?"
        status = self.status or "ERR"
        return f"{status} FAILED ({self.error or 'no reason recorded'})"


@dataclass
class TableRow:
    instance: str
    engine: str
    title: str
    phase: str
    scenario: str
    mode: str
    prompt_set: str
    prompt_set_sha256: str
    max_tokens: int
    concurrency: int
    wall_s: float
    requests: list[RequestCell]
    n_ok: int
    n_failed: int
    output_tokens: int
    tokens_per_s: float | None
    notes: list[str] = field(default_factory=list)
    matched_phase: str | None = None
    matched_wall_s: float | None = None
    scaling_factor: float | None = None
    reading: str | None = None
    refusal: str | None = None  # why no scaling factor was computed for this burst


def reading(factor: float, burst_size: int) -> str:
    strong = max(STRONG_FRACTION_OF_N * burst_size, STRONG_MIN)
    if factor >= strong:
        return "strongly sub-linear (batching overlap visible)"
    if factor <= NEAR_LINEAR_MAX:
        return "near-linear (little/no overlap benefit: requests handled one at a time)"
    return "partially sub-linear (some overlap)"


def is_sequential(phase: PhaseRecord) -> bool:
    return phase.scenario == SEQUENTIAL


def is_burst(phase: PhaseRecord) -> bool:
    return phase.scenario == BURST


def build(run: Run) -> list[TableRow]:
    """One row per sequential or burst phase, engines in manifest order, phases in time order."""
    rows: list[TableRow] = []
    for instance, info in run.engines.items():
        phases = [p for p in run.phases_of(instance) if is_sequential(p) or is_burst(p)]
        seq = [p for p in phases if is_sequential(p)]
        factors: dict[str, tuple[float | None, PhaseRecord | None, str | None]] = {
            burst.phase: scaling_factor(burst, seq) for burst in phases if is_burst(burst)
        }
        matched_names = {partner.phase for _, partner, _ in factors.values() if partner is not None}
        for phase in phases:
            row = _row(run, info.title, phase, run.requests_of(instance, phase.phase))
            if is_sequential(phase):
                label = "matched set" if phase.phase in matched_names else f"{_count(phase, row)} prompts"
                row.mode = f"sequential ({phase.prompt_set or 'prompts'}, {label})"
            else:
                row.mode = f"burst ({phase.concurrency} concurrent)"
                factor, partner, row.refusal = factors[phase.phase]
                if factor is not None:
                    row.matched_phase, row.matched_wall_s = partner.phase, partner.wall_s
                    row.scaling_factor = factor
                    row.reading = reading(factor, phase.concurrency)
            rows.append(row)
    return rows


def _row(run: Run, title: str, phase: PhaseRecord, records: list[RequestRecord]) -> TableRow:
    order = sorted(records, key=lambda r: (r.arrival_index if r.arrival_index is not None else 1 << 30, r.started_at))
    cells = [RequestCell(r.prompt_id, r.status, r.ok, r.e2e_s, r.error, r.arrival_index) for r in order]
    ok = [r for r in records if r.ok]
    tokens = sum(r.output_tokens or 0 for r in ok)
    notes = []
    wall = phase.wall_s
    missing = sum(1 for r in ok if r.output_tokens is None)
    if missing:
        notes.append(f"{missing} successful request(s) without a token count (not in tokens/s)")
    chunked = sum(1 for r in ok if r.tokens_source == "chunks")
    if chunked:
        notes.append(f"{chunked} token count(s) from counting chunks (fallback)")
    failed = len(records) - len(ok)
    if failed:
        notes.append(f"{failed} of {len(records)} failed")
    if phase.requests and phase.requests != len(records):
        notes.append(f"phase says {phase.requests} requests, {len(records)} recorded")
    return TableRow(
        instance=phase.instance,
        engine=phase.engine,
        title=title,
        phase=phase.phase,
        scenario=phase.scenario,
        mode=phase.scenario,
        prompt_set=phase.prompt_set,
        prompt_set_sha256=phase.prompt_set_sha256,
        max_tokens=phase.max_tokens,
        concurrency=phase.concurrency,
        wall_s=wall,
        requests=cells,
        n_ok=len(ok),
        n_failed=failed,
        output_tokens=tokens,
        tokens_per_s=(tokens / wall) if wall > 0 else None,
        notes=notes,
    )


def _count(phase: PhaseRecord, row: TableRow) -> int:
    return len(row.requests) or phase.requests


def requests_text(row: TableRow) -> str:
    return " / ".join(c.text() for c in row.requests) or "no requests recorded"


def scaling_text(row: TableRow) -> str:
    if row.scaling_factor is not None:
        return f"{row.matched_wall_s:.3f}s / {row.wall_s:.3f}s = {row.scaling_factor:.2f}x"
    return ""


def notes_text(row: TableRow) -> str:
    parts = []
    if row.scaling_factor is not None:
        parts.append(f"{row.reading}; matched set: {row.matched_phase}")
    if row.refusal:
        parts.append(row.refusal)
    return "; ".join(parts + row.notes)


HEADERS = [
    "Engine",
    "Mode",
    "Per request (status time)",
    "Wall time",
    "tokens/s (aggregate)",
    "Scaling factor",
    "Notes",
]


def cells(row: TableRow) -> list[str]:
    tps = f"{row.tokens_per_s:.1f}" if row.tokens_per_s is not None else "n/a"
    return [row.title, row.mode, requests_text(row), f"{row.wall_s:.3f}s", tps, scaling_text(row), notes_text(row)]


def render_text(rows: list[TableRow], run_id: str) -> str:
    """The table for a terminal: one line per phase, then the per-request times like the seed's results file."""
    if not rows:
        return f"run {run_id}: no sequential or burst phases recorded (nothing for the seed's table)\n"
    heads = ["Engine", "Mode", "Wall", "tok/s", "Scaling", "Reading"]
    body = []
    for row in rows:
        tps = f"{row.tokens_per_s:.1f}" if row.tokens_per_s is not None else "n/a"
        scaling = f"{row.scaling_factor:.2f}x" if row.scaling_factor is not None else ("refused" if row.refusal else "")
        read = row.reading or (row.refusal or "")
        if row.n_failed:
            read = f"{read}{'; ' if read else ''}{row.n_failed} failed"
        body.append([row.title, row.mode, f"{row.wall_s:.3f}s", tps, scaling, read])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(heads[:-1])]
    lines = [f"servescope: the seed's comparison table (run {run_id})"]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    lines.append(fmt.format(*heads))
    lines.append(fmt.format(*("-" * w for w in widths), "-" * 7))
    lines += [fmt.format(*b) for b in body]
    lines.append("")
    lines.append("Per request (status time), in arrival order:")
    for row in rows:
        lines.append(f"  {row.title} {row.mode}: {requests_text(row)} -> wall {row.wall_s:.3f}s")
    factors = [r for r in rows if r.scaling_factor is not None]
    if factors:
        lines.append("Scaling factor (matched-set sequential -> burst):")
        for row in factors:
            lines.append(f"  {row.title}: {scaling_text(row)} -- {row.reading}")
        for title, summary in repeated_bursts(rows).items():
            lines.append(f"  {title}: {summary}")
    return "\n".join(lines) + "\n"


def repeated_bursts(rows: list[TableRow]) -> dict[str, str]:
    """Engines with several bursts: the median factor, since one burst's ratio varies with generation length."""
    out = {}
    for title in dict.fromkeys(r.title for r in rows):
        factors = sorted(r.scaling_factor for r in rows if r.title == title and r.scaling_factor is not None)
        if len(factors) > 1:
            mid = statistics.median(factors)
            size = max(r.concurrency for r in rows if r.title == title and r.scaling_factor is not None)
            out[title] = (
                f"median over {len(factors)} bursts {mid:.2f}x (range {factors[0]:.2f}x-{factors[-1]:.2f}x) "
                f"-- {reading(mid, size)}"
            )
    return out


def to_json(rows: list[TableRow]) -> list[dict]:
    return [asdict(r) for r in rows]
