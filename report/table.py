"""The seed's comparison table: per engine and mode, requests, wall time, aggregate tokens/s and the scaling factor."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from report import query
from report.load import Run
from servescope.runfolder import PhaseRecord

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
SEQUENTIAL, BURST = "sequential", "burst"
MAX_CELLS = 64  # per-request times listed per phase: the seed's table lists 3; a burst of 1,024 would not read


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
    recorded: int = 0  # requests recorded for the phase (requests lists at most MAX_CELLS of them)


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
        matched: dict[str, PhaseRecord | None] = {}
        refusals: dict[str, str] = {}
        for burst in (p for p in phases if is_burst(p)):
            partner, why = match_sequential(burst, seq)
            matched[burst.phase] = partner
            if why:
                refusals[burst.phase] = why
        matched_names = {p.phase for p in matched.values() if p is not None}
        for phase in phases:
            row = _row(run, info.title, phase)
            if is_sequential(phase):
                label = "matched set" if phase.phase in matched_names else f"{_count(phase, row)} prompts"
                row.mode = f"sequential ({phase.prompt_set or 'prompts'}, {label})"
            else:
                row.mode = f"burst ({phase.concurrency} concurrent)"
                partner = matched.get(phase.phase)
                if partner is None:
                    row.refusal = refusals.get(phase.phase)
                elif row.wall_s > 0:
                    row.matched_phase, row.matched_wall_s = partner.phase, partner.wall_s
                    row.scaling_factor = partner.wall_s / row.wall_s
                    row.reading = reading(row.scaling_factor, phase.concurrency)
            rows.append(row)
    return rows


def match_sequential(burst: PhaseRecord, sequential: list[PhaseRecord]) -> tuple[PhaseRecord | None, str | None]:
    """The sequential phase that ran the burst's prompts with the burst's max_tokens, or why there is none."""
    if not sequential:
        return None, "no sequential pass for this engine: no scaling factor (the seed's matched-set rule)"
    same_set = [p for p in sequential if p.prompt_set_sha256 == burst.prompt_set_sha256]
    if not same_set:
        seen = ", ".join(
            sorted({f"{p.prompt_set or '?'} ({p.prompt_set_sha256[:12] or 'no hash'})" for p in sequential})
        )
        return None, (
            f"refused: the burst ran prompt set {burst.prompt_set or '?'} ({burst.prompt_set_sha256[:12] or 'no hash'}) "
            f"but the sequential pass ran {seen}; the seed's matched-set rule needs the same prompts"
        )
    same_len = [p for p in same_set if p.max_tokens == burst.max_tokens]
    if not same_len:
        seen = ", ".join(str(m) for m in sorted({p.max_tokens for p in same_set}))
        return None, (
            f"refused: max_tokens differ (sequential {seen}, burst {burst.max_tokens}); "
            f"the seed's matched-set rule needs the same generation length"
        )
    return min(same_len, key=lambda p: abs(p.started_at - burst.started_at)), None


def _row(run: Run, title: str, phase: PhaseRecord) -> TableRow:
    where, params = "instance = ? AND phase = ?", [phase.instance, phase.phase]
    n, n_ok, tokens, missing, chunked = run.con.execute(
        "SELECT count(*), count(*) FILTER (WHERE ok), coalesce(sum(output_tokens) FILTER (WHERE ok), 0), "
        "count(*) FILTER (WHERE ok AND output_tokens IS NULL), count(*) FILTER (WHERE ok AND tokens_source = 'chunks') "
        f"FROM requests WHERE {where}",
        params,
    ).fetchone()
    # In arrival order within a burst, else as sent; a phase of thousands lists its first MAX_CELLS.
    shown = run.con.execute(
        f"SELECT prompt_id, status, ok, e2e_s, error, arrival_index FROM requests WHERE {where} "
        f"ORDER BY coalesce(arrival_index, {1 << 30}), {query.ORDER} LIMIT {MAX_CELLS}",
        params,
    ).fetchall()
    cells = [RequestCell(*r) for r in shown]
    notes = []
    wall = phase.wall_s
    if n > len(cells):
        notes.append(f"per-request times of the first {len(cells)} of {n} requests shown")
    if missing:
        notes.append(f"{missing} successful request(s) without a token count (not in tokens/s)")
    if chunked:
        notes.append(f"{chunked} token count(s) from counting chunks (fallback)")
    failed = n - n_ok
    if failed:
        notes.append(f"{failed} of {n} failed")
    if phase.requests and phase.requests != n:
        notes.append(f"phase says {phase.requests} requests, {n} recorded")
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
        n_ok=n_ok,
        n_failed=failed,
        output_tokens=int(tokens),
        tokens_per_s=(tokens / wall) if wall > 0 else None,
        notes=notes,
        recorded=n,
    )


def _count(phase: PhaseRecord, row: TableRow) -> int:
    return row.recorded or phase.requests


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
