"""The report's first section, and the lines `make up` ends with: per engine, at most ten lines of conclusions.

Each line comes from an analysis the report has already made, in the words of its own section:
the scaling factor with its CI and reading (the comparison table), the knob to move and its
evidence in one clause (the verdict), the knee and what ran out above it (knee.json, the binding
rule), SLO attainment with the objective, an SLO term below the engine's floor (it failed at the
run's lowest load: no load meets it here), and the flags (phases left out as noisy, fairness
warnings, prefix-cache reuse the workload did not ask for).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from servescope.judgements import knee_answer, slo
from servescope.report import goodput, table, verdict, workloads
from servescope.report.load import Run, knee_of
from servescope.report.noise import Assessment, worst_slowdown
from servescope.report.render import Bullets, Paragraph, Section
from servescope.text import words

TITLE = "Summary"
MAX_LINES = 10  # per engine: a screen for every engine, the details in the sections below
FAIRNESS_SHOWN = 2  # fairness warnings said in the summary; the Setup section lists them all
LISTED = 3  # phases named in a flag's line; the rest counted ("and 2 more")


@dataclass
class EngineSummary:
    """One engine instance's lines in the report's first section, and the SLO terms below its floor."""

    instance: str
    title: str
    lines: list[str] = field(default_factory=list)
    floors: list[str] = field(default_factory=list)  # SLO terms below this engine's floor here, each in one line


def build(
    run: Run,
    rows: list[table.TableRow],
    verdicts: list[verdict.Verdict],
    spec: slo.SloSpec,
    good: list[goodput.PhaseGoodput],
    assessment: Assessment,
    warn: list[str],
    work: workloads.WorkloadReport,
) -> list[EngineSummary]:
    knee = knee_of(run)
    out = []
    for instance, info in run.engines.items():
        s = EngineSummary(instance, info.title or instance)
        for row in rows:
            if row.instance == instance and row.scaling_factor is not None:
                ci = table.ci_text(row.scaling_ci, "x")
                more = ""
                if row.more_repetitions:  # derived: each pass costs at least its two phases' walls here
                    per_pass = (row.wall_s or 0.0) + (row.matched_wall_s or 0.0)
                    took = f", at least {row.more_repetitions * per_pass / 60:.1f} min of phases" if per_pass else ""
                    more = (
                        f"; about {words.count(row.more_repetitions, 'more repetition')} on this host{took} "
                        f"would settle it (LOADGEN_REPETITIONS, LOADGEN_MAX_REPETITIONS)"
                    )
                s.lines.append(
                    f"Scaling: {row.scaling_factor:.2f}x{ci} for a burst of {row.concurrency} against the same prompts "
                    f"one after another: {row.reading}{more}"
                )
            elif row.instance == instance and row.refusal:
                s.lines.append(f"Scaling: not computed ({_one_line(row.refusal)})")
        if knee and knee.get("instance") == instance:  # a knee run's answer, before the knob to move
            s.lines.append(_knee_line(knee))
        v = next((v for v in verdicts if v.instance == instance), None)
        if v is not None:
            s.lines.append(f"Verdict: {_one_line(v.text)}")
        mine = [g for g in good if g.instance == instance]
        if mine:
            met = sum(1 for g in mine if g.result.meets)
            shares = [g.result.attainment for g in mine if g.result.attainment is not None]
            spread = f", attainment {min(shares):.0%} to {max(shares):.0%}" if shares else ""
            s.lines.append(
                f"SLOs {spec.text} (objective {spec.objective:.0%} of requests): met in {met} of {len(mine)} "
                f"phases{spread}"
            )
            s.floors = goodput.floors(run, instance, mine, spec)
            s.lines += s.floors
        s.lines += _flags(instance, assessment, warn, work, run.manifest)
        if len(s.lines) > MAX_LINES:  # said, never dropped unsaid: the sections below hold every one
            s.lines = s.lines[: MAX_LINES - 1] + [
                f"{words.count(len(s.lines) - MAX_LINES + 1, 'more line')}: the sections below say them"
            ]
        out.append(s)
    return out


def _knee_line(knee: dict[str, Any]) -> str:
    b = knee.get("binding") or {}

    def load(value: float) -> str:  # "1 user", "3 users", "0.5 req/s"
        return words.load(value, knee["unit"])

    if knee["status"] == "found" and knee.get("unsettled"):  # stopped before its rule settled it: a range
        found = (
            f"{knee_answer.span(knee)} (failed at {load(knee['first_failing'])}), {knee_answer.unsettled_words(knee)}"
        )
    elif knee["status"] == "found":
        found = f"{load(knee['knee'])} (fails at {load(knee['first_failing'])})"
    elif knee["status"] == "meets the SLOs up to the highest load":
        found = f"at least {load(knee['knee'])} (the highest load tried)"
    elif knee["status"] == "fails at the lowest load":
        found = f"none: the SLOs fail at {load(knee['first_failing'])}"
    else:
        found = knee["status"]
    ran_out = (
        f"; above it: {_one_line(b['advice'])}" if b.get("advice") and knee.get("first_failing") is not None else ""
    )
    return f"Knee: {found}{ran_out}"


def _flags(
    instance: str, assessment: Assessment, warn: list[str], work: workloads.WorkloadReport, manifest: dict
) -> list[str]:
    flags = []
    busy = assessment.noisy(instance)
    if busy:
        flags.append(busy_line(busy, assessment))
    elif (before := busy_before(manifest, assessment)) is not None:
        flags.append(before)
    flagged = assessment.flagged(instance)
    if flagged:
        flags.append(
            f"{words.count(len(flagged), 'phase')} left out for outlier requests, rerun "
            f"{words.noun(len(flagged), 'it', 'them')}: {_listed([t.phase for t in flagged])}"
        )
    cached = [r.phase for r in work.reuse if r.instance == instance and r.unasked]
    if cached:
        flags.append(f"prefix-cache reuse the workload did not ask for in {_listed(cached)}: latency of a cache")
    fair = [w for w in warn if instance in w]
    flags += [f"fairness: {_one_line(w)}" for w in fair[:FAIRNESS_SHOWN]]
    if len(fair) > FAIRNESS_SHOWN:
        flags.append(f"fairness: {words.count(len(fair) - FAIRNESS_SHOWN, 'more warning')} in the Setup section")
    return [f"Flag: {f}" for f in flags]


def busy_before(manifest: dict, assessment: Assessment) -> str | None:
    """The host was busy before the run (loadgen/trials.NoiseKeeper.baseline: others used NOISE_GROUP_CPU_CORES or more)
    though no phase was noisy: the CPU priority kept the others off the engines while measured. None on a quiet host."""
    trials = manifest.get("trials") if isinstance(manifest.get("trials"), dict) else {}
    before = trials.get("host_before") if isinstance(trials.get("host_before"), dict) else None
    cores = before.get("foreign_cores") if before else None
    # The one-program bar, not the all-programs one: a neighbour busy 2 s of every 5 averages 0.4 of a core.
    if not isinstance(cores, (int, float)) or cores < assessment.rule.group_cores:
        return None
    groups = [g for g in before.get("groups") or [] if isinstance(g, dict) and isinstance(g.get("cores"), (int, float))]
    named = ", ".join(f"{g.get('name')} {g['cores']:.2f}" for g in groups)
    top = f" ({named})" if named else ""
    priority = trials.get("cpu_priority") if isinstance(trials.get("cpu_priority"), dict) else {}
    kept = (
        "the CPU priority kept them off the engines while measured"
        if priority.get("applied")
        else "none while measured"
    )
    return f"busy host: other programs used {cores:.2f} cores just before the run{top}; no phase was noisy ({kept})"


def busy_line(busy: list, assessment: Assessment) -> str:
    """The host noise the engine's figures carry: how many phases, what took the CPU, the knobs that decide."""
    used = sorted(
        (g for t in busy for g in (t.noise or {}).get("groups") or [] if isinstance(g, dict)),
        key=lambda g: -(g.get("cores") or 0),
    )
    top = f" (largest: {used[0].get('name')} {used[0].get('cores'):.2f} cores)" if used else ""
    worst = worst_slowdown(busy)
    rule = assessment.rule
    return (
        f"busy host: {words.count(len(busy), 'phase')} measured while other programs took the CPU{top}, each up to "
        f"x{worst:.2f} slower; kept, the estimates carry it (NOISE_FOREIGN_CPU_CORES={rule.foreign_cores:g}, "
        f"NOISE_GROUP_CPU_CORES={rule.group_cores:g} decide what is noisy)"
    )


def _one_line(text: str) -> str:
    """The text whole, on one line: a line of the summary is never cut (the sections below hold the details, but a
    reader must not have to go there to finish a sentence)."""
    return " ".join(str(text).split())


def _listed(names: list[str]) -> str:
    """The first LISTED names, then how many more ("a, b, c and 2 more"): a list is shortened only by saying so."""
    shown = ", ".join(names[:LISTED])
    return shown if len(names) <= LISTED else f"{shown} and {len(names) - LISTED} more"


def section(summaries: list[EngineSummary]) -> Section:
    sec = Section(TITLE)
    if not summaries:
        sec.add(Paragraph("No engine in this run."))
    for s in summaries:
        sec.add(Paragraph(f"**{s.title}**"))
        sec.add(Bullets(s.lines or ["nothing measured"]))
    return sec


def text(summaries: list[EngineSummary]) -> str:
    """The same lines for a terminal (`make up`, `python -m servescope.report`)."""
    out = []
    for s in summaries:
        out.append(f"{s.title}:")
        out += [f"  {line}" for line in s.lines or ["nothing measured"]]
    return "\n".join(out) + "\n"


def to_json(summaries: list[EngineSummary]) -> list[dict[str, Any]]:
    return [asdict(s) for s in summaries]
