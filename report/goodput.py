"""Goodput under the SLOs per engine and phase (attainment, good requests/s, good tokens/s, the SLO missed most), open-loop honesty, the knee.

The SLOs are the run's own (the --slo / SLO knob it ran with, from its manifest) unless the report is
asked for others (`python -m report --slo ...`); the rule is servescope/slo.py's, the one the client
/metrics counters and the knee search use.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from report import schedule
from report.load import Run
from report.render import Bullets, Paragraph, Section, Table
from servescope import slo
from servescope.runfolder import KNEE


@dataclass
class PhaseGoodput:
    instance: str
    engine: str
    phase: str
    scenario: str
    result: slo.SloResult


def spec_of(run: Run, override: str | None = None) -> slo.SloSpec:
    """The spec asked for, else the one the run recorded, else the knobs' (servescope/slo.resolve).

    A manifest is the run's word, not the user's: one whose SLO cannot be read costs the run its own
    SLO (the knobs' is used), never the report; a bad --slo given here is the user's, and said so.
    """
    flags = run.manifest.get("flags")
    flags = flags if isinstance(flags, dict) else {}
    text, share = flags.get("slo"), flags.get("slo_attainment")
    text = text if isinstance(text, str) and text.strip() else None
    share = share if isinstance(share, (int, float, str)) and not isinstance(share, bool) and share != "" else None
    if override:
        return slo.resolve(override, share)
    try:
        return slo.resolve(text, share)
    except slo.SloError:
        return slo.resolve()


def build(run: Run, spec: slo.SloSpec) -> list[PhaseGoodput]:
    out = []
    for p in run.phases:
        records = run.requests_of(p.instance, p.phase)
        out.append(PhaseGoodput(p.instance, p.engine, p.phase, p.scenario, slo.evaluate(spec, records, p.wall_s)))
    return out


def knee_of(run: Run) -> dict[str, Any] | None:
    path = run.path / KNEE
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def _rate(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def section(
    run: Run, spec: slo.SloSpec, rows: list[PhaseGoodput], checks: list[schedule.ScheduleCheck], title: str
) -> Section:
    sec = Section(title)
    sec.add(
        Paragraph(
            f"{spec.describe()}. A request is good when it succeeded and met every term on its own; attainment is the "
            f"share of good requests, goodput the good requests (and their output tokens) per second of the phase's "
            f"wall time. A percentile term holds for a phase when that share of its requests (ITL: of its gaps) meet "
            f"the limit, failures counting as misses (servescope/slo.py)."
        )
    )
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
                ],
                [
                    [
                        g.instance,
                        g.phase,
                        str(g.result.requests),
                        _pct(g.result.attainment),
                        _rate(g.result.goodput_rps),
                        _rate(g.result.good_tokens_per_s),
                        "yes" if g.result.meets else "no",
                        g.result.failed_most or "-",
                    ]
                    for g in rows
                ],
            )
        )
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
                        _s(c.lag["p50"]),
                        _s(c.lag["p99"]),
                        _s(c.ttft_from_send["p99"]),
                        _s(c.ttft_from_schedule["p99"]),
                        _s(c.e2e_from_send["p99"]),
                        _s(c.e2e_from_schedule["p99"]),
                        "BEHIND SCHEDULE" if c.behind else "ok",
                    ]
                    for c in checks
                ],
            )
        )
        behind = [c.text() for c in checks if c.behind]
        if behind:
            sec.add(Bullets(behind))
    knee = knee_of(run)
    if knee:
        sec.add(Paragraph(_knee_text(knee)))
    return sec


def _knee_text(knee: dict[str, Any]) -> str:
    unit = knee["unit"]
    if knee["status"] == "found":
        found = f"the knee is {knee['knee']:g} {unit} ({knee['first_failing']:g} {unit} fails)"
    elif knee["status"] == "fails at the lowest load":
        found = f"no knee: the SLOs fail even at {knee['first_failing']:g} {unit}"
    else:
        found = f"the SLOs hold up to {knee['knee']} {unit}, the highest load tried"
    b = knee["binding"]
    if knee["binding_level"] is None:
        at = ""
    elif knee["first_failing"] is not None:
        at = f"; at {knee['binding_level']:g} {unit} the binding resource is {b['advice']} ({b['evidence']})"
    else:
        at = f"; at {knee['binding_level']:g} {unit}, the highest load tried, {b['evidence']}"
    return f"Knee search over {knee['over']} ({len(knee['probes'])} measurements, knee.json): {found}{at}."


def _s(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}s"


def to_json(spec: slo.SloSpec, rows: list[PhaseGoodput], checks: list[schedule.ScheduleCheck], run: Run) -> dict:
    return {
        "spec": spec.text,
        "objective": spec.objective,
        "phases": [{**{k: v for k, v in asdict(g).items() if k != "result"}, **asdict(g.result)} for g in rows],
        "schedule": schedule.to_json(checks),
        "knee": knee_of(run),
    }
