"""The reference page's comparison table: per engine and mode, requests, wall time, aggregate tokens/s and the scaling factor."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

from servescope.contracts.runfolder import PhaseRecord, base_phase
from servescope.judgements import stats
from servescope.judgements.scaling import BURST, SEQUENTIAL, scaling_factor
from servescope.report import noise, query
from servescope.report.load import Run
from servescope.text import numbers, words

# The reference page reads 3.13x for a burst of 3 as "strongly sub-linear (batching overlap visible)" and 1.10x
# as "near-linear (little/no overlap benefit)". A burst of N can at best be N times faster than the
# same N requests one after another, so the thresholds scale with N.
NEAR_LINEAR_MAX = 1.3
STRONG_FRACTION_OF_N = 0.5
STRONG_MIN = 1.5
READING_RULE = (
    f"scaling factor = matched-set sequential wall / burst wall, only when both phases used the same prompt set "
    f"(sha256) and the same max_tokens (the reference experiment's matched-set rule). Reading for a burst of N: "
    f"factor >= max({STRONG_FRACTION_OF_N:g} x N, {STRONG_MIN:g}) -> strongly sub-linear (batching overlap visible); "
    f"factor <= {NEAR_LINEAR_MAX:g} -> near-linear (requests handled one at a time); in between -> partial overlap. "
    f"Over repetitions: the median of the per-repetition factors; its 95% CI widened by the host noise each pair "
    f"measured (docs/trust.md); a reading only when the whole CI lies on one side of every bound, else undecided; "
    f"on a busy host, undecided too when the walls read one end and the burst's own generation overlap (its requests "
    f"generating at once, measured inside the burst) reads the other."
)
# Per-request times listed per phase: the reference page's table lists 3; a burst of 1,024 would not read.
MAX_CELLS = 64


@dataclass
class RequestCell:
    """One request of a table row: its status and E2E, or why it failed."""

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
class Repetition:
    """One pass of a phase: its own wall time and factor, and whether the table may use them."""

    repetition: int
    attempt: int
    phase: str  # the recorded name ("burst-1#2")
    wall_s: float
    host: str  # the host's noise while it ran (hostnoise.describe)
    flags: list[str] = field(default_factory=list)  # why its own numbers are not trusted (outlier requests)
    superseded: bool = False  # a retry of the same repetition replaced it
    scaling_factor: float | None = None  # this repetition's matched-set sequential wall / this burst's wall
    matched_phase: str | None = None
    matched_wall_s: float | None = None
    partner_flags: list[str] = field(default_factory=list)  # why its matched sequential pass is not trusted
    noisy: list[str] = field(
        default_factory=list
    )  # the host noise rule's findings while it ran (carried, not left out)
    slowdown: float | None = None  # hostnoise.slowdown_bound of this phase
    partner_noisy: list[str] = field(default_factory=list)
    partner_slowdown: float | None = None
    noise_explains: str | None = None  # why this pair's noise could explain the reading claimed: left out of the factor
    overlap: float | None = None  # a burst's requests generating at once, on average (generation_overlap)

    @property
    def wall_used(self) -> bool:
        return not self.flags and not self.superseded

    @property
    def factor_used(self) -> bool:
        return self.pairable and not self.noise_explains

    @property
    def pairable(self) -> bool:
        """A factor that may enter the estimate: neither side flagged or superseded (its noise judged after)."""
        return self.wall_used and not self.partner_flags and self.scaling_factor is not None

    @property
    def band(self) -> tuple[float, float] | None:
        """The factor's range under the noise each side measured: alike on both sides cancels in the ratio, what one
        side saw more shifts it by at most the ratio of the two slowdown bounds (hostnoise.slowdown_bound)."""
        if self.scaling_factor is None:
            return None
        shift = (self.slowdown or 1.0) / (self.partner_slowdown or 1.0)
        return self.scaling_factor * min(1.0, shift), self.scaling_factor * max(1.0, shift)

    @property
    def left_out(self) -> str | None:
        """Why (some of) its numbers are not in the row's medians; None when they all are."""
        if self.superseded:
            return "superseded by a retry"
        if self.flags:
            return "; ".join(self.flags)
        if self.partner_flags:
            return f"its matched {self.matched_phase} was flagged: {'; '.join(self.partner_flags)}"
        if self.noise_explains:
            return self.noise_explains
        return None


@dataclass
class TableRow:
    """One row of the comparison table: an engine's phase across repetitions, its wall time and scaling factor."""

    instance: str
    engine: str
    title: str
    phase: str  # the phase across repetitions ("burst-1")
    scenario: str
    mode: str
    prompt_set: str
    prompt_set_sha256: str
    max_tokens: int
    concurrency: int
    wall_s: float  # median over the repetitions it may use (all of them when none may: then `trusted` is False)
    requests: list[RequestCell]  # the repetition whose wall is closest to that median
    n_ok: int
    n_failed: int
    output_tokens: int
    tokens_per_s: float | None
    notes: list[str] = field(default_factory=list)
    matched_phase: str | None = None
    matched_wall_s: float | None = None  # median over the pairs used
    scaling_factor: float | None = None  # median of the per-repetition factors used
    scaling_ci: tuple[float | None, float | None] = (None, None)  # bootstrap 95% CI over those repetitions
    wall_ci: tuple[float | None, float | None] = (None, None)
    reading: str | None = None
    refusal: str | None = None  # why no scaling factor was computed for this burst
    undecided: str | None = None  # the CI straddles a reading's bound: which, and what would settle it
    more_repetitions: int | None = None  # about how many more repetitions on this host would settle it (derived)
    busy: str | None = None  # the host noise the factor carries, one clause; None on a quiet host
    overlap: float | None = None  # median over the burst's repetitions of generation_overlap
    repetitions: list[Repetition] = field(default_factory=list)
    trusted: bool = True  # at least one repetition was neither flagged nor superseded
    recorded: int = 0  # requests recorded for the phase (requests lists at most MAX_CELLS of them)

    @property
    def left_out(self) -> list[Repetition]:
        """Repetitions flagged (or paired with a flagged one), retries' superseded attempts aside."""
        return [r for r in self.repetitions if r.left_out and not r.superseded]


STRONG = "strongly sub-linear (batching overlap visible)"
NEAR_LINEAR = "near-linear (little/no overlap benefit: requests handled one at a time)"
PARTIAL = "partially sub-linear (some overlap)"


def strong_bound(burst_size: int) -> float:
    return max(STRONG_FRACTION_OF_N * burst_size, STRONG_MIN)


def reading(factor: float, burst_size: int) -> str:
    if factor >= strong_bound(burst_size):
        return STRONG
    if factor <= NEAR_LINEAR_MAX:
        return NEAR_LINEAR
    return PARTIAL


def _short(text: str) -> str:
    return text.split(" (")[0]


@dataclass
class Estimate:
    """A burst's scaling factor over its repetitions, the host noise carried: what the table, Summary and run read."""

    factor: float
    ci: tuple[float | None, float | None]
    reading: str | None  # None: the CI straddles a bound
    undecided: str | None = None
    more_repetitions: int | None = None


def estimate(pairs: list[Repetition], burst_size: int) -> Estimate:
    """The median of the pairs' factors, its bootstrap CI widened by each pair's noise band, and the reading the
    whole CI supports (docs/trust.md). Every pair given is used: which to leave out is decide_pairs'."""
    middle = statistics.median(r.scaling_factor for r in pairs)
    bands = [r.band for r in pairs]
    if len(pairs) > 1:
        lo = stats.bootstrap_median_ci([b[0] for b in bands])[1]
        hi = stats.bootstrap_median_ci([b[1] for b in bands])[2]
    else:
        lo, hi = bands[0]
    ci = (lo, hi) if len(pairs) > 1 or lo < hi else (None, None)
    low_reading, high_reading = reading(lo, burst_size), reading(hi, burst_size)
    if low_reading == high_reading:
        return Estimate(middle, ci, low_reading)
    bound = NEAR_LINEAR_MAX if low_reading == NEAR_LINEAR else strong_bound(burst_size)
    text = (
        f"undecided: the CI straddles {bound:.2f}x ({_short(low_reading)} below, {_short(reading(bound + 1e-9, burst_size))} "
        f"above)"
    )
    # Derived: a CI's half-width shrinks as 1 / sqrt(repetitions); the side facing the bound must shrink to the distance.
    half = middle - lo if middle >= bound else hi - middle
    distance = abs(middle - bound)
    more = None
    if distance > 0 and half > 0:
        more = max(1, math.ceil(len(pairs) * (half / distance) ** 2) - len(pairs))
    return Estimate(middle, ci, None, text, more)


def generation_overlap(run: Run, phase: PhaseRecord) -> float | None:
    """How many of a burst's requests generated at once, on average: the sum of their generation spans (first token to
    last) over the time from the first first token to the last last token. About 1 when the engine served them one
    after another, about N when it decoded N together. Both terms come from the same seconds of the same phase, so a
    host that slows the whole phase moves neither; the factor's two walls come from different phases, and do."""
    total, first, last = run.con.execute(
        "SELECT sum(e2e_s - ttft_s), min(started_at + ttft_s), max(started_at + e2e_s) FROM requests "
        "WHERE instance = ? AND phase = ? AND ok AND ttft_s IS NOT NULL AND e2e_s IS NOT NULL AND e2e_s >= ttft_s",
        [phase.instance, phase.phase],
    ).fetchone()
    if total is None or first is None or last is None or last <= first:
        return None
    return float(total) / (last - first)


def contradicts(reading_: str, overlap: float | None, burst_size: int) -> str | None:
    """Why the walls' reading cannot stand beside the burst's own generation overlap; None when they agree."""
    if overlap is None:
        return None
    by_overlap = reading(overlap, burst_size)
    if {reading_, by_overlap} != {STRONG, NEAR_LINEAR}:
        return None
    return (
        f"undecided: the walls read {_short(reading_)}, but the burst's requests generated {overlap:.2f} at a time "
        f"(measured inside the burst, which a host slowing the whole phase does not move): the walls were disturbed"
    )


def decide_pairs(pairs: list[Repetition], burst_size: int) -> None:
    """Leave out of the factor a pair only when its noise could explain the reading claimed: the host noise rule
    flagged one of its sides and its noise band reaches past a bound of the reading all pairs together give."""
    claimed = reading(statistics.median(r.scaling_factor for r in pairs), burst_size)
    for r in pairs:
        lo, hi = r.band
        if (r.noisy or r.partner_noisy) and {reading(lo, burst_size), reading(hi, burst_size)} != {claimed}:
            why = "; ".join(r.noisy + r.partner_noisy)
            r.noise_explains = (
                f"its noise could explain the reading ({lo:.2f}x-{hi:.2f}x under the noise it measured, claimed "
                f"{_short(claimed)}): {why}"
            )
    if all(r.noise_explains for r in pairs):  # nothing left: every pair's estimate is shown, undecided
        for r in pairs:
            r.noise_explains = None


def busy_text(pairs: list[Repetition]) -> str | None:
    """The host noise a factor carries: how many of its phases were measured on a busy host, and how much."""
    noisy = [(r.slowdown, r.noisy) for r in pairs if r.noisy] + [
        (r.partner_slowdown, r.partner_noisy) for r in pairs if r.partner_noisy
    ]
    if not noisy:
        return None
    worst = max((b for b, _ in noisy if b is not None), default=None)
    bound = f", each up to x{worst:.2f} slower by the CPU others took" if worst else ""
    return (
        f"{len(noisy)} of {2 * len(pairs)} phases measured on a busy host{bound} (e.g. {noisy[0][1][0]}); "
        f"the CI carries it (NOISE_FOREIGN_CPU_CORES / NOISE_GROUP_CPU_CORES say which phase is noisy)"
    )


def is_sequential(phase: PhaseRecord) -> bool:
    return phase.scenario == SEQUENTIAL


def is_burst(phase: PhaseRecord) -> bool:
    return phase.scenario == BURST


def build(run: Run, assessment: noise.Assessment | None = None) -> list[TableRow]:
    """One row per sequential or burst phase over its repetitions, engines in manifest order, phases in time order."""
    assessment = assessment or noise.assess(run)
    rows: list[TableRow] = []
    for instance, info in run.engines.items():
        phases = [p for p in run.phases_of(instance) if is_sequential(p) or is_burst(p)]
        current = [p for p in phases if not assessment.of(p.instance, p.phase).superseded]
        seq = [p for p in current if is_sequential(p)]
        pairs = {b.phase: scaling_factor(b, seq) for b in current if is_burst(b)}
        matched_names = {base_phase(partner.phase) for _, partner, _ in pairs.values() if partner is not None}
        groups: dict[str, list[PhaseRecord]] = {}
        for p in phases:
            groups.setdefault(base_phase(p.phase), []).append(p)
        for base, records in groups.items():
            row = _aggregate(run, info.title, base, records, assessment, pairs)
            if is_sequential(records[0]):
                label = "matched set" if base in matched_names else f"{_count(records[0], row)} prompts"
                row.mode = f"sequential ({records[0].prompt_set or 'prompts'}, {label})"
            else:
                row.mode = f"burst ({records[0].concurrency} concurrent)"
            rows.append(row)
    return rows


def _aggregate(
    run: Run,
    title: str,
    base: str,
    records: list[PhaseRecord],
    assessment: noise.Assessment,
    pairs: dict[str, tuple[float | None, PhaseRecord | None, str | None]],
) -> TableRow:
    """The repetitions of one phase folded into one row: medians and CIs over what may be used, the rest listed."""
    by_name = {p.phase: p for p in records}
    reps = []
    for p in sorted(records, key=lambda p: (p.repetition, p.attempt)):
        trust = assessment.of(p.instance, p.phase)
        rep = Repetition(p.repetition, p.attempt, p.phase, p.wall_s, trust.host, trust.flags, trust.superseded)
        rep.noisy, rep.slowdown = trust.noisy, trust.slowdown
        factor, partner, _ = pairs.get(p.phase, (None, None, None))
        if partner is not None:
            rep.scaling_factor, rep.matched_phase, rep.matched_wall_s = factor, partner.phase, partner.wall_s
            other = assessment.of(partner.instance, partner.phase)
            rep.partner_flags, rep.partner_noisy, rep.partner_slowdown = other.flags, other.noisy, other.slowdown
        if is_burst(p) and not trust.superseded:
            rep.overlap = generation_overlap(run, p)
        reps.append(rep)
    current = [r for r in reps if not r.superseded]
    used = [r for r in current if r.wall_used] or current  # none usable: show them all, untrusted
    per_rep = {r.phase: _row(run, title, by_name[r.phase]) for r in used}
    middle, lo, hi = stats.bootstrap_median_ci([r.wall_s for r in used])
    shown = min(used, key=lambda r: abs(r.wall_s - middle))
    row = per_rep[shown.phase]
    row.phase, row.wall_s, row.repetitions = base, middle, reps
    row.trusted = any(r.wall_used for r in current)
    if len(used) > 1:
        row.wall_ci = (lo, hi)
        rates = [x.tokens_per_s for x in per_rep.values() if x.tokens_per_s is not None]
        row.tokens_per_s = statistics.median(rates) if rates else None
        row.notes.insert(0, f"per-request times from {shown.phase}, the repetition nearest the median wall")
    if not is_burst(by_name[shown.phase]):
        return row
    candidates = [r for r in current if r.pairable]
    if candidates:
        decide_pairs(candidates, row.concurrency)
        paired = [r for r in candidates if r.factor_used]
        est = estimate(paired, row.concurrency)
        overlaps = [r.overlap for r in current if r.wall_used and r.overlap is not None]
        row.overlap = statistics.median(overlaps) if overlaps else None
        row.busy = busy_text(paired)
        # On a busy host only: there the walls of two phases can be disturbed apart; on a quiet one they are the measure.
        disagree = contradicts(est.reading, row.overlap, row.concurrency) if est.reading and row.busy else None
        if disagree:
            est.reading, est.undecided, est.more_repetitions = None, disagree, None
        row.scaling_factor, row.scaling_ci = est.factor, est.ci
        row.reading = est.reading or est.undecided
        row.undecided, row.more_repetitions = est.undecided, est.more_repetitions
        row.matched_phase = base_phase(paired[0].matched_phase)
        row.matched_wall_s = statistics.median(r.matched_wall_s for r in paired)
        return row
    refusals = [pairs[r.phase][2] for r in current if pairs.get(r.phase, (None, None, None))[2]]
    flagged = [r for r in current if r.left_out]
    if refusals:
        row.refusal = refusals[0]
    elif flagged:
        row.refusal = (
            f"refused: every repetition of {base} is left out ({', '.join(r.phase for r in flagged)}): rerun them"
        )
    return row


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
        notes.append(f"{words.count(missing, 'successful request')} without a token count (not in tokens/s)")
    if chunked:
        notes.append(f"{words.count(chunked, 'token count')} from counting chunks (fallback)")
    failed = n - n_ok
    if failed:
        notes.append(f"{failed} of {n} failed")
    if phase.requests and phase.requests != n:
        notes.append(f"phase says {words.count(phase.requests, 'request')}, {n} recorded")
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


def _pairs(row: TableRow) -> list[Repetition]:
    return [r for r in row.repetitions if r.factor_used]


def ci_text(ci: tuple[float | None, float | None], unit: str) -> str:
    lo, hi = ci
    return f" [95% CI {numbers.fixed(lo)}{unit}-{numbers.fixed(hi)}{unit}]" if lo is not None and hi is not None else ""


def scaling_text(row: TableRow) -> str:
    """The reference page's arithmetic for one pair (a / b = factor); over repetitions, their median with its CI."""
    if row.scaling_factor is None:
        return ""
    pairs = _pairs(row)
    if len(pairs) == 1:
        return f"{pairs[0].matched_wall_s:.3f}s / {pairs[0].wall_s:.3f}s = {row.scaling_factor:.2f}x"
    return (
        f"median of {len(pairs)} repetitions {row.scaling_factor:.2f}x{ci_text(row.scaling_ci, 'x')} "
        f"(walls {row.matched_wall_s:.3f}s / {row.wall_s:.3f}s)"
    )


def wall_text(row: TableRow) -> str:
    current = [r for r in row.repetitions if not r.superseded]
    used = [r for r in current if r.wall_used]
    if len(current) <= 1:
        return f"{row.wall_s:.3f}s" + ("" if row.trusted else " (flagged)")
    if not used:
        return f"{row.wall_s:.3f}s (median of {len(current)}, all flagged)"
    return f"{row.wall_s:.3f}s (median of {len(used)}/{len(current)}){ci_text(row.wall_ci, 's')}"


def flags_text(row: TableRow) -> str:
    """What the row leaves out and why, with the phases to rerun."""
    out = [f"{r.phase} left out: {r.left_out}" for r in row.left_out]
    return "; ".join(out)


def notes_text(row: TableRow) -> str:
    parts = []
    if row.scaling_factor is not None:
        parts.append(f"{row.reading}; matched set: {row.matched_phase}")
    if row.refusal:
        parts.append(row.refusal)
    if row.busy:
        parts.append(row.busy)
    if row.left_out:
        parts.append(flags_text(row))
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
    return [row.title, row.mode, requests_text(row), wall_text(row), tps, scaling_text(row), notes_text(row)]


def _main_table(rows: list[TableRow]) -> list[str]:
    heads = ["Engine", "Mode", "Wall", "tok/s", "Scaling", "Reading"]
    body = []
    for row in rows:
        tps = f"{row.tokens_per_s:.1f}" if row.tokens_per_s is not None else "n/a"
        scaling = (
            f"{row.scaling_factor:.2f}x{ci_text(row.scaling_ci, 'x')}"
            if row.scaling_factor is not None
            else ("refused" if row.refusal else "")
        )
        read = row.reading or (row.refusal or "")
        if row.n_failed:
            read = f"{read}{'; ' if read else ''}{row.n_failed} failed"
        flagged = len(row.left_out)
        if flagged and not row.refusal:
            read = f"{read}{'; ' if read else ''}FLAGGED: {words.count(flagged, 'repetition')} left out (see below)"
        body.append([row.title, row.mode, wall_text(row), tps, scaling, read])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(heads[:-1])]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    return [fmt.format(*heads), fmt.format(*("-" * w for w in widths), "-" * 7), *(fmt.format(*b) for b in body)]


def _scaling_lines(rows: list[TableRow]) -> list[str]:
    lines = []
    factors = [r for r in rows if r.scaling_factor is not None or (r.refusal and r.left_out)]
    if factors:
        lines.append("Scaling factor (matched-set sequential -> burst):")
        for row in factors:
            if row.scaling_factor is not None:
                lines.append(f"  {row.title}: {scaling_text(row)} -- {row.reading}")
            else:
                lines.append(f"  {row.title}: {row.refusal}")
        for title, summary in repeated_bursts(rows).items():
            lines.append(f"  {title}: {summary}")
    return lines


def _flag_lines(rows: list[TableRow]) -> list[str]:
    flagged = [(row, r) for row in rows for r in row.left_out]
    if not flagged:
        return []
    lines = ["Left out (not in the medians, factors or verdict):"]
    lines += [f"  {row.title} {r.phase}: {r.left_out}" for row, r in flagged]
    return lines


def render_text(rows: list[TableRow], run_id: str) -> str:
    """The table for a terminal: one line per phase, the per-request and per-repetition times, factors, flags."""
    if not rows:
        return f"run {run_id}: no sequential or burst phases recorded (nothing for the sequential-vs-burst table)\n"
    lines = [f"servescope: the sequential-vs-burst table (run {run_id})", *_main_table(rows), ""]
    lines.append("Per request (status time), in arrival order:")
    for row in rows:
        lines.append(f"  {row.title} {row.mode}: {requests_text(row)} -> wall {row.wall_s:.3f}s")
    if any(len(row.repetitions) > 1 for row in rows):
        lines.append("Per repetition (wall; host noise while it ran):")
        for row in rows:
            for r in row.repetitions:
                factor = f", {r.scaling_factor:.2f}x" if r.scaling_factor is not None else ""
                mark = f" -- LEFT OUT: {r.left_out}" if r.left_out else ""
                lines.append(f"  {row.title} {r.phase}: {r.wall_s:.3f}s{factor}; {r.host}{mark}")
    lines += _scaling_lines(rows)
    lines += _flag_lines(rows)
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
