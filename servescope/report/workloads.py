"""The workloads in the report: TTFT and prefix-cache reuse by conversation turn, reuse per phase, replay lag, output lengths.

Reuse = prompt tokens the engine took from its prefix / prompt cache / prompt tokens, from two sources:
- per request, what the engine said about that request (llama.cpp's `timings.cache_n` or
  `usage.prompt_tokens_details.cached_tokens`; vLLM only when started with
  --enable-prompt-tokens-details) over the prompt tokens it reported;
- the server's counters in the run's own samples (servescope_prompt_tokens_cached_total over
  servescope_prompt_tokens_total, every engine that has them: vLLM and llama.cpp), summed per phase;
  by turn only over the stretches between two samples where every request in its prefill was of
  that one turn (both counters move while a prompt is processed, before its first token: vLLM at
  scheduling and at the first output, llama.cpp when the prompt is evaluated), since a counter
  cannot say which request it counted.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from servescope import engines
from servescope.contracts import series, thresholds
from servescope.contracts.runfolder import RequestRecord
from servescope.engines.base import DURATIONS
from servescope.judgements import prefix_reuse, stats
from servescope.report import query
from servescope.report.gauges import GaugeReport
from servescope.report.load import Run
from servescope.report.render import Bullets, Figure, Paragraph, Section, Table
from servescope.text import numbers

# A sample's value was read somewhere within its read around its time, and an engine updates its counters a
# little before its first token reaches the client: prefill windows are widened by this much.
SLACK_S = 0.05
LATE_S = 0.010  # a replayed request sent more than this after its scheduled time counts as late
# Where each engine says, per request, how many prompt tokens came from its cache (an engine not here says nothing).
PER_REQUEST_REUSE = {
    "llamacpp": "llama.cpp timings.cache_n / usage.prompt_tokens_details",
    "vllm": "vLLM only with --enable-prompt-tokens-details",
}
REUSE_RULE = (
    "Reuse = prompt tokens the engine took from its cache / prompt tokens. Per request: what the engine "
    "reported for each request ({per_request}). Server: the engine's counters in the run's samples "
    f"({series.PROMPT_CACHED_TOKENS} / {series.PROMPT_TOKENS}), by turn only between two samples where every "
    "prompt the engine processed was of that turn."
)


def reuse_rule(kinds: Iterable[str] | None = None) -> str:
    """REUSE_RULE naming the per-request sources of the engine kinds that ran (every one known when None)."""
    chosen = PER_REQUEST_REUSE if kinds is None else {k: PER_REQUEST_REUSE[k] for k in kinds if k in PER_REQUEST_REUSE}
    return REUSE_RULE.format(per_request="; ".join(chosen.values()) or "none of these engines reports it")


OLLAMA_NOTE = (
    "Ollama reports no cached-token count. Its prompt_eval_count against the history it was sent (the previous "
    "turn's prompt + answer): {verdict} The engine's prefill time (prompt_eval_duration, last column) staying flat "
    "or falling while the history grows is the sign that it reused its cache."
)
OLLAMA_COUNTS_ALL = (
    "it covered the whole history on every turn (current builds count the prompt before their cache lookup), so "
    "it cannot show reuse either way."
)
OLLAMA_COUNTS_EVALUATED = (
    "it was below the history on {n} of {m} later turns: this build counts only the tokens it evaluated, so at "
    "least the difference came from its cache."
)


@dataclass
class TurnRow:
    """One conversation turn of an engine's scenario: its TTFT and its prefix-cache reuse by both sources."""

    instance: str
    engine: str
    scenario: str
    turn: int
    requests: int
    ok: int
    ttft: dict  # stats.summary of TTFT (s) over successful requests
    prompt_tokens_mean: float | None
    history_tokens_mean: float | None
    reuse_per_request: float | None  # sum of cached / sum of prompt tokens over requests reporting both
    reporting: int  # requests that reported both counts
    reuse_server: float | None  # server counters over the stretches attributable to this turn
    server_prompt_tokens: float  # prompt tokens those stretches counted
    engine_prefill_ms_mean: float | None  # llama.cpp timings.prompt_ms, Ollama prompt_eval_duration


@dataclass
class PhaseReuse:
    """One phase's prefix-cache reuse by both sources, against what its workload asked for."""

    instance: str
    phase: str
    prompt_tokens: float | None  # server counters over the phase
    cached_tokens: float | None
    reuse_server: float | None
    reuse_per_request: float | None
    reporting: int
    ceiling: float | None  # a shared-prefix set's best possible reuse (chat template aside)
    asked: float = 0.0  # the reuse the workload means to measure (0: a fresh or plain set)
    requests: int = 0

    @property
    def unasked(self) -> bool:
        """More reuse than the workload asked for: this phase measured the engine's cache (servescope/judgements/prefix_reuse)."""
        return prefix_reuse.unasked(
            prefix_reuse.Reuse(
                self.reuse_server, self.prompt_tokens, self.reuse_per_request, self.reporting, self.requests
            ),
            self.asked,
        )


@dataclass
class LagRow:
    """One trace replay phase's lag: how late its sends went out against the trace's times, and both spans."""

    instance: str
    phase: str
    requests: int
    lag: dict  # stats.summary of started_at - scheduled_at (s)
    late: int  # sent more than LATE_S after their time
    scheduled_span_s: float
    sent_span_s: float


@dataclass
class LengthRow:
    """One engine's scenario's output lengths: tokens asked for against produced, and requests that stopped short."""

    instance: str
    scenario: str
    ok: int
    asked: int  # sum of max_tokens over successful requests
    produced: int  # sum of output tokens
    short: int  # requests that stopped before their max_tokens
    ignore_eos: str  # on / off / unavailable / not recorded
    note: str = ""


@dataclass
class WorkloadReport:
    """The report's workloads: rows by turn, reuse per phase, replay lag, output lengths, and notes."""

    turns: list[TurnRow] = field(default_factory=list)
    reuse: list[PhaseReuse] = field(default_factory=list)
    lag: list[LagRow] = field(default_factory=list)
    lengths: list[LengthRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def build(run: Run, gauge_report: GaugeReport) -> WorkloadReport:
    report = WorkloadReport()
    ceilings = _ceilings(run.manifest)
    for instance, info in run.engines.items():
        intervals = _counter_intervals(gauge_report, instance)
        # Records as objects only where a workload left its marks (turns, cache reports, a replay) or the server's
        # counters need attributing: a plain soak of a million requests is never listed.
        marked = run.con.execute(
            "SELECT count(*) FROM requests WHERE instance = ? AND (turn IS NOT NULL OR cached_tokens IS NOT NULL "
            "OR (scenario = 'replay' AND scheduled_at IS NOT NULL))",
            [instance],
        ).fetchone()[0]
        records = run.requests_of(instance, gaps=False) if marked or intervals else []
        by_turn = _attribute(intervals, records)
        report.turns += _turn_rows(instance, records, by_turn)
        report.reuse += _phase_reuse(
            run, instance, records, intervals, ceilings, _set_numbers(run.manifest, "asked_reuse")
        )
        report.lag += _lag_rows(instance, records)
        report.lengths += _length_rows(run, instance)
        if _counts_whole_prompts(info.kind) and any(r.turn is not None for r in records):
            report.notes.append(f"{info.title}: " + OLLAMA_NOTE.format(verdict=_ollama_counts(records)))
    shorts = [row for row in report.lengths if row.short]
    if shorts and len({row.instance for row in report.lengths}) > 1:
        report.notes.append(
            "Output lengths differ: "
            + "; ".join(f"{row.instance} {row.scenario}: {row.short} of {row.ok} stopped short" for row in shorts)
            + ". Tokens/s compare like for like only where every engine produced the lengths asked for."
        )
    return report


def _counts_whole_prompts(kind: str) -> bool:
    """An engine whose final objects carry Ollama's durations and prompt_eval_count, and no cached-token count."""
    adapter = engines.ENGINES.get(kind)
    return adapter is not None and adapter.timings is not None and adapter.timings.form == DURATIONS


def _ollama_counts(records: list[RequestRecord]) -> str:
    """What Ollama's prompt_eval_count says next to the history length: a whole-prompt count, or the evaluated part."""
    later = [r for r in records if r.ok and r.history_tokens and r.prompt_tokens is not None]
    below = sum(1 for r in later if r.prompt_tokens < r.history_tokens)
    return OLLAMA_COUNTS_EVALUATED.format(n=below, m=len(later)) if below else OLLAMA_COUNTS_ALL


# --- the server's counters: consecutive samples' differences, and which turn they belong to


@dataclass
class _Interval:
    """The stretch between two consecutive samples: the prompt and cached tokens the engine's counters added."""

    t0: float
    t1: float
    prompt: float  # servescope_prompt_tokens_total counted between the two samples
    cached: float


def _counter_intervals(gauge_report: GaugeReport, instance: str) -> list[_Interval]:
    eg = gauge_report.engines.get(instance)
    if eg is None or eg.source != "samples":
        return []
    prompt = dict(eg.series.get(series.PROMPT_TOKENS, []))
    cached = dict(eg.series.get(series.PROMPT_CACHED_TOKENS, []))
    points = sorted((t, p, cached[t]) for t, p in prompt.items() if p is not None and cached.get(t) is not None)
    out = []
    for (t0, p0, c0), (t1, p1, c1) in zip(points, points[1:], strict=False):
        if p1 - p0 > 0 and c1 >= c0:  # a counter going back is an engine restart: that stretch says nothing
            out.append(_Interval(t0, t1, p1 - p0, c1 - c0))
    return out


def _prefill(r: RequestRecord) -> tuple[float, float]:
    """When the engine counted this request's prompt: from its send to its first token (a failure: around its send)."""
    return r.started_at - SLACK_S, r.started_at + (r.ttft_s or 0.0) + SLACK_S


def _attribute(intervals: list[_Interval], records: list[RequestRecord]) -> dict[tuple[str, int], list[float]]:
    """(scenario, turn) -> [prompt, cached] summed over the intervals in which only that turn's prompts were processed."""
    out: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    spans = sorted(((*_prefill(r), r.scenario, r.turn) for r in records), key=lambda s: s[0])
    active: list[tuple[float, float, str, int | None]] = []
    nxt = 0
    for iv in intervals:  # both in time order: a sweep, not every pair
        while nxt < len(spans) and spans[nxt][0] < iv.t1:
            active.append(spans[nxt])
            nxt += 1
        active = [s for s in active if s[1] > iv.t0]
        keys = {(s[2], s[3]) for s in active}
        if len(keys) == 1:
            scenario, turn = next(iter(keys))
            if turn is not None:
                out[(scenario, turn)][0] += iv.prompt
                out[(scenario, turn)][1] += iv.cached
    return out


# --- the rows


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


_per_request_reuse = prefix_reuse.from_records


def engine_prefill_ms(record: RequestRecord) -> float | None:
    """The request's prefill as the engine timed it, where it times each request (llama.cpp, Ollama), else None."""
    stats_ = record.engine_stats or {}
    timings = stats_.get("timings")
    if isinstance(timings, dict) and isinstance(timings.get("prompt_ms"), int | float):
        return float(timings["prompt_ms"])
    if isinstance(stats_.get("prompt_eval_duration_ns"), int | float):
        return stats_["prompt_eval_duration_ns"] / 1e6
    return None


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _turn_rows(
    instance: str, records: list[RequestRecord], by_turn: dict[tuple[str, int], list[float]]
) -> list[TurnRow]:
    groups: dict[tuple[str, int], list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.turn is not None:
            groups[(r.scenario, r.turn)].append(r)
    rows = []
    for (scenario, turn), recs in sorted(groups.items()):
        ok = [r for r in recs if r.ok]
        reuse, reporting = _per_request_reuse(recs)
        server = by_turn.get((scenario, turn), [0.0, 0.0])
        prefill = [v for v in map(engine_prefill_ms, ok) if v is not None]
        rows.append(
            TurnRow(
                instance=instance,
                engine=recs[0].engine,
                scenario=scenario,
                turn=turn,
                requests=len(recs),
                ok=len(ok),
                ttft=stats.summary([r.ttft_s for r in ok if r.ttft_s is not None]),
                prompt_tokens_mean=_mean([r.prompt_tokens for r in ok if r.prompt_tokens is not None]),
                history_tokens_mean=_mean([r.history_tokens for r in ok if r.history_tokens is not None]),
                reuse_per_request=reuse,
                reporting=reporting,
                reuse_server=_ratio(server[1], server[0]),
                server_prompt_tokens=server[0],
                engine_prefill_ms_mean=_mean(prefill),
            )
        )
    return rows


def _ceilings(manifest: dict[str, Any]) -> dict[str, float]:
    """Prompt set name -> the reuse a perfect cache would reach, where the manifest states one (shared-prefix)."""
    return _set_numbers(manifest, "reuse_ceiling")


def _set_numbers(manifest: dict[str, Any], key: str) -> dict[str, float]:
    sets = manifest.get("prompt_sets")
    if not isinstance(sets, dict):
        return {}
    return {
        name: float(entry[key])
        for name, entry in sets.items()
        if isinstance(entry, dict) and isinstance(entry.get(key), int | float)
    }


def _phase_reuse(
    run: Run,
    instance: str,
    records: list[RequestRecord],
    intervals: list[_Interval],
    ceilings: dict[str, float],
    asked: dict[str, float],
) -> list[PhaseReuse]:
    phases = run.phases_of(instance)
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for iv in intervals:
        # An interval between two reads belongs to the phase it lies in (a burst's rounds are phases of their own);
        # one that spans a phase's edge also counts what came before it: the engine's warm-up, another phase.
        inside = [p.phase for p in phases if iv.t0 >= p.started_at - SLACK_S and iv.t1 <= p.ended_at + SLACK_S]
        if inside:
            totals[inside[0]][0] += iv.prompt
            totals[inside[0]][1] += iv.cached
    rows = []
    for p in phases:
        mine = [r for r in records if r.phase == p.phase]
        reuse, reporting = _per_request_reuse(mine)
        server = totals.get(p.phase)
        if server is None and not reporting:
            continue
        rows.append(
            PhaseReuse(
                instance=instance,
                phase=p.phase,
                prompt_tokens=server[0] if server else None,
                cached_tokens=server[1] if server else None,
                reuse_server=_ratio(server[1], server[0]) if server else None,
                reuse_per_request=reuse,
                reporting=reporting,
                ceiling=ceilings.get(p.prompt_set),
                asked=asked.get(p.prompt_set, ceilings.get(p.prompt_set, 0.0)),
                requests=len(mine),
            )
        )
    return rows


def _lag_rows(instance: str, records: list[RequestRecord]) -> list[LagRow]:
    groups: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.scenario == "replay" and r.scheduled_at is not None:
            groups[r.phase].append(r)
    rows = []
    for phase, recs in groups.items():
        lags = [r.started_at - r.scheduled_at for r in recs]
        scheduled = [r.scheduled_at for r in recs]
        sent = [r.started_at for r in recs]
        rows.append(
            LagRow(
                instance=instance,
                phase=phase,
                requests=len(recs),
                lag=stats.summary(lags),
                late=sum(1 for x in lags if x > LATE_S),
                scheduled_span_s=max(scheduled) - min(scheduled),
                sent_span_s=max(sent) - min(sent),
            )
        )
    return rows


def _ignore_eos(run: Run, instance: str) -> str:
    engines = run.manifest.get("engines")
    entry = engines.get(instance) if isinstance(engines, dict) else None
    value = entry.get("ignore_eos") if isinstance(entry, dict) else None
    if isinstance(value, bool):
        return "on" if value else "off"
    return "unavailable" if value == "unavailable" else "not recorded"


def _length_rows(run: Run, instance: str) -> list[LengthRow]:
    eos = _ignore_eos(run, instance)
    rows = []
    counted = "ok AND output_tokens IS NOT NULL"
    per_scenario = run.con.execute(
        f"SELECT scenario, count(*) FILTER (WHERE {counted}), coalesce(sum(max_tokens) FILTER (WHERE {counted}), 0), "
        f"coalesce(sum(output_tokens) FILTER (WHERE {counted}), 0), "
        f"count(*) FILTER (WHERE {counted} AND max_tokens <> 0 AND output_tokens < max_tokens) "
        f"FROM requests WHERE instance = ? GROUP BY scenario ORDER BY min(({query.ORDER}))",
        [instance],
    ).fetchall()
    for scenario, ok, asked, produced, short in per_scenario:
        if not ok:
            continue
        note = ""
        if short:
            note = {
                "unavailable": "the engine has no ignore_eos: it stops at its end-of-sequence token",
                "off": "ignore_eos was not sent (--no-ignore-eos): the model's end-of-sequence token ends answers",
                "on": "stopped early although ignore_eos was sent (context full, or the engine ignores it)",
            }.get(eos, "answers ended before max_tokens")
        rows.append(
            LengthRow(
                instance=instance,
                scenario=scenario,
                ok=ok,
                asked=int(asked),
                produced=int(produced),
                short=short,
                ignore_eos=eos,
                note=note,
            )
        )
    return rows


# --- the section and report.json


def section(run: Run, report: WorkloadReport, figures: list[Figure]) -> Section:
    sec = Section("Workloads: conversations, prefix-cache reuse, replay, output lengths")
    titles = {i: e.title for i, e in run.engines.items()}
    if report.turns or report.reuse:
        sec.add(Paragraph(reuse_rule(e.kind for e in run.engines.values())))
    if report.turns:
        sec.add(
            Table(
                [
                    "Engine",
                    "Scenario",
                    "Turn",
                    "Requests (ok)",
                    "TTFT p50 ms",
                    "TTFT p95 ms",
                    "Prompt tokens (mean)",
                    "History tokens (mean)",
                    "Reuse per request",
                    "Reuse (server)",
                    "Engine prefill ms (mean)",
                ],
                [
                    [
                        titles.get(t.instance, t.instance),
                        t.scenario,
                        str(t.turn),
                        f"{t.requests} ({t.ok})",
                        numbers.milliseconds(t.ttft["p50"]),
                        numbers.milliseconds(t.ttft["p95"]),
                        numbers.fixed(t.prompt_tokens_mean, 0),
                        numbers.fixed(t.history_tokens_mean, 0),
                        numbers.percent(t.reuse_per_request, 0) + (f" of {t.reporting}" if t.reporting else ""),
                        numbers.percent(t.reuse_server, 0),
                        numbers.fixed(t.engine_prefill_ms_mean, 1),
                    ]
                    for t in report.turns
                ],
                "Conversations by turn: history tokens = the previous turn's prompt + answer as the engine counted "
                "them (what a cache could hold)",
            )
        )
    if report.reuse:
        sec.add(
            Table(
                [
                    "Engine",
                    "Phase",
                    "Prompt tokens (server)",
                    "Cached (server)",
                    "Reuse (server)",
                    "Reuse per request",
                    "Ceiling",
                ],
                [
                    [
                        titles.get(r.instance, r.instance),
                        r.phase,
                        numbers.fixed(r.prompt_tokens, 0),
                        numbers.fixed(r.cached_tokens, 0),
                        numbers.percent(r.reuse_server, 0) + (" (not asked for)" if r.unasked else ""),
                        numbers.percent(r.reuse_per_request, 0) + (f" of {r.reporting}" if r.reporting else ""),
                        numbers.percent(r.ceiling, 0),
                    ]
                    for r in report.reuse
                ],
                "Prefix-cache reuse per phase (ceiling: what a perfect cache reuses of a shared-prefix set; not asked "
                f"for: above {thresholds.PREFIX_REUSE_UNASKED:.0%} and above what the workload means to reuse, so the "
                "phase measured the engine's cache)",
            )
        )
    if report.lag:
        sec.add(
            Table(
                [
                    "Engine",
                    "Phase",
                    "Requests",
                    "Lag p50 ms",
                    "Lag p95 ms",
                    "Lag max ms",
                    f"Late (> {LATE_S * 1000:g} ms)",
                    "Scheduled span s",
                    "Sent span s",
                ],
                [
                    [
                        titles.get(x.instance, x.instance),
                        x.phase,
                        str(x.requests),
                        numbers.milliseconds(x.lag["p50"]),
                        numbers.milliseconds(x.lag["p95"]),
                        numbers.milliseconds(x.lag["max"]),
                        str(x.late),
                        f"{x.scheduled_span_s:.2f}",
                        f"{x.sent_span_s:.2f}",
                    ]
                    for x in report.lag
                ],
                "Replay: schedule lag = sent - scheduled (the client late, or a conversation turn waiting for the "
                "previous answer); a replay is faithful when the lag stays near 0",
            )
        )
    if report.lengths:
        sec.add(
            Table(
                ["Engine", "Scenario", "OK", "Tokens asked", "Tokens produced", "Stopped short", "ignore_eos", "Why"],
                [
                    [
                        titles.get(x.instance, x.instance),
                        x.scenario,
                        str(x.ok),
                        str(x.asked),
                        str(x.produced),
                        str(x.short),
                        x.ignore_eos,
                        x.note or "-",
                    ]
                    for x in report.lengths
                ],
                "Output lengths: asked (max_tokens, a dataset's or a trace's own) against produced",
            )
        )
    if report.notes:
        sec.add(Bullets(report.notes))
    for fig in figures:
        sec.add(fig)
    if len(sec.blocks) == 0:
        sec.add(Paragraph("No successful requests to describe."))
    return sec


def to_json(report: WorkloadReport) -> dict[str, Any]:
    return {
        "reuse_rule": reuse_rule(),
        "late_threshold_s": LATE_S,
        "turns": [asdict(t) for t in report.turns],
        "reuse": [{**asdict(r), "unasked": r.unasked} for r in report.reuse],
        "replay_lag": [asdict(x) for x in report.lag],
        "output_lengths": [asdict(x) for x in report.lengths],
        "notes": report.notes,
    }
