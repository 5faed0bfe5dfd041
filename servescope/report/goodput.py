"""Goodput under the SLOs per engine and phase (attainment, good requests/s, good tokens/s, the SLO missed most), open-loop honesty, the knee.

The SLOs are the run's own (the --slo / SLO knob it ran with, from its manifest) unless the report is
asked for others (`python -m servescope.report --slo ...`); the rule is servescope/judgements/slo.py's, the one the client
/metrics counters and the knee search use.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from servescope.contracts import runreader
from servescope.contracts.settings import SloKnobs
from servescope.judgements import binding, knee_answer, slo, stats
from servescope.judgements.percentile import numpy_percentile_of
from servescope.report import energy, latency, query, schedule
from servescope.report.load import Run, knee_of
from servescope.report.render import Bullets, Paragraph, Section, Table
from servescope.report.run_slo import is_flag, spec_of_manifest
from servescope.text import numbers, words


@dataclass
class PhaseGoodput:
    """One phase of one engine instance judged against the SLOs, with the machine's energy while it ran."""

    instance: str
    engine: str
    phase: str
    scenario: str
    result: slo.SloResult
    energy: energy.Energy | None = None  # the machine's while the phase ran (servescope/report/energy.py)

    @property
    def joules_per_good_token(self) -> float | None:
        return self.energy.per(self.result.good_tokens) if self.energy else None

    @property
    def joules_per_request(self) -> float | None:
        return self.energy.per(self.result.requests) if self.energy else None


def spec_of(run: Run, override: str | None = None, strict: bool = False, knob: SloKnobs | None = None) -> slo.SloSpec:
    """spec_of_manifest of the run's manifest."""
    return spec_of_manifest(run.manifest, override, strict, knob)


def build(run: Run, spec: slo.SloSpec) -> list[PhaseGoodput]:
    return [
        PhaseGoodput(
            p.instance,
            p.engine,
            p.phase,
            p.scenario,
            evaluate(run, spec, p.instance, p.phase, p.wall_s),
            energy.of_record(p),
        )
        for p in run.phases
    ]


# servescope/judgements/slo.py's rule, asked of the engine: a phase's requests are never Python objects here (a soak's phase
# is half a million of them). tests/servescope/report/test_goodput.py holds the two to the same results.
LAG = schedule.LAG


def term_value(term: slo.Term, i: int) -> str:
    """SQL: slo.Term.request_value (NULL where the term does not apply); an ITL percentile term: whether it is met
    (from c<i>, its count of gaps at or under the limit, and u<i>, its value where that count does not decide it:
    _values)."""
    if term.metric == "itl":
        return "itl_s_max" if term.percentile is None else _itl_percentile_meets(term, f"c{i}", f"u{i}")
    if term.metric == "tpot":
        return latency.TPOT_SQL
    return f"({'ttft_s' if term.metric == 'ttft' else 'e2e_s'} + {LAG})"


def _gaps_within(term: slo.Term, limits: tuple[float, ...]) -> str:
    """SQL: how many of a request's gaps are at or under the term's limit: counted when the run was read (limits:
    the reader's), else one pass over each list."""
    if term.limit_s in limits:
        return runreader.within("itl_s", limits.index(term.limit_s))
    return f"len(list_filter(itl_s, lambda g: g <= {term.limit_s!r}::DOUBLE))"


def _itl_percentile_meets(term: slo.Term, c: str, undecided: str) -> str:
    """SQL: np.percentile(itl_s, Q) <= limit, bit for bit, without sorting the list (a sort per request was most of
    the report's time on a long run): with c gaps at or under the limit and the percentile between the sorted
    list's ranks lo and lo + 1, it holds when c > lo + 1, fails when c <= lo, and when c == lo + 1 (_undecided) it
    is `undecided`, the value _itl_percentile_looked_up finds in the list."""
    n = "itl_s_n"
    h, lo = _rank(term)
    return (
        f"CASE WHEN {n} = 0 THEN NULL WHEN {h} >= {n} - 1 THEN {c} = {n} WHEN {_undecided(term, c)} THEN {undecided} "
        f"ELSE {c} >= {lo} + 2 END"
    )


def _rank(term: slo.Term) -> tuple[str, str]:
    """SQL: (where the term's percentile falls in a request's sorted gaps, h; the rank below it, lo)."""
    h = f"((itl_s_n - 1) * {term.percentile / 100!r}::DOUBLE)"
    return h, f"floor({h})::BIGINT"


def _undecided(term: slo.Term, c: str) -> str:
    """SQL: the requests whose count of gaps within the limit (c) leaves _itl_percentile_meets to their list."""
    h, lo = _rank(term)
    return f"(itl_s_n > 0 AND {h} < itl_s_n - 1 AND {c} = {lo} + 1)"


def _itl_percentile_looked_up(term: slo.Term) -> str:
    """SQL: for an undecided request, the two gaps around its percentile are the largest at or under the limit and
    the smallest above it, interpolated as numpy does."""
    limit = f"{term.limit_s!r}::DOUBLE"
    h, _ = _rank(term)
    a = f"list_max(list_filter(itl_s, lambda g: g <= {limit}))"
    b = f"list_min(list_filter(itl_s, lambda g: g > {limit}))"
    return f"{stats.numpy_lerp_sql(a, b, f'({h} - floor({h}))')} <= {limit}"


def _meets(term: slo.Term, value: str) -> str:
    """SQL: slo.Term.request_meets on a computed value (none: a miss for TTFT/E2E, nothing to miss for ITL/TPOT)."""
    missing = "TRUE" if term.metric in ("itl", "tpot") else "FALSE"
    if is_flag(term):
        return f"coalesce({value}, {missing})"
    return f"coalesce({value} <= {term.limit_s!r}::DOUBLE, {missing})"


def _values(run: Run, terms, where: str, carry: str = "") -> str:
    """A phase's requests with each term's value computed once (v0, v1, ...), beside c<i>: an ITL percentile term's
    count of gaps within its limit; carry: more of the records' columns to keep ("a, b, ").

    An ITL percentile term's value needs the gap list only where the count leaves it undecided (a request or so in
    a thousand): those requests' lists are looked up by seq (u<i>), so the lists of the others are never read (the
    whole phase's lists were most of the goodput section's time on a long run)."""
    flags = [i for i, t in enumerate(terms) if is_flag(t)]
    counts = "".join(f", {_gaps_within(terms[i], run.db.limits)} AS c{i}" for i in flags)
    inner = f"SELECT *{counts} FROM requests WHERE {where}"
    values = ", ".join(f"{term_value(t, i)} AS v{i}" for i, t in enumerate(terms))
    kept = "".join(f", c{i}" for i in flags)
    if not flags:
        return f"(SELECT {carry}ok, output_tokens, itl_s_n{kept}, {values} FROM ({inner}))"
    undecided = " OR ".join(_undecided(terms[i], f"c{i}") for i in flags)
    looked_up = ", ".join(f"{_itl_percentile_looked_up(terms[i])} AS u{i}" for i in flags)
    return (
        f"(WITH phase AS NOT MATERIALIZED ({inner}), "
        f"lists AS (SELECT seq, {looked_up} FROM requests WHERE seq IN (SELECT seq FROM phase WHERE {undecided})) "
        f"SELECT {carry}ok, output_tokens, itl_s_n{kept}, {values} FROM phase LEFT JOIN lists USING (seq))"
    )


def _good(terms) -> str:
    """SQL: a request is good when it succeeded and met every term on its own (slo.SloSpec.good)."""
    return " AND ".join(["ok", *(_meets(t, f"v{i}") for i, t in enumerate(terms))])


def request_outcomes(run: Run, spec: slo.SloSpec, where: str, params: list) -> dict[str, np.ndarray]:
    """Per request of the selection, in the report's order: good (1 or 0: evaluate's rule, request by request), ok,
    finished_at (slo.finished_at: send + E2E), e2e_s (NaN without one) and output_tokens (0 without)."""
    carry = "seq, started_at + coalesce(e2e_s, 0.0) AS finished_at, e2e_s, "
    rows = run.con.execute(
        f"SELECT ({_good(spec.terms)})::DOUBLE AS good, ok::DOUBLE AS ok, finished_at, e2e_s::DOUBLE AS e2e_s, "
        f"coalesce(output_tokens, 0)::DOUBLE AS output_tokens FROM {_values(run, spec.terms, where, carry)} "
        f"ORDER BY {query.ORDER}",
        params,
    ).fetchnumpy()
    out = {}
    for k, v in rows.items():
        out[k] = np.asarray(query.plain(v), dtype=float)
    return out


def evaluate(run: Run, spec: slo.SloSpec, instance: str, phase: str, wall_s: float) -> slo.SloResult:
    """slo.evaluate over one phase's records, computed where they are."""
    where, params = "instance = ? AND phase = ?", [instance, phase]
    terms = spec.terms
    meets = [_meets(t, f"v{i}") for i, t in enumerate(terms)]
    per_request = [m for t, m in zip(terms, meets, strict=True) if t.percentile is None]
    good = _good(terms)
    meeting = " AND ".join(["ok", *per_request])
    row = run.con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE ok), count(*) FILTER (WHERE {good}), "
        f"coalesce(sum(coalesce(output_tokens, 0)) FILTER (WHERE {good}), 0), count(*) FILTER (WHERE {meeting}), "
        + ", ".join(f"count(*) FILTER (WHERE ok AND NOT {m})" for m in meets)
        + ", "
        + ", ".join("NULL" if is_flag(t) else f"max(v{i}) FILTER (WHERE ok)" for i, t in enumerate(terms))
        + ", coalesce(sum(itl_s_n) FILTER (WHERE ok), 0), "
        + ", ".join(f"coalesce(sum(c{i}) FILTER (WHERE ok), 0)" if is_flag(t) else "NULL" for i, t in enumerate(terms))
        + f" FROM {_values(run, terms, where)}",
        params,
    ).fetchone()
    n, ok, n_good, good_tokens, n_meeting = row[:5]
    k = len(terms)
    missed, worst = list(row[5 : 5 + k]), list(row[5 + k : 5 + 2 * k])
    gaps, within = row[5 + 2 * k], list(row[6 + 2 * k :])
    misses: Counter[str] = Counter()
    if ok < n:
        misses[slo.ERRORS] = n - ok
    for t, m in zip(terms, missed, strict=True):
        if m:
            misses[t.name] = m
    results = [
        _term_result(run, t, where, params, n, ok, missed[i], worst[i], spec.objective, (gaps, within[i]))
        for i, t in enumerate(terms)
    ]
    per_request_holds = (n_meeting / n >= spec.objective) if per_request and n else bool(n)
    rate = (lambda x: x / wall_s) if wall_s > 0 else (lambda x: None)
    return slo.SloResult(
        spec=spec.text,
        requests=n,
        ok=ok,
        good=n_good,
        good_tokens=int(good_tokens),
        wall_s=wall_s,
        attainment=n_good / n if n else None,
        goodput_rps=rate(n_good),
        good_tokens_per_s=rate(int(good_tokens)),
        meets=per_request_holds and all(r.holds for t, r in zip(terms, results, strict=True) if t.percentile),
        failed_most=misses.most_common(1)[0][0] if misses else None,
        misses=dict(misses.most_common()),
        terms=results,
    )


def _term_result(
    run: Run,
    term: slo.Term,
    where: str,
    params: list,
    n: int,
    ok: int,
    missed: int,
    worst: float | None,
    objective: float,
    pooled: tuple[int, int | None],
) -> slo.TermResult:
    """slo._term_result: the share meeting the limit and the observed percentile (or the worst value); pooled: the
    successful requests' gaps and, for an ITL percentile term, how many are within its limit."""
    failed = n - ok
    if term.percentile is None:
        share = (ok - missed) / n if n else None
        return slo.TermResult(term.name, share, worst, share is not None and share >= objective, missed)
    if term.metric == "itl":
        # Pooled gaps, as the report pools ITL; a failed request counts as one missed gap.
        gaps, met = pooled
        units = gaps + failed
        pool = _phase_pool(run, where, params) if gaps else None
        if pool is not None:
            lo = math.floor((pool.n - 1) * (term.percentile / 100))
            pool.select([lo, min(lo + 1, pool.n - 1)])
        observed = numpy_percentile_of(pool.n, term.percentile, pool.at) if pool is not None else None
    else:
        values = run.con.execute(
            f"SELECT v0 FROM {_values(run, [term], where)} WHERE ok AND v0 IS NOT NULL", params
        ).fetchnumpy()["v0"]
        values = np.asarray(values, dtype=float)
        units, met = n, ok - missed
        observed = float(np.percentile(values, term.percentile)) if len(values) else None
    share = met / units if units else None
    return slo.TermResult(term.name, share, observed, share is not None and share * 100 >= term.percentile, missed)


def _phase_pool(run: Run, where: str, params: list) -> query.Pool:
    """A phase's successful gaps; the latency section's pool when the phase's requests are its engine's whole
    scenario (the same requests: one pass over the gaps fewer)."""
    instance, phase = params
    scenarios = run.con.execute(f"SELECT DISTINCT scenario FROM requests WHERE {where}", params).fetchall()
    if len(scenarios) == 1:
        (scenario,) = scenarios[0]
        others = run.con.execute(
            f"SELECT count(*) FROM requests WHERE {latency.GROUP} AND phase <> ?", [instance, scenario, phase]
        ).fetchone()[0]
        if not others:
            return latency.pool(run, instance, scenario)
    return query.Pool(run.con, f"ok AND {where}", params)


def floors(run: Run, instance: str, rows: list[PhaseGoodput], spec: slo.SloSpec) -> list[str]:
    """A term that failed at the run's lowest load for this engine is below its floor: one line each, with the value."""
    loads = {p.phase: p.concurrency for p in run.phases_of(instance)}
    lowest = min((loads.get(g.phase, 1) for g in rows), default=None)
    at_lowest = [g for g in rows if loads.get(g.phase, 1) == lowest]
    out = []
    for term in spec.terms:
        failed = [t for g in at_lowest for t in g.result.terms if t.term == term.name and not t.holds]
        if not failed or len(failed) < len(at_lowest):
            continue  # held in some phase at that load: not a floor
        observed = [t.observed for t in failed if t.observed is not None]
        value = f": {min(observed):.3g} s" if observed else ""
        out.append(
            f"{term.name} is below this engine's floor here{value} at {words.load(lowest, 'users')} (the run's lowest "
            "load)"
        )
    return out


def section(
    run: Run, spec: slo.SloSpec, rows: list[PhaseGoodput], checks: list[schedule.ScheduleCheck], title: str
) -> Section:
    sec = Section(title)
    knee = knee_of(run)
    if knee:  # a knee run's answer first, then what it rests on
        sec.add(Paragraph(_knee_text(knee)))
    sec.add(
        Paragraph(
            f"{spec.describe()}. A request is good when it succeeded and met every term on its own; attainment is the "
            f"share of good requests, goodput the good requests (and their output tokens) per second of the phase's "
            f"wall time. A percentile term holds for a phase when that share of its requests (ITL: of its gaps) meet "
            f"the limit, failures counting as misses (servescope/judgements/slo.py)."
        )
    )
    # An objective no load meets here is said once, with the value measured at the run's lowest load, instead of
    # leaving a column of zeros to explain itself.
    below = [
        f"{i}: {line}"
        for i in dict.fromkeys(g.instance for g in rows)
        for line in floors(run, i, [g for g in rows if g.instance == i], spec)
    ]
    if below:
        sec.add(Bullets(below))
    if rows:
        sec.add(
            Table(
                [
                    "engine",
                    "phase",
                    "requests",
                    "attainment",
                    "goodput req/s",
                    "good tok/s",
                    "meets SLOs",
                    "missed most",
                    "J/good token",
                    "J/request",
                ],
                [
                    [
                        g.instance,
                        g.phase,
                        str(g.result.requests),
                        numbers.percent(g.result.attainment),
                        numbers.fixed(g.result.goodput_rps),
                        numbers.fixed(g.result.good_tokens_per_s),
                        "yes" if g.result.meets else "no",
                        g.result.failed_most or "-",
                        _per(g, g.joules_per_good_token),
                        _per(g, g.joules_per_request),
                    ]
                    for g in rows
                ],
            )
        )
        for block in _energy_notes(rows):
            sec.add(block)
    if checks:
        sec.add(Paragraph(f"Open-loop honesty: {schedule.RULE}."))
        sec.add(
            Table(
                [
                    "engine",
                    "phase",
                    "lag p50",
                    "lag p99",
                    "TTFT p99 send",
                    "TTFT p99 schedule",
                    "E2E p99 send",
                    "E2E p99 schedule",
                    "flag",
                ],
                [
                    [
                        c.instance,
                        c.phase,
                        numbers.seconds(c.lag["p50"]),
                        numbers.seconds(c.lag["p99"]),
                        numbers.seconds(c.ttft_from_send["p99"]),
                        numbers.seconds(c.ttft_from_schedule["p99"]),
                        numbers.seconds(c.e2e_from_send["p99"]),
                        numbers.seconds(c.e2e_from_schedule["p99"]),
                        "BEHIND SCHEDULE" if c.behind else "ok",
                    ]
                    for c in checks
                ],
            )
        )
        behind = [c.text() for c in checks if c.behind]
        if behind:
            sec.add(Bullets(behind))
    return sec


def _per(g: PhaseGoodput, value: float | None) -> str:
    if g.energy is None or not g.energy.measured:
        return "not measured"
    # n/a (0): measured, but nothing good (or sent) to share it
    return "n/a (0)" if value is None else numbers.significant(value)


def _energy_notes(rows: list[PhaseGoodput]) -> list[Paragraph | Bullets]:
    """What the energy columns are, and why each phase without them has none (one line per reason)."""
    measured = [g for g in rows if g.energy is not None and g.energy.measured]
    unmeasured = Counter(g.energy.text() if g.energy else "not measured" for g in rows if g not in measured)
    head = (
        "Energy: the machine's own counters while the phase ran (servescope/host/energy.py; all it ran is in them, the "
        "host noise says what else did), divided by the phase's good output tokens and by its requests."
    )
    if not measured:
        if len(unmeasured) == 1:
            return [Paragraph(f"{head} Energy {next(iter(unmeasured))}.")]
        return [
            Paragraph(head),
            Bullets([f"{words.count(n, 'phase')}: energy {why}" for why, n in unmeasured.most_common()]),
        ]
    sources = sorted({s for g in measured for s in g.energy.sources})
    lines = [f"{words.count(len(measured), 'phase')} measured by {', '.join(sources)}"]
    missing = sorted({m.removeprefix("not measured: ") for g in measured for m in g.energy.missing})
    lines += [f"left out of those joules (present, not read): {m}" for m in missing]
    lines += [f"{words.count(n, 'phase')}: energy {why}" for why, n in unmeasured.most_common()]
    return [Paragraph(head), Bullets(lines)]


def _knee_text(knee: dict[str, Any]) -> str:
    def load(value: float) -> str:  # "1 user", "3 users", "0.5 req/s"
        return words.load(value, knee["unit"])

    if knee["status"] == "found" and knee.get("unsettled"):  # the same range as quick, the knee and the Summary
        found = (
            f"the knee is {knee_answer.span(knee)} (failed at {load(knee['first_failing'])}), "
            f"{knee_answer.unsettled_words(knee)}"
        )
    elif knee["status"] == "found":
        found = f"the knee is {load(knee['knee'])} (fails at {load(knee['first_failing'])})"
    elif knee["status"] == "fails at the lowest load":
        found = f"no knee: the SLOs fail even at {load(knee['first_failing'])}"
    elif knee["status"] in binding.STOPPED.values():
        found = f"no knee: {knee.get('note') or knee['status']}"
    elif knee["status"] == "nothing measured":
        found = "nothing was measured"
    else:
        found = f"the SLOs hold up to {load(knee['knee'])}, the highest load tried"
    b = knee["binding"]
    if knee["binding_level"] is None:
        at = ""
    elif knee["first_failing"] is not None:
        at = f"; at {load(knee['binding_level'])} the binding resource is {b['advice']} ({b['evidence']})"
    else:
        at = f"; at {load(knee['binding_level'])}, the highest load tried, {b['evidence']}"
    levels = knee.get("levels") or []
    reuse = [
        f"{load(row['level'])}: {row['reuse']['share']:.0%}"
        + (" (more than the workload asks)" if row["reuse_unasked"] else "")
        for row in levels
        if isinstance(row.get("reuse"), dict) and row["reuse"].get("share") is not None
    ]
    ps = knee.get("prompt_set") or {}
    cache = f" Prefix-cache reuse by level: {', '.join(reuse)}." if reuse else ""
    if ps.get("repeats") and not ps.get("asked_reuse"):
        cache += (
            f" {ps['name']} is a fixed set sent again at every level: repeats may be served from the engine's cache."
        )
    return f"Knee search over {knee['over']} ({len(knee['probes'])} measurements, knee.json): {found}{at}.{cache}"


def to_json(spec: slo.SloSpec, rows: list[PhaseGoodput], checks: list[schedule.ScheduleCheck], run: Run) -> dict:
    return {
        "spec": spec.text,
        "objective": spec.objective,
        "phases": [
            {
                **{k: v for k, v in asdict(g).items() if k not in ("result", "energy")},
                **asdict(g.result),
                "energy_j": g.energy.joules if g.energy else None,
                "energy_reason": g.energy.reason if g.energy else None,
                "joules_per_good_token": g.joules_per_good_token,
                "joules_per_request": g.joules_per_request,
            }
            for g in rows
        ],
        "schedule": schedule.to_json(checks),
        "knee": knee_of(run),
    }
