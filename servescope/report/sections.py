"""The report's sections in their order, each built from one run, Prometheus and a baseline, and how each renders."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, NamedTuple

from servescope import engines
from servescope.contracts import series, thresholds
from servescope.contracts.settings import ReportSettings
from servescope.engines.base import DURATIONS
from servescope.host import cpu_priority
from servescope.judgements import stats
from servescope.judgements.slo import SloSpec
from servescope.report import (
    compare,
    crosscheck,
    fairness,
    gauges,
    goodput,
    latency,
    noise,
    plan,
    schedule,
    summary,
    sweep,
    table,
    ttft_split,
    verdict,
    workloads,
)
from servescope.report import figures as figure_data
from servescope.report.load import Run, knee_of
from servescope.report.outline import Context, Plots, ReportSection, walk
from servescope.report.render import Bullets, Document, Figure, Paragraph, Preformatted, Section, Table
from servescope.text import numbers, words


def _utc(ts: float | None) -> str:
    if ts is None:
        return "unknown"
    try:
        return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):  # a manifest's time past the year 9999: say so, never a traceback
        return f"{ts:g} (not a date)"


def build(
    run: Run,
    prometheus_url: str,
    baseline: Run | None = None,
    figures: bool = True,
    client: gauges.Prometheus | None = None,
    slo_spec: str | None = None,
    settings: ReportSettings | None = None,
) -> tuple[Document, dict[str, Any]]:
    """The report on one run (against a baseline when given): its document and report.json's numbers. `settings`:
    the knobs the report applies (its plan, its SLOs' fallback); None: as the environment sets them now (this is the
    report's entry for its command, the benches and the tests alike)."""
    settings = ReportSettings.from_env() if settings is None else settings
    ctx = Context(run, prometheus_url, baseline, figures, client, slo_spec, settings=settings)
    latency.start_pools(run)  # the engine's passes over every gap run while the rest is computed
    sections, said = walk(order(run), ctx)
    report_json = {
        "run": {
            "run_id": run.run_id,
            "path": str(run.path),
            "started_at": run.started_at,
            "ended_at": run.ended_at,
            "requests": run.request_count,
            "phases": len(run.phases),
        },
        "sections": [sec.title for sec in sections],
        **said,
        "plots": sorted(p.name for p in ctx.plots.collect().values() if p),
    }
    subtitle = (
        f"Run {run.run_id} ({run.path}) - {_utc(run.started_at)} to {_utc(run.ended_at)}; "
        f"{words.count(run.request_count, 'request')} over {words.count(len(run.phases), 'phase')} on "
        f"{words.count(len(run.engines), 'engine')}"
    )
    return Document("servescope report", subtitle, sections), report_json


class Summary(ReportSection):
    stage = 3  # rests on the table, the verdict, goodput, the workloads and the setup

    def build(self, ctx: Context) -> list[summary.EngineSummary]:
        rows, good = ctx.of(SequentialBurstTable).rows, ctx.of(Goodput).good
        verdicts, work, warn = ctx.of(Verdict).verdicts, ctx.of(Workloads).work, ctx.of(Setup).warn
        return summary.build(ctx.run, rows, verdicts, ctx.spec, good, ctx.assessment, warn, work)

    def to_json(self, data: list[summary.EngineSummary]) -> dict[str, Any]:
        return {"summary": summary.to_json(data)}

    def section(self, data: list[summary.EngineSummary]) -> Section:
        return summary.section(data)


class SequentialBurstTable(ReportSection):
    class Data(NamedTuple):
        run: Run
        rows: list[table.TableRow]
        plots: Plots

    def build(self, ctx: Context) -> Data:
        rows = table.build(ctx.run, ctx.assessment)
        ctx.plots.draw("table", figure_data.sequential_burst_table, rows)
        return self.Data(ctx.run, rows, ctx.plots)

    def to_json(self, data: Data) -> dict[str, Any]:
        return {
            "table": {
                "rule": table.READING_RULE,
                "rows": table.to_json(data.rows),
                "repeated_bursts": table.repeated_bursts(data.rows),
            }
        }

    def section(self, data: Data) -> Section:
        caption = "Wall time per engine and mode; bold numbers are scaling factors."
        return _table(data.run, data.rows, data.plots.figure("table", caption))

    def silent(self, data: Data) -> str | None:
        return None if data.rows else NO_TABLE


class Verdict(ReportSection):
    class Data(NamedTuple):
        run: Run
        verdicts: list[verdict.Verdict]
        kv: list[verdict.KvArithmetic]

    def build(self, ctx: Context) -> Data:
        run, assessment = ctx.run, ctx.assessment
        gauge_report, checks = ctx.of(Gauges).report, ctx.of(CrossCheck).checks
        kv = verdict.kv_arithmetic(run, gauge_report)
        # The verdict rests only on trusted phases: flagged ones (host noise, outliers) are taken out first.
        trusted = noise.clean(run, assessment)
        trusted_gauges = noise.clean_gauges(gauge_report, run, assessment)
        verdicts = verdict.refuse_flagged(
            verdict.build(
                trusted,
                trusted_gauges,
                sweep.bursts(trusted, trusted_gauges),
                ttft_split.build(trusted, checks),
                kv,
            ),
            run,
            assessment,
        )
        return self.Data(run, verdicts, kv)

    def to_json(self, data: Data) -> dict[str, Any]:
        return {"verdict": verdict.to_json(data.verdicts, data.kv, _kinds(data.run))}

    def section(self, data: Data) -> Section:
        return _verdict(data.run, data.verdicts, data.kv)


class Goodput(ReportSection):
    stage = 2

    class Data(NamedTuple):
        run: Run
        spec: SloSpec
        good: list[goodput.PhaseGoodput]
        lags: list[schedule.ScheduleCheck]

    def build(self, ctx: Context) -> Data:
        lags = schedule.build(ctx.run)
        return self.Data(ctx.run, ctx.spec, goodput.build(ctx.run, ctx.spec), lags)

    def to_json(self, data: Data) -> dict[str, Any]:
        return {"goodput": goodput.to_json(data.spec, data.good, data.lags, data.run)}

    def section(self, data: Data) -> Section:
        return goodput.section(data.run, data.spec, data.good, data.lags, "Goodput under the SLOs")


class Plan(ReportSection):
    """Only on a knee run (its knee.json): on any other the section is left out."""

    stage = 2

    def build(self, ctx: Context) -> tuple[dict[str, Any], list[plan.PlanRow]] | None:
        return plan.for_report(ctx.run.path, ctx.spec, ctx.settings.plan)

    def to_json(self, data: tuple[dict[str, Any], list[plan.PlanRow]] | None) -> dict[str, Any]:
        return {"plan": data[0] if data else None}

    def section(self, data: tuple[dict[str, Any], list[plan.PlanRow]]) -> Section:
        return _plan(*data)


class Latency(ReportSection):
    stage = 1

    class Data(NamedTuple):
        groups: list[latency.LatencyGroup]
        plots: Plots

    def build(self, ctx: Context) -> Data:
        ctx.plots.draw("tokens", figure_data.output_tokens, ctx.run)
        ctx.plots.draw("latency", figure_data.latency_boxes, ctx.run)
        return self.Data(latency.build(ctx.run), ctx.plots)

    def to_json(self, data: Data) -> dict[str, Any]:
        return {
            "latency": {
                "definitions": latency.DEFINITIONS,
                "percentile_method": stats.PERCENTILE_METHOD,
                "failure_policy": latency.FAILURE_POLICY,
                "groups": latency.to_json(data.groups),
            }
        }

    def section(self, data: Data) -> Section:
        figs = data.plots.figure("latency", "TTFT, ITL, TPOT, E2E per engine and scenario, and per load level.")
        return _latency(data.groups, figs + data.plots.figure("tokens", "Output tokens per request."))


class Gauges(ReportSection):
    class Data(NamedTuple):
        run: Run
        report: gauges.GaugeReport
        plots: Plots

    def build(self, ctx: Context) -> Data:
        report = gauges.collect(ctx.run, ctx.prometheus_url, ctx.client)
        ctx.plots.draw("gauges", figure_data.gauges, ctx.run, report)
        return self.Data(ctx.run, report, ctx.plots)

    def to_json(self, data: Data) -> dict[str, Any]:
        return {"gauges": gauges.to_json(data.report)}

    def section(self, data: Data) -> Section:
        caption = (
            "Running and waiting requests (left axis) and KV cache usage "
            "(right axis) over the run; shaded bands are load phases; breaks are reads that got no value."
        )
        return _gauges(data.run, data.report, data.plots.figure("gauges", caption))

    def silent(self, data: Data) -> str | None:
        return None if data.report.available else f"no gauge data: {data.report.reason}"


class Sweeps(ReportSection):
    class Data(NamedTuple):
        run: Run
        sweeps: list[sweep.Sweep]
        drains: list[sweep.BurstDrain]
        have_gauges: bool
        plots: Plots

    def build(self, ctx: Context) -> Data:
        run, gauge_report = ctx.run, ctx.of(Gauges).report
        sweeps_ = sweep.sweeps(run)
        ctx.plots.draw("sweeps", figure_data.sweeps, run, sweeps_)
        drains = sweep.bursts(run, gauge_report)
        ctx.plots.draw("arrival", figure_data.ttft_by_arrival, run, drains)
        return self.Data(run, sweeps_, drains, gauge_report.available, ctx.plots)

    def to_json(self, data: Data) -> dict[str, Any]:
        return {"sweeps": sweep.to_json(data.sweeps, data.drains)}

    def section(self, data: Data) -> Section:
        figs = data.plots.figure("sweeps", "Throughput and E2E latency per concurrency level.")
        figs += data.plots.figure("arrival", "TTFT by arrival order within the bursts.")
        return _sweeps(data.run, data.sweeps, data.drains, data.have_gauges, figs)

    def silent(self, data: Data) -> str | None:
        return None if data.sweeps or data.drains else NO_SWEEP


class Comparison(ReportSection):
    stage = 1

    class Data(NamedTuple):
        deltas: list[compare.Delta]
        how: str
        baseline: Run | None
        plots: Plots

    def build(self, ctx: Context) -> Data:
        run, baseline = ctx.run, ctx.baseline
        deltas, how = compare.between_runs(run, baseline) if baseline is not None else compare.within_run(run)
        what = f"{run.run_id} vs {baseline.run_id}" if baseline else "engines within the run"
        ctx.plots.draw("compare", figure_data.compare, deltas, what)
        return self.Data(deltas, how, baseline, ctx.plots)

    def to_json(self, data: Data) -> dict[str, Any]:
        baseline = data.baseline.run_id if data.baseline else None
        return {"comparison": {"baseline": baseline, **compare.to_json(data.deltas, data.how)}}

    def section(self, data: Data) -> Section:
        figs = data.plots.figure("compare", "Median change vs baseline, with 95% bootstrap CIs.")
        return _compare(data.deltas, data.how, data.baseline, figs)

    def silent(self, data: Data) -> str | None:
        return None if data.deltas or data.baseline is not None else data.how


class Workloads(ReportSection):
    class Data(NamedTuple):
        run: Run
        work: workloads.WorkloadReport
        plots: Plots

    def build(self, ctx: Context) -> Data:
        work = workloads.build(ctx.run, ctx.of(Gauges).report)
        ctx.plots.draw("turns", figure_data.turns, ctx.run, work)
        return self.Data(ctx.run, work, ctx.plots)

    def to_json(self, data: Data) -> dict[str, Any]:
        return {"workloads": workloads.to_json(data.work)}

    def section(self, data: Data) -> Section:
        figs = data.plots.figure("turns", "TTFT (median) and prefix-cache reuse by conversation turn.")
        return workloads.section(data.run, data.work, figs)


class CrossCheck(ReportSection):
    class Data(NamedTuple):
        run: Run
        checks: list[crosscheck.CrossCheck]
        splits: list[ttft_split.TtftSplit]
        plots: Plots

    def build(self, ctx: Context) -> Data:
        run = ctx.run
        checks = crosscheck.build(run, ctx.prometheus() if ctx.of(Gauges).report.reachable else None)
        ctx.plots.draw("crosscheck", figure_data.crosscheck, run, checks)
        return self.Data(run, checks, ttft_split.build(run, checks), ctx.plots)

    def to_json(self, data: Data) -> dict[str, Any]:
        return {
            "crosscheck": {
                "components": crosscheck.COMPONENT_HELP,
                "cold_load_threshold_s": crosscheck.COLD_LOAD_S,
                "engines": crosscheck.to_json(data.checks),
            },
            "ttft_split": ttft_split.to_json(data.splits),
        }

    def section(self, data: Data) -> Section:
        caption = "Mean seconds per request by component, against client E2E."
        return _crosscheck(data.run, data.checks, data.splits, data.plots.figure("crosscheck", caption))

    def silent(self, data: Data) -> str | None:
        if any(c.available for c in data.checks) or any(s.available for s in data.splits):
            return None
        why = dict.fromkeys(f"{data.run.engines[c.instance].title}: {c.source}" for c in data.checks)
        return "no engine-side timings (" + "; ".join(why) + ")" if why else "no engine-side timings"


class Setup(ReportSection):
    class Data(NamedTuple):
        run: Run
        warn: list[str]
        assessment: noise.Assessment
        prompts: list[tuple[str, str, int]]  # (prompt set, its sha256, distinct prompts sent)

    def build(self, ctx: Context) -> Data:
        run = ctx.run
        warn = fairness.warnings(run, ctx.of(SequentialBurstTable).rows)
        prompts = run.con.execute(
            "SELECT prompt_set, prompt_set_sha256, count(DISTINCT prompt_id) FROM requests GROUP BY ALL"
        ).fetchall()
        return self.Data(run, warn, ctx.assessment, prompts)

    def to_json(self, data: Data) -> dict[str, Any]:
        run = data.run
        return {
            "manifest": run.manifest,
            "engines": {i: vars(e) for i, e in run.engines.items()},
            "phases": [{**vars(p), "wall_s": p.wall_s} for p in run.phases],
            "loader_warnings": run.warnings,
            "noise": noise.to_json(data.assessment),
            "fairness_warnings": data.warn,
        }

    def section(self, data: Data) -> Section:
        return _setup(data.run, data.warn, data.assessment, data.prompts)


NO_TABLE = "no sequential or burst phases in this run (`python -m loadgen compare` runs them)"
NO_SWEEP = (
    "no scenario with phases at different concurrency levels and no burst in this run (`python -m loadgen sweep` runs "
    "one)"
)

# The answers first (the summary, the table, the verdict, goodput and the knee), then what they rest on, the setup
# last: the report walks this order, and each section's number is its place in it (servescope/report/outline.py).
SECTIONS: tuple[ReportSection, ...] = (
    Summary(),
    SequentialBurstTable(),
    Verdict(),
    Goodput(),
    Plan(),
    Latency(),
    Gauges(),
    Sweeps(),
    Comparison(),
    Workloads(),
    CrossCheck(),
    Setup(),
)


KNEE_FIRST = (Goodput, Plan)  # a knee or quick run's answer: the knee with its levels, and what it plans


def order(run: Run) -> tuple[ReportSection, ...]:
    """SECTIONS' order, except on a knee or quick run (its knee.json), whose answer is the knee: goodput (the knee and
    each level's attainment) and the replicas it plans come right after the summary, before the verdict."""
    if knee_of(run) is None:
        return SECTIONS
    first = [s for s in SECTIONS if isinstance(s, KNEE_FIRST)]
    return (SECTIONS[0], *first, *[s for s in SECTIONS[1:] if s not in first])


def _plan(doc: dict[str, Any], rows: list[plan.PlanRow]) -> Section:
    """How many replicas of this knee's setting the default traffic needs: servescope/report/plan.py's model, said as such."""
    sec = Section("Replicas for a traffic (predicted from this knee)")
    if not rows:
        sec.add(Paragraph(f"Not planned: {doc['not_planned']}."))
        return sec
    traffic_ = doc["traffic"]
    sec.add(
        Paragraph(
            f"For {traffic_['name']} ({traffic_['requests']} requests over {traffic_['duration_s']:.0f} s; PLAN_TRACE, "
            f"PLAN_SPEED), the SLOs above, routing {doc['settings']['routing']}. {_sentence(plan.METHOD)}. "
            "`python -m servescope.report plan` plans other traffic and compares engines."
        )
    )
    sec.add(Table(list(plan.COLUMNS), [plan.cells(r, doc["settings"]["max_replicas"]) for r in rows]))
    sec.add(Bullets([_sentence(plan.COLUMNS_HELP) + ".", *plan.row_notes(rows)]))
    return sec


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]  # str.capitalize would lower the rest (TTFT, SLOs, knob names)


def _setup(run: Run, warn: list[str], assessment: noise.Assessment, prompts: list[tuple[str, str, int]]) -> Section:
    sec = Section("Setup")
    m = run.manifest
    duration = (run.ended_at - run.started_at) if run.started_at and run.ended_at else None
    command = m.get("command") or m.get("argv") or m.get("scenario")
    if isinstance(command, list):
        command = " ".join(map(str, command))
    status = m.get("status")
    sec.add(
        Paragraph(
            f"Run {run.run_id}: {_utc(run.started_at)} to {_utc(run.ended_at)} ({numbers.seconds(duration, 1)})"
            + (f"; command: `{command}`" if command else "")
            + (f"; status: {status}" if status else "")
            + "."
        )
    )
    if status and status != "complete":
        sec.add(
            Paragraph(
                f"The load generator recorded this run as {status}: the numbers below cover the requests "
                f"that finished before it stopped."
            )
        )
    rows = []
    for e in run.engines.values():
        flags = ", ".join(f"{k}={v}" for k, v in sorted(e.flags.items())) or "not recorded"
        if e.knob_flags:
            flags += "; knobs in this checkout: " + ", ".join(f"{k}={v}" for k, v in sorted(e.knob_flags.items()))
        digest = re.fullmatch(r"(sha256:)?[0-9a-f]{32,}", e.weights or "")
        weights = " ".join(x for x in (e.quantization, e.weights[:19] if digest else e.weights) if x) or "n/a"
        eos = {True: "on", False: "off"}.get(e.ignore_eos, "n/a")
        rows.append([e.title, e.kind, e.url or "n/a", e.version or "n/a", e.model or "n/a", weights, eos, flags])
    sec.add(
        Table(
            ["Engine", "Kind", "URL", "Version", "Model", "Quantization / weights", "ignore_eos", "Flags"],
            rows,
            "Engines (from the manifest)",
        )
    )
    machine = m.get("machine")
    if isinstance(machine, dict) and machine:
        sec.add(Paragraph("Machine: " + ", ".join(f"{k}={v}" for k, v in sorted(machine.items()))))
    elif machine:
        sec.add(Paragraph(f"Machine: {machine}"))
    sets: dict[tuple[str, str], dict[str, Any]] = {}
    for p in run.phases:
        entry = sets.setdefault((p.prompt_set, p.prompt_set_sha256), {"phases": [], "max_tokens": set(), "prompts": 0})
        entry["phases"].append(f"{p.instance}/{p.phase}")
        entry["max_tokens"].add(p.max_tokens)
    for name, sha, count in prompts:
        if (name, sha) in sets:
            sets[(name, sha)]["prompts"] = count
    sec.add(
        Table(
            ["Prompt set", "sha256", "Prompts", "max_tokens", "Phases"],
            [
                [
                    n or "?",
                    h or "n/a",
                    str(v["prompts"]),
                    ", ".join(map(str, sorted(v["max_tokens"]))),
                    ", ".join(v["phases"]),
                ]
                for (n, h), v in sets.items()
            ],
            "Prompt sets (by hash)",
        )
    )
    sec.add(
        Paragraph(
            "Fairness warnings:"
            if warn
            else "Fairness warnings: none (same prompts, same max_tokens, "
            "bursts within the engines' slots, same weights, ignore_eos alike)."
        )
    )
    if warn:
        sec.add(Bullets(warn))
    priority = cpu_priority.report_line(run.manifest.get("trials"))  # CPU_PRIORITY: applied or not, and why
    if priority:
        sec.add(Paragraph(priority))
    _host_noise(run, assessment, sec)
    if run.warnings:
        sec.add(Paragraph("Skipped while loading the run folder:"))
        sec.add(Bullets(run.warnings))
    return sec


def _host_noise(run: Run, assessment: noise.Assessment, sec: Section) -> None:
    """Repetitions, warm-ups, and the host's noise while each phase ran (servescope/host/hostnoise.py)."""
    trials = run.manifest.get("trials") if isinstance(run.manifest.get("trials"), dict) else {}
    if trials:
        reps, isolate = trials.get("repetitions"), trials.get("isolate")
        ran = max((p.repetition for p in run.phases), default=0)
        added = (
            f" ({ran} ran: passes added while a scaling factor was undecided)"
            if isinstance(reps, int) and ran > reps
            else ""
        )
        sec.add(
            Paragraph(
                f"Trials: {_count(reps, 'repetition')}{added}"
                + (", engines and phases interleaved (A B B A ...)" if len(run.engines) > 1 else "")
                + "; co-resident engines: "
                f"{'paused while another is measured' if isolate == 'pause' else 'left running, their CPU measured'}"
                + (
                    f"; after an engine switch the next phase waited (at most {settle:g} s) until the engines "
                    f"measured before went quiet."
                    if isinstance(settle := trials.get("settle_max_s"), (int, float)) and settle > 0
                    else "."
                )
            )
        )
        warm = trials.get("warmup") if isinstance(trials.get("warmup"), dict) else {}
        lines = []
        for instance, w in warm.items():
            if not isinstance(w, dict):
                continue
            latencies = "/".join(
                f"{x:.2f}" if isinstance(x, (int, float)) else "failed" for x in w.get("latencies_s") or []
            )
            state = {True: "stable", False: "NOT stable", None: "off"}.get(w.get("stable"), "?")
            seconds = w.get("seconds")
            took = f" in {seconds:.0f}s" if isinstance(seconds, (int, float)) else ""
            lines.append(f"{instance}: {state} after {_count(w.get('requests'), 'request')}{took} ({latencies} s)")
        if lines:
            rule = next((w.get("rule") for w in warm.values() if isinstance(w, dict) and w.get("rule")), "")
            sec.add(Paragraph(f"Warm-up until stable ({rule}):" if rule else "Warm-up:"))
            sec.add(Bullets(lines))
    if not any(p.noise for p in run.phases):
        sec.add(
            Paragraph("Host noise: not recorded in this run folder (made by a servescope that did not record it yet).")
        )
        return
    rows = []
    for p in run.phases:
        t = assessment.of(p.instance, p.phase)
        n = p.noise if isinstance(p.noise, dict) else {}
        groups = [g for g in n.get("groups") or [] if isinstance(g, dict)]
        top = (
            ", ".join(
                f"{g.get('name')} {numbers.fixed(g.get('cores'), missing_when='not a number')}" for g in groups[:3]
            )
            or "-"
        )
        steal = n.get("steal_share")
        load = (n.get("load1_start"), n.get("load1_end"))
        verdict_ = (
            "left out: " + "; ".join(t.flags)
            if t and t.flags
            else "superseded by a retry"
            if t and t.superseded
            else f"used, up to x{t.slowdown or 1.0:.2f} slower: " + "; ".join(t.noisy)
            if t and t.noisy
            else "ok"
        )
        rows.append(
            [
                run.engines[p.instance].title if p.instance in run.engines else p.instance,
                p.phase,
                numbers.seconds(p.wall_s),
                numbers.fixed(n.get("engine_cores"), missing_when="not a number"),
                f"{numbers.fixed(n.get('foreign_cores'), missing_when='not a number')} ({top})",
                numbers.fixed(n.get("observer_cores"), missing_when="not a number"),
                f"{steal:.1%}" if isinstance(steal, (int, float)) else "n/a",
                " -> ".join(f"{x:.1f}" for x in load if isinstance(x, (int, float))) or "n/a",
                verdict_,
            ]
        )
    sec.add(
        Table(
            [
                "Engine",
                "Phase",
                "Wall",
                "Engine cores",
                "Others' cores (largest)",
                "Exporter/Prometheus",
                "Steal",
                "Load avg",
                "Trusted?",
            ],
            rows,
            "Host noise per phase: CPU cores used on average while the phase ran",
        )
    )
    sec.add(Paragraph("Rule: " + assessment.rule.text() + "."))


def _table(run: Run, rows: list[table.TableRow], figs: list[Figure]) -> Section:
    sec = Section("The sequential-vs-burst table")
    if not rows:
        return sec.add(Paragraph(_sentence(NO_TABLE) + "."))
    sec.add(
        Table(
            table.HEADERS,
            [table.cells(r) for r in rows],
            "Per engine and mode; tokens/s = completion tokens of successful requests / phase wall time",
        )
    )
    repeated = table.repeated_bursts(rows)
    if repeated:
        sec.add(Bullets([f"{title}: {text}" for title, text in repeated.items()]))
    sec.add(Paragraph(table.READING_RULE))
    for fig_ in figs:
        sec.add(fig_)
    sec.add(Paragraph("As `python -m servescope.report --table-only` prints it:"))
    sec.add(Preformatted(table.render_text(rows, run.run_id)))
    return sec


def _latency(groups: list[latency.LatencyGroup], figs: list[Figure]) -> Section:
    sec = Section("Latency")
    sec.add(
        Bullets(
            list(latency.DEFINITIONS.values()) + [f"Percentiles: {stats.PERCENTILE_METHOD}.", latency.FAILURE_POLICY]
        )
    )
    # A scenario run at several loads (a knee, a sweep) has a row per load: pooled, its percentiles are no load's.
    leveled = any(g.level for g in groups)

    def who(g: latency.LatencyGroup) -> list[str]:
        return [g.instance, g.scenario, *([g.level or "-"] if leveled else [])]

    heads = ["Engine", "Scenario", *(["Load"] if leveled else [])]
    if leveled:
        sec.add(Paragraph("One row per load level where a scenario ran at several: a knee's measurements, a sweep's."))
    rows = []
    for g in groups:
        for metric in latency.METRICS:
            s = g.metrics[metric]
            rows.append(
                [
                    *who(g),
                    latency.METRIC_TITLES[metric],
                    str(s["n"]),
                    numbers.milliseconds(s["p50"]),
                    numbers.milliseconds(s["p90"]),
                    numbers.milliseconds(s["p95"]),
                    numbers.milliseconds(s["p99"]),
                    numbers.milliseconds(s["mean"]),
                ]
            )
    sec.add(
        Table(
            [*heads, "Metric", "n", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "mean ms"],
            rows,
            "Client-side latency from the raw records (milliseconds)",
        )
    )
    sec.add(
        Table(
            [*heads, "Requests", "OK", "Failed", "Failures by reason"],
            [
                [
                    *who(g),
                    str(g.requests),
                    str(g.ok),
                    str(g.requests - g.ok),
                    "; ".join(f"{n} x {reason}" for reason, n in g.failures.items()) or "none",
                ]
                for g in groups
            ],
            "Requests and failures",
        )
    )
    sec.add(
        Table(
            [*heads, "n", "p50", "mean", "min", "max"],
            [
                [
                    *who(g),
                    str(g.output_tokens["n"]),
                    numbers.number(g.output_tokens["p50"]),
                    numbers.number(None if g.output_tokens["mean"] is None else round(g.output_tokens["mean"], 1)),
                    numbers.number(g.output_tokens["min"]),
                    numbers.number(g.output_tokens["max"]),
                ]
                for g in groups
            ],
            "Output length (tokens per successful request)",
        )
    )
    notes = [
        f"{g.instance}/{g.scenario}" + (f" at {g.level}" if g.level else "") + f": {n}" for g in groups for n in g.notes
    ]
    if notes:
        sec.add(Bullets(notes))
    for fig_ in figs:
        sec.add(fig_)
    return sec


def _crosscheck(
    run: Run, checks: list[crosscheck.CrossCheck], splits: list[ttft_split.TtftSplit], figs: list[Figure]
) -> Section:
    sec = Section("Engine-side cross-check")
    # The components these engines gave (an engine's own words, Ollama's load or llama.cpp's missing queue, only
    # where that engine ran).
    shown = {k for c in checks for k in c.components_mean_s} or set(crosscheck.COMPONENT_HELP)
    loads = any(_times_model_loads(c.engine) for c in checks)
    sec.add(
        Bullets(
            [f"{k}: {v}" for k, v in crosscheck.COMPONENT_HELP.items() if k in shown]
            + ([f"cold load: Ollama load_duration above {crosscheck.COLD_LOAD_S:g}s"] if loads else [])
        )
    )
    rows = []
    for c in checks:
        comps = ", ".join(f"{k} {numbers.seconds(v)}" for k, v in c.components_mean_s.items()) or "n/a"
        cold = "; ".join(f"{x['phase']}/{x['prompt_id']} {x['load_s']:.2f}s" for x in c.cold_loads) or "none"
        rows.append(
            [
                run.engines[c.instance].title,
                c.source,
                str(c.requests),
                numbers.seconds(c.client_ttft_mean_s),
                numbers.seconds(c.engine_first_token_mean_s),
                numbers.seconds(c.client_e2e_mean_s),
                comps,
                cold if _times_model_loads(c.engine) else "n/a",
            ]
        )
    sec.add(
        Table(
            [
                "Engine",
                "Source",
                "Requests",
                "Client TTFT (mean)",
                "Engine before 1st token (mean)",
                "Client E2E (mean)",
                "Split of the wait (mean)",
                "Cold loads",
            ],
            rows,
        )
    )
    notes = [f"{run.engines[c.instance].title}: {n}" for c in checks for n in c.notes]
    if notes:
        sec.add(Bullets(notes))
    for fig_ in figs:
        sec.add(fig_)
    _ttft_split(run, splits, sec)
    return sec


def _ttft_split(run: Run, splits: list[ttft_split.TtftSplit], sec: Section) -> None:
    """Each request's TTFT split into the engine's parts (bursts by arrival order first), per engine."""
    sec.add(Paragraph("TTFT split, where the engine gives the parts:"))
    given = {k for s in splits for k in s.means_s} or set(ttft_split.PART_HELP)  # the parts these engines gave
    sec.add(Bullets([f"{k}: {v}" for k, v in ttft_split.PART_HELP.items() if k in given]))
    parts = [p for p in ttft_split.PARTS if p in given]
    rows = []
    for s in splits:
        title = run.engines[s.instance].title
        if not s.available:
            rows.append([title, "mean", "n/a", *["n/a"] * len(parts), s.source])
            continue
        share = "n/a" if s.queue_share is None else f"queue {s.queue_share:.0%} of TTFT"
        label = "mean (aggregate)" if s.aggregate else f"mean of {s.count}"
        rows.append(
            [
                title,
                label,
                numbers.milliseconds(s.ttft_mean_s),
                *[numbers.milliseconds(s.means_s.get(p)) for p in parts],
                share,
            ]
        )
        shown = sorted(
            (r for r in s.requests if r.arrival_index is not None), key=lambda r: (r.phase, r.arrival_index)
        )[:12]
        for r in shown:
            rows.append(
                [
                    title,
                    f"{r.phase} #{r.arrival_index + 1}",
                    numbers.milliseconds(r.ttft_s),
                    *[numbers.milliseconds(r.parts_s.get(p)) for p in parts],
                    "",
                ]
            )
    sec.add(
        Table(
            ["Engine", "Request", "TTFT ms", *[f"{p.replace('_', ' ')} ms" for p in parts], "Note"],
            rows,
            "Per engine: the mean split, then the burst requests by arrival order (all requests in report.json)",
        )
    )
    notes = [
        f"{run.engines[s.instance].title}: {n}" for s in splits for n in ([s.source] if s.available else []) + s.notes
    ]
    if notes:
        sec.add(Bullets(notes))


def _gauges(run: Run, report: gauges.GaugeReport, figs: list[Figure]) -> Section:
    sec = Section("Gauges over the run")
    if not report.available:
        return sec.add(Paragraph(f"No gauge data: {report.reason}."))
    sec.add(
        Paragraph(
            f"From {report.reason} over {_utc(report.window[0])} to {_utc(report.window[1])}: "
            f"{', '.join(series.LEVER_GAUGES)}. Gauges are snapshots: a queue shorter than the interval between "
            f"two reads can be missed, and a read that got no value is missing, never filled in."
        )
    )
    rows = []
    for instance, eg in report.engines.items():
        fleet = report.fleet_of(instance)
        if fleet is not None and fleet.behind is None:
            continue  # one of many of its kind: the fleet's summary below stands for it
        per_phase = "; ".join(
            f"{ph}: {numbers.number(pk.get(series.REQUESTS_RUNNING))}/{numbers.number(pk.get(series.REQUESTS_WAITING))}/"
            f"{numbers.percent(pk.get(series.KV_CACHE_USAGE))}"
            for ph, pk in eg.phase_peaks.items()
        )
        rows.append(
            [
                run.engines[instance].title,
                numbers.number(eg.peaks.get(series.REQUESTS_RUNNING)),
                numbers.number(eg.peaks.get(series.REQUESTS_WAITING)),
                numbers.percent(eg.peaks.get(series.KV_CACHE_USAGE)),
                per_phase or "n/a",
            ]
        )
    if rows:
        sec.add(
            Table(
                ["Engine", "Peak running", "Peak waiting", "Peak KV usage", "Per phase (running/waiting/KV)"],
                rows,
                "Peaks over the run",
            )
        )
    for fleet in report.fleets:
        _fleet(run, fleet, sec)
    coverage = [
        [
            run.engines[instance].title,
            c.phase,
            numbers.seconds(c.wall_s, 2),
            str(c.samples),
            str(c.missing),
            "; ".join(c.reasons) or "none",
        ]
        for instance, eg in report.engines.items()
        if (fleet := report.fleet_of(instance)) is None or fleet.behind is not None
        for c in eg.coverage.values()
    ]
    if coverage:
        sec.add(
            Table(
                ["Engine", "Phase", "Wall", "Samples", "Missing", "Why missing"],
                coverage,
                "Samples inside each load phase (the run's own samples)",
            )
        )
    proxied = [
        f"{info.title}: running and waiting are what the exporter's proxy observed of the requests it relayed "
        f'(source="proxy"): running = answers streaming, waiting = requests without their first chunk yet (queued '
        f"for a slot, loading the model or evaluating the prompt alike); Ollama reports neither, and its verdict does "
        f"not rest on them alone"
        if info.route != "direct" and report.engines.get(instance) and report.engines[instance].series
        else f"{info.title}: running and waiting not observed: "
        + (
            "this run went to Ollama directly, not through the exporter's proxy (what it counted is other traffic)"
            if info.route == "direct"
            else "no request of this run went through the exporter's proxy, or nothing read it"
        )
        for instance, info in run.engines.items()
        if _proxied(info.kind)
    ]
    if proxied:
        sec.add(Bullets(proxied))
    scraped = [
        f"{run.engines[i].title}: Prometheus' scrapes saw peak running {numbers.number(eg.prometheus_peaks.get(series.REQUESTS_RUNNING))}, "
        f"waiting {numbers.number(eg.prometheus_peaks.get(series.REQUESTS_WAITING))} over the same run"
        for i, eg in report.engines.items()
        if eg.prometheus_peaks
    ]
    if scraped:
        sec.add(Bullets(scraped))
    if report.warnings:
        sec.add(Bullets(report.warnings))
    for fig_ in figs:
        sec.add(fig_)
    return sec


def _fleet(run: Run, fleet: gauges.Fleet, sec: Section) -> None:
    """Many instances of one kind: the spread of their peaks, how many queued, the busiest, not a row each."""
    where = f" behind {run.engines[fleet.behind].title}" if fleet.behind else ""
    spread = "; ".join(
        f"{name} {fmt(low)} / {fmt(mid)} / {fmt(high)}"
        for name, gauge, fmt in (
            ("running", series.REQUESTS_RUNNING, numbers.number),
            ("waiting", series.REQUESTS_WAITING, numbers.number),
            ("KV usage", series.KV_CACHE_USAGE, numbers.percent),
        )
        if (s := fleet.spread(gauge)) is not None
        for low, mid, high in (s,)
    )
    total = (
        f"The row of {run.engines[fleet.behind].title} above and its plot show" if fleet.behind else "The plot shows"
    )
    sec.add(
        Paragraph(
            f"A fleet of {len(fleet.members)} {fleet.engine} instances{where}: {len(fleet.queued)} of them had "
            f"requests waiting at some read. Their peaks over the run, lowest / median / highest: "
            f"{spread or 'none read'}. {total} their sum per read (derived: running and waiting added up, KV usage "
            f"the fullest instance)."
        )
    )
    top = fleet.members[: thresholds.FLEET_TOP_N]
    sec.add(
        Table(
            ["Instance", "Peak running", "Peak waiting", "Peak KV usage", "Reads with requests waiting"],
            [
                [
                    m.instance,
                    numbers.number(m.peaks.get(series.REQUESTS_RUNNING)),
                    numbers.number(m.peaks.get(series.REQUESTS_WAITING)),
                    numbers.percent(m.peaks.get(series.KV_CACHE_USAGE)),
                    numbers.percent(m.waiting_share),
                ]
                for m in top
            ],
            f"The {len(top)} busiest of the {len(fleet.members)} (by peak waiting, then peak running)",
        )
    )


def _verdict(run: Run, verdicts: list[verdict.Verdict], kv: list[verdict.KvArithmetic]) -> Section:
    sec = Section("Verdict: which knob to move")
    sec.add(Paragraph(verdict.rule(_kinds(run))))  # the engines that ran, not every one servescope knows
    sec.add(
        Table(
            ["Engine", "Verdict", "Evidence", "Where the evidence disagrees", "Not concluded from (rerun)"],
            [
                [
                    run.engines[v.instance].title,
                    v.text,
                    (v.evidence or "n/a") + (f" ({v.busy})" if v.busy else ""),
                    v.disagreement or "-",
                    "; ".join(v.left_out) or "-",
                ]
                for v in verdicts
            ],
        )
    )
    lines = [f"{run.engines[a.instance].title}: {line}" for a in kv for line in a.lines]
    sec.add(Paragraph("KV cache arithmetic (the reference page's section 3, from the servescope_kv_cache_* series):"))
    sec.add(
        Bullets(lines)
        if lines
        else Paragraph(
            "No KV cache series (servescope_kv_cache_block_size_tokens, "
            "_blocks, _capacity_tokens, _max_concurrency) for this run's window."
        )
    )
    return sec


def _sweeps(
    run: Run, sweeps_: list[sweep.Sweep], drains: list[sweep.BurstDrain], have_gauges: bool, figs: list[Figure]
) -> Section:
    sec = Section("Sweeps and bursts")
    if sweeps_:
        sec.add(Paragraph(sweep.KNEE_RULE + "."))
        for sw in sweeps_:
            sec.add(
                Table(
                    [
                        "Concurrency",
                        "Requests",
                        "Failed",
                        "Wall",
                        "tokens/s",
                        "req/s",
                        "TTFT p50",
                        "TTFT p95",
                        "E2E p50",
                        "E2E p95",
                    ],
                    [
                        [
                            str(lv.concurrency),
                            str(lv.requests),
                            str(lv.failed),
                            numbers.seconds(lv.wall_s),
                            "n/a" if lv.tokens_per_s is None else f"{lv.tokens_per_s:.1f}",
                            "n/a" if lv.requests_per_s is None else f"{lv.requests_per_s:.2f}",
                            numbers.seconds(lv.ttft["p50"]),
                            numbers.seconds(lv.ttft["p95"]),
                            numbers.seconds(lv.e2e["p50"]),
                            numbers.seconds(lv.e2e["p95"]),
                        ]
                        for lv in sw.levels
                    ],
                    f"{run.engines[sw.instance].title}, {sw.scenario}: {sw.knee_text}",
                )
            )
    elif not drains:
        sec.add(Paragraph(_sentence(NO_SWEEP) + "."))
    if drains:
        sec.add(Paragraph(sweep.DRAIN_RULE + "."))
        sec.add(
            Table(
                [
                    "Engine",
                    "Burst",
                    "Size",
                    "Wall",
                    "Queue drained (client)",
                    "Queue drained (gauges)",
                    "TTFT by arrival order",
                ],
                [
                    [
                        run.engines[d.instance].title,
                        d.phase,
                        str(d.burst_size),
                        numbers.seconds(d.wall_s),
                        numbers.seconds(d.drain_s),
                        numbers.seconds(d.gauge_drain_s)
                        if d.gauge_drain_s is not None
                        else ("n/a (no waiting seen)" if have_gauges else "n/a (no gauge data)"),
                        " / ".join(
                            f"#{i + 1} {numbers.seconds(t)}" if t is not None else f"#{i + 1} failed"
                            for i, t in d.ttft_by_arrival
                        ),
                    ]
                    for d in drains
                ],
            )
        )
    for fig_ in figs:
        sec.add(fig_)
    return sec


def _compare(deltas: list[compare.Delta], how: str, baseline: Run | None, figs: list[Figure]) -> Section:
    sec = Section("Comparison")
    sec.add(
        Paragraph(
            (f"Against baseline run {baseline.run_id}" if baseline else "No baseline run given") + f"; matching: {how}."
        )
    )
    if not deltas:
        return sec
    sec.add(Paragraph(compare.METHOD))

    def val(metric: str, v: float | None) -> str:
        if v is None:
            return "n/a"
        if metric == "output_tokens":
            return numbers.number(round(v, 1))  # tokens: 48, not 48.0
        return numbers.milliseconds(v, unit=" ms")

    sec.add(
        Table(
            [
                "Current",
                "Baseline",
                "Scenario",
                "Metric",
                "Paired",
                "n (cur/base)",
                "Median current",
                "Median baseline",
                "Delta",
                "95% CI",
                "Change",
            ],
            [
                [
                    d.current,
                    d.baseline,
                    d.scenario,
                    latency.METRIC_TITLES.get(d.metric, d.metric),
                    "yes" if d.paired else "no",
                    f"{d.n_current}/{d.n_baseline}",
                    val(d.metric, d.median_current),
                    val(d.metric, d.median_baseline),
                    val(d.metric, d.delta),
                    f"[{val(d.metric, d.ci_low)}, {val(d.metric, d.ci_high)}]" if d.ci_low is not None else "n/a",
                    "n/a" if d.delta_pct is None else f"{d.delta_pct:+.1f}%" + (" *" if d.excludes_zero else ""),
                ]
                for d in deltas
            ],
            "* = the 95% CI excludes zero",
        )
    )
    for fig_ in figs:
        sec.add(fig_)
    return sec


def _kinds(run: Run) -> list[str]:
    """The engine kinds this run measured, in its order: a rule paragraph names these and no other."""
    return list(dict.fromkeys(e.kind for e in run.engines.values()))


def _times_model_loads(kind: str) -> bool:
    """Whether the engine's own durations time each request's model load (Ollama's load_duration)."""
    timings = crosscheck.timings_of(kind)
    return timings is not None and timings.form == DURATIONS


def _proxied(kind: str) -> bool:
    """Whether the engine's running and waiting are what servescope's proxy observed (Ollama reports neither)."""
    adapter = engines.ENGINES.get(kind)
    return adapter is not None and adapter.proxy_port_env is not None


def _count(n: object, noun: str) -> str:
    """A count from the manifest (a number, or missing: "? requests") and its noun, agreeing."""
    return (
        words.count(n, noun) if isinstance(n, (int, float)) else f"{n if n is not None else '?'} {words.plural(noun)}"
    )
