"""Service level objectives: the one parser of an SLO spec, and attainment and goodput computed from request records.

A spec is comma-separated terms `METRIC[_pQ]<=LIMIT` (LIMIT in seconds, or with an `ms` suffix):

    ttft_p95<=0.5,itl_p95<=100ms,e2e<=10

METRIC is ttft, itl, tpot or e2e (README: what each word means here). A term with `_pQ` is a
percentile objective: it holds for a phase when at least Q% of the phase's requests meet the limit
(ITL: Q% of its gaps, pooled over the requests, as the report pools them); failed requests count as
misses. A term without one judges every request on its own, and the phase holds when at least the
objective share (SLO_ATTAINMENT) of its requests meet every such term.

A request is *good* when it succeeded and meets every term's limit on its own (a request's ITL for
`itl_pQ` is the Q-th percentile of its own gaps, for a plain `itl` its longest gap). Attainment is
the share of good requests, goodput the good requests (and their output tokens) per second of the
phase's wall time (first send -> last finish), the way the report's tokens/s is. When a request
carries the time its schedule said to send it (`scheduled_at`, open-loop runs), TTFT and E2E count
from the schedule: a client that fell behind its schedule must not hide the wait (coordinated omission).

The report, the load generator's client /metrics, the knee search and the tune loop all use this module.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from servescope.contracts import thresholds
from servescope.contracts.runfolder import RequestRecord
from servescope.contracts.settings import SloKnobs
from servescope.judgements.percentile import numpy_percentile

METRICS = ("ttft", "itl", "tpot", "e2e")
SPEC_HELP = "terms METRIC[_pQ]<=SECONDS (ttft, itl, tpot, e2e; e.g. ttft_p95<=0.5,itl_p95<=100ms,e2e<=10)"
_TERM = re.compile(
    r"(?P<metric>[a-z][a-z0-9]*?)(?:_p(?P<q>\d+(?:\.\d+)?))?\s*<=\s*(?P<limit>[0-9a-zA-Z.+-]+?)\s*(?P<unit>ms|s)?"
)
ERRORS = "errors"  # the `failed most` name of requests that failed outright


class SloError(ValueError):
    """A spec or objective that cannot be used: one line saying what is wrong."""


@dataclass(frozen=True)
class Term:
    """One term of an SLO spec: a metric, its limit in seconds and its percentile (None: every request on its own)."""

    metric: str  # ttft, itl, tpot, e2e
    limit_s: float
    percentile: float | None = None  # None: every request on its own

    @property
    def name(self) -> str:
        q = f"_p{self.percentile:g}" if self.percentile is not None else ""
        return f"{self.metric}{q}<={self.limit_s:g}"

    def request_value(self, record: RequestRecord) -> float | None:
        """This request's value for the term (seconds); None where the term does not apply (ITL of one token)."""
        if self.metric == "itl":
            gaps = record.itl_s or []
            if not gaps:
                return None
            return max(gaps) if self.percentile is None else numpy_percentile(gaps, self.percentile)
        if self.metric == "tpot":
            return tpot(record)
        value = record.ttft_s if self.metric == "ttft" else record.e2e_s
        return None if value is None else value + schedule_lag(record)

    def request_meets(self, record: RequestRecord) -> bool:
        value = self.request_value(record)
        if value is None:
            # No first content chunk means no TTFT/E2E at all: a miss; ITL/TPOT of a one-token answer: nothing to miss.
            return self.metric in ("itl", "tpot")
        return value <= self.limit_s


@dataclass(frozen=True)
class SloSpec:
    """A parsed SLO spec: its terms, and the share of good requests a phase with per-request terms needs."""

    terms: tuple[Term, ...]
    objective: float = thresholds.SLO_ATTAINMENT  # share of good requests a phase with per-request terms needs

    @property
    def text(self) -> str:
        return ",".join(t.name for t in self.terms)

    def good(self, record: RequestRecord) -> bool:
        return record.ok and all(t.request_meets(record) for t in self.terms)

    def describe(self) -> str:
        per_request = [t for t in self.terms if t.percentile is None]
        tail = f"; at least {self.objective:.0%} of requests meeting every per-request term" if per_request else ""
        return f"SLOs {self.text}{tail}"


def parse(text: str, objective: float | None = None) -> SloSpec:
    """`ttft_p95<=0.5,itl_p95<=0.1` -> SloSpec; SloError (one line) on anything else."""
    terms: list[Term] = []
    for raw in str(text).split(","):
        part = raw.strip()
        if not part:
            continue
        m = _TERM.fullmatch(part)
        if m is None or m["metric"] not in METRICS:
            raise SloError(f"SLO term {part!r}: expected {SPEC_HELP}")
        try:
            limit = float(m["limit"])
        except ValueError:
            raise SloError(f"SLO term {part!r}: {m['limit']!r} is not a number of seconds") from None
        if not math.isfinite(limit) or limit <= 0:
            raise SloError(f"SLO term {part!r}: the limit must be a number of seconds > 0")
        q = float(m["q"]) if m["q"] is not None else None
        if q is not None and not 0 < q <= 100:
            raise SloError(f"SLO term {part!r}: the percentile must be above 0 and at most 100")
        term = Term(m["metric"], limit / 1000.0 if m["unit"] == "ms" else limit, q)
        if any(t.metric == term.metric and t.percentile == term.percentile for t in terms):
            raise SloError(f"SLO term {part!r}: {term.metric} is limited twice at the same percentile")
        terms.append(term)
    if not terms:
        raise SloError(f"empty SLO spec: expected {SPEC_HELP}")
    return SloSpec(tuple(terms), check_objective(thresholds.SLO_ATTAINMENT if objective is None else objective))


def check_objective(value: float | str) -> float:
    try:
        share = float(value)
    except (TypeError, ValueError):
        raise SloError(f"SLO attainment {value!r}: expected a share above 0 and at most 1, e.g. 0.95") from None
    if not 0 < share <= 1:
        raise SloError(f"SLO attainment {value!r}: expected a share above 0 and at most 1, e.g. 0.95")
    return share


def resolve(text: str | None = None, objective: float | str | None = None, knob: SloKnobs | None = None) -> SloSpec:
    """The spec in force: the flag's value, else the SLO knob's (`knob`: read at the entry, unset by default), else
    thresholds.SLO_DEFAULT (and so for the objective)."""
    knob = knob or SloKnobs()
    spec = text if text not in (None, "") else knob.spec or thresholds.SLO_DEFAULT
    share = objective if objective not in (None, "") else knob.attainment or thresholds.SLO_ATTAINMENT
    return parse(spec, check_objective(share))


# ---------------------------------------------------------------- per request


def schedule_lag(record: RequestRecord) -> float:
    """Seconds the send came after the schedule's instant (0 without a schedule, or for an early send)."""
    if record.scheduled_at is None:
        return 0.0
    return max(0.0, record.started_at - record.scheduled_at)


def tpot(record: RequestRecord) -> float | None:
    """(E2E - TTFT) / (output tokens - 1): the record's own, else from its parts (the report's definition)."""
    if record.tpot_s is not None:
        return record.tpot_s
    if record.e2e_s is not None and record.ttft_s is not None and (record.output_tokens or 0) > 1:
        return (record.e2e_s - record.ttft_s) / (record.output_tokens - 1)
    return None


def finished_at(record: RequestRecord) -> float:
    return record.started_at + (record.e2e_s or 0.0)


SLICES_PER_MEASUREMENT = (4, 40)  # fewest and most slices one measurement is cut into


def good_slices(
    started: float,
    ended: float,
    finished: Sequence[float],
    good: Sequence[bool],
    tokens: Sequence[float],
    ok_e2e: Sequence[float],
) -> tuple[list[float], list[float], list[float]]:
    """One measurement cut into slices about two typical requests long: per slice, the good requests that finished in
    it, their output tokens, and its length. sum(good) / sum(lengths) is goodput; the slices are what a bootstrap of
    it resamples (batch means: a slice's completions carry the run's ups and downs, which single requests do not).
    finished: each request's finish (finished_at); ok_e2e: the successful requests' E2E, whose median is typical."""
    wall = ended - started
    if wall <= 0:
        return [], [], []
    e2e = sorted(x for x in ok_e2e if x)
    typical = e2e[len(e2e) // 2] if e2e else wall
    low, high = SLICES_PER_MEASUREMENT
    n = max(low, min(high, int(wall / (2 * typical))))
    width = wall / n
    per_slice, per_slice_tokens = [0.0] * n, [0.0] * n
    for f, g, t in zip(finished, good, tokens, strict=True):
        if g:
            k = min(n - 1, max(0, int((f - started) / width)))
            per_slice[k] += 1
            per_slice_tokens[k] += t or 0
    return per_slice, per_slice_tokens, [width] * n


# ---------------------------------------------------------------- per phase


@dataclass
class TermResult:
    """One SLO term judged over a phase: the share meeting it, the value observed, and whether it holds."""

    term: str
    met_share: float | None  # requests (ITL: gaps) meeting the limit, failures counted as misses
    observed: float | None  # the percentile itself over successful requests (percentile terms), else the worst
    holds: bool
    missed: int  # successful requests that missed this term's limit on their own


@dataclass
class SloResult:
    """One phase judged against an SLO spec: attainment, goodput, whether it meets, and the term missed most."""

    spec: str
    requests: int
    ok: int
    good: int
    good_tokens: int
    wall_s: float
    attainment: float | None  # good / requests
    goodput_rps: float | None  # good requests per second of wall
    good_tokens_per_s: float | None
    meets: bool  # every percentile term holds, and per-request terms reach the objective
    failed_most: str | None  # the term most requests missed (or "errors"), None when every request was good
    misses: dict[str, int] = field(default_factory=dict)  # term (or "errors") -> requests that missed it
    terms: list[TermResult] = field(default_factory=list)


# The confidence of "settled": a level's attainment whose 95% interval lies on one side of the objective.
SETTLED_Z = 1.96


def attainment_interval(good: int, n: int, z: float = SETTLED_Z) -> tuple[float, float]:
    """The Wilson score interval of an attainment of good / n (sound at 0 and n of n, unlike good/n +- z*se)."""
    if n <= 0:
        return 0.0, 1.0
    p = good / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def settled(spec: SloSpec, result: SloResult) -> bool:
    """Whether more requests at this load could not flip its verdict: per-request terms only (a percentile term's
    verdict has no such interval here), no errors, and the attainment's 95% interval on one side of the objective."""
    if result.requests <= 0 or any(t.percentile is not None for t in spec.terms) or result.ok < result.requests:
        return False
    low, high = attainment_interval(result.good, result.requests)
    return high < spec.objective or low >= spec.objective


def evaluate(spec: SloSpec, records: Sequence[RequestRecord], wall_s: float) -> SloResult:
    """Attainment, goodput and whether the phase meets the spec, from the phase's own records."""
    n = len(records)
    ok = [r for r in records if r.ok]
    good = [r for r in ok if spec.good(r)]
    misses: Counter[str] = Counter()
    if len(ok) < n:
        misses[ERRORS] = n - len(ok)
    results = []
    for term in spec.terms:
        missed = sum(1 for r in ok if not term.request_meets(r))
        if missed:
            misses[term.name] = missed
        results.append(_term_result(term, records, ok, missed, spec.objective))
    per_request = [t for t in spec.terms if t.percentile is None]
    meeting = sum(1 for r in ok if all(t.request_meets(r) for t in per_request)) if per_request else 0
    good_tokens = sum(r.output_tokens or 0 for r in good)
    rate = (lambda x: x / wall_s) if wall_s > 0 else (lambda x: None)
    return SloResult(
        spec=spec.text,
        requests=n,
        ok=len(ok),
        good=len(good),
        good_tokens=good_tokens,
        wall_s=wall_s,
        attainment=len(good) / n if n else None,
        goodput_rps=rate(len(good)),
        good_tokens_per_s=rate(good_tokens),
        meets=holds(spec, n, meeting, [r.met_share for r in results]),
        failed_most=misses.most_common(1)[0][0] if misses else None,
        misses=dict(misses.most_common()),
        terms=results,
    )


def holds(spec: SloSpec, requests: int, meeting: int, shares: Sequence[float | None]) -> bool:
    """A phase's verdict from its counts: its `requests`, the `meeting` ones (succeeded and met every per-request
    term) and each term's met share (in the spec's order; None: nothing to judge). evaluate() judges by it, and so
    does the plan's model (servescope/report/plan.py), which counts millions of predicted requests without records."""
    per_request = any(t.percentile is None for t in spec.terms)
    per_request_holds = meeting / requests >= spec.objective if per_request and requests else bool(requests)
    return per_request_holds and all(
        percentile_holds(t, share) for t, share in zip(spec.terms, shares, strict=True) if t.percentile is not None
    )


def percentile_holds(term: Term, share: float | None) -> bool:
    """A percentile term holds when at least its percentile of what it judges (requests, or ITL gaps) met its limit."""
    return share is not None and share * 100 >= term.percentile


def _term_result(
    term: Term, records: Sequence[RequestRecord], ok: Sequence[RequestRecord], missed: int, objective: float
) -> TermResult:
    failed = len(records) - len(ok)
    if term.percentile is None:
        values = [v for v in (term.request_value(r) for r in ok) if v is not None]
        share = (len(ok) - missed) / len(records) if records else None
        worst = max(values) if values else None
        return TermResult(term.name, share, worst, share is not None and share >= objective, missed)
    if term.metric == "itl":
        # Pooled gaps, as the report pools ITL; a failed request counts as one missed gap.
        values = [g for r in ok for g in (r.itl_s or [])]
        units = len(values) + failed
        met = sum(1 for g in values if g <= term.limit_s)
    else:
        values = [v for v in (term.request_value(r) for r in ok) if v is not None]
        units = len(records)
        met = sum(1 for r in ok if term.request_meets(r))
    share = met / units if units else None
    observed = numpy_percentile(values, term.percentile) if values else None
    return TermResult(term.name, share, observed, percentile_holds(term, share), missed)
