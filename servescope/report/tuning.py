"""The report of a `make tune` folder: the trajectory (knob values, knee, goodput with its CI, binding resource) as a table and a plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servescope.report import render
from servescope.report.painter import Painter
from servescope.report.render import Bullets, Document, Figure, Paragraph, Section, Table
from servescope.text import numbers

TUNE = "tune.json"  # written by servescope/stack/tune.py
RULE = (
    "Each step raises the knob the binding resource names (servescope/judgements/binding.py) and restarts the engine; the same "
    "workload (the lowest load that failed the SLOs, same prompts, max_tokens and duration) is measured again. One "
    "estimator decides and fills this table: goodput = good requests per second of the measurements' wall time (a "
    "failed request is not good, and its time counts). Its 95% CI on the difference comes from batch means: each "
    "measurement cut into slices of about two request times, the good completions per slice resampled (seeded "
    "bootstrap). While the CI holds zero the measurement is extended, one measurement at a time on the less certain "
    "setting, up to TUNE_MAX_MEASUREMENTS each; then a change is kept (CI above zero), reverted (below zero) or "
    "inconclusive (the old setting stays). Expected is what the change should buy if the binding resource were the "
    "only limit; measured is the goodput ratio. A measurement the engine was absent for is never concluded from. The "
    "loop stops at a resource no knob adds (compute, client, an SLO below the floor, an engine fault, undecided) or "
    "when nothing fails below the knee's highest load."
)


def is_tune_folder(path: Path) -> bool:
    return (Path(path) / TUNE).is_file()


def rows(data: dict[str, Any]) -> list[list[str]]:
    out = []
    for s in data["steps"]:
        d = s.get("delta") or {}
        ci = (
            f"{numbers.trimmed(d.get('delta'))} [{numbers.trimmed(d.get('ci_low'))}, {numbers.trimmed(d.get('ci_high'))}]"
            if d.get("delta") is not None
            else "-"
        )
        expected = s.get("expected") or {}
        measures = s.get("measurements") or {}
        out.append(
            [
                str(s["step"]),
                " ".join(f"{k}={v}" for k, v in s["knobs"].items()),
                s["decision"],
                numbers.trimmed(s.get("knee")),
                numbers.trimmed(s.get("first_failing")),
                s.get("binding") or "-",
                numbers.trimmed(s.get("workload")),
                numbers.trimmed(s.get("goodput_rps")),
                ci,
                f"{measures.get('before', '-')} / {measures.get('after', '-')}" if measures else "-",
                f"x{expected['factor']:.1f}" if expected.get("factor") else "-",
                f"x{expected['measured_ratio']:.2f}" if expected.get("measured_ratio") else "-",
                numbers.trimmed(s.get("good_tokens_per_s"), 1),
            ]
        )
    return out


HEADERS = [
    "step",
    "knobs",
    "decision",
    "knee",
    "fails at",
    "binding resource",
    "judged at",
    "goodput req/s",
    "delta goodput req/s [95% CI]",
    "measurements before / after",
    "expected",
    "measured",
    "good tok/s",
]


def lines(data: dict[str, Any]) -> list[str]:
    """The trajectory for the terminal."""
    table = [HEADERS, *rows(data)]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADERS))]
    out = [f"tune trajectory for {data['engine']}:"]
    out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    out.append(f"stopped: {data['stop_reason']}")
    out.append("best: " + " ".join(f"{k}={v}" for k, v in data["best_knobs"].items()))
    return out


def figure_data(data: dict[str, Any]) -> dict | None:
    """What servescope/report/plots.py's tune figure draws: per step, its knee, and its goodput at the judged load with the CI
    of the change drawn from the old setting's goodput (kept settings solid, reverted ones hollow)."""
    steps = data["steps"]
    if not steps:
        return None
    points = []
    for s in steps:
        d = s.get("delta") or {}
        has_ci = d.get("ci_low") is not None and d.get("baseline") is not None
        points.append(
            {
                "step": s["step"],
                "knee": s.get("knee"),
                "goodput_rps": s.get("goodput_rps"),
                "kept": s["decision"] in ("start", "kept"),  # reverted, inconclusive, refused: hollow
                "label": s["decision"]
                + (f" @ {numbers.trimmed(s.get('workload'))}" if s.get("workload") is not None else ""),
                "ci": (d["baseline"] + d["ci_low"], d["baseline"] + d["ci_high"]) if has_ci else None,
            }
        )
    return {"steps": points}


def build(folder: Path) -> tuple[Document, dict[str, Any]]:
    data = json.loads((Path(folder) / TUNE).read_text())
    drawing, figure = figure_data(data), None
    if drawing is not None:  # drawn by the report's painter, as every figure is (servescope/report/painter.py)
        painter = Painter.shared()
        figure = painter.collect({"tune": painter.draw("tune", drawing, Path(folder) / "tune.png")})["tune"]
    sec = Section("Tune trajectory")
    sec.add(Paragraph(RULE))
    sec.add(
        Table(
            HEADERS,
            rows(data),
            caption="One row per setting tried; `judged at` is the load its goodput was measured at.",
        )
    )
    if figure:
        sec.add(Figure(figure, "Knee per step, and goodput at the load each change was judged at."))
    sec.add(
        Bullets(
            [
                f"stopped: {data['stop_reason']}",
                "started from: " + " ".join(f"{k}={v}" for k, v in data["start_knobs"].items()),
                "best: " + " ".join(f"{k}={v}" for k, v in data["best_knobs"].items()),
                "runs (each a run folder with its own `make report RUN=...`): "
                + ", ".join(r for s in data["steps"] for r in s.get("runs", [])),
            ]
            + [f"step {s['step']} binding evidence: {s['evidence']}" for s in data["steps"] if s.get("evidence")]
        )
    )
    doc = Document("servescope tune", f"{data['engine']} at {data['url']} ({Path(folder).name})", [sec])
    return doc, {"tune": data, "plots": ["tune.png"] if figure else []}


def write(folder: Path) -> list[Path]:
    doc, numbers = build(folder)
    return render.write(Path(folder), doc, numbers)
