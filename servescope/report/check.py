"""`python -m servescope.report check`: the regression gate, a candidate run against a baseline run, each metric's change with its bootstrap CI."""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from servescope.contracts import thresholds
from servescope.contracts.runfolder import PHASES, PhaseRecord, write_file
from servescope.contracts.settings import ReportSettings
from servescope.judgements import slo, stats
from servescope.report import compare, goodput, latency, load, noise, run_slo
from servescope.report.load import Run
from servescope.text import numbers

MARKDOWN, JUNIT = "check.md", "check.xml"
TOLERANCE_KNOB = "CHECK_TOLERANCE_PCT"
LATENCY = ("ttft_s", "itl_s", "e2e_s")
TAILS = (95, 99)
WORSE, BETTER, SAME, NOT_GATED = "worse", "better", "no change", "not gated"
SHOWN_WORSE = 6  # named on the headline line; the table and check.md show every one

EXIT_CODES = f"""exit codes:
  0  no gated metric got worse beyond the tolerance (identical runs, noise, improvements)
  1  a gated metric got worse: its {stats.CONFIDENCE:.0%} bootstrap CI excludes zero on the worse side (latency up,
     goodput or SLO attainment down) and the change is more than {TOLERANCE_KNOB} percent of the baseline's value
  2  the runs cannot be compared: a missing or unreadable run folder, no phase records, an SLO a manifest records
     that cannot be read (give --slo), different SLOs, different prompt sets or max_tokens, other levels of one
     scenario, nothing in common; or a bad option or knob (one line on stderr)

A candidate's engine instance or scenario that the other run lacks is listed, not gated. Writes check.md and
check.xml (JUnit: one testcase per gated metric, a <failure> for each worse one) into the candidate's run folder."""

RULE = (
    f"worse: the {stats.CONFIDENCE:.0%} bootstrap CI of the change ({stats.BOOTSTRAP_RESAMPLES} resamples, seed "
    f"{stats.BOOTSTRAP_SEED}) excludes zero on the worse side (latency up; goodput, attainment down) and the change is "
    f"more than {TOLERANCE_KNOB} percent of the baseline's value; better: the same on the other side; no change: "
    f"anything else. Medians: the comparison section's deltas (servescope/report/compare.py), paired by prompt where both runs "
    f"sent the same prompts. p95 / p99: each side resampled on its own, gated only with at least "
    f"{thresholds.CHECK_TAIL_BEYOND} samples beyond the percentile on each side (thresholds.CHECK_TAIL_BEYOND). "
    f"Goodput: good requests per second of the phases' wall, the phases cut into slices about two requests long "
    f"(servescope/judgements/slo.good_slices, as `make tune` measures it), slices resampled; attainment: the share of good "
    f"requests, requests resampled (stats.bootstrap_ratio_delta); good: servescope/report/goodput.py's rule under the run's SLOs."
)


class CheckError(Exception):
    """The runs cannot be compared: one line, exit 2."""


@dataclass
class Gate:
    """One metric of one engine instance at one level, baseline against candidate, and the verdict on it."""

    unit: str  # "vllm sweep c8"
    metric: str  # "TTFT p95"
    higher_is_worse: bool
    kind: str  # "s", "req/s", "share": how its values read
    baseline: float | None
    candidate: float | None
    delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n_baseline: int = 0
    n_candidate: int = 0
    paired: bool = False
    why: str = ""  # not empty: why it is not gated
    verdict: str = NOT_GATED

    @property
    def delta_pct(self) -> float | None:
        if self.delta is None or not self.baseline:
            return None
        return 100.0 * self.delta / abs(self.baseline)

    def judge(self, tolerance_pct: float) -> None:
        if not self.why and (self.delta is None or self.ci_low is None or self.ci_high is None):
            self.why = "not measured on both sides"
        if self.why:
            self.verdict = NOT_GATED
            return
        up, down = self.ci_low > 0, self.ci_high < 0
        pct = self.delta_pct
        beyond = abs(pct) > tolerance_pct if pct is not None else self.delta != 0
        if beyond and (up and self.delta > 0 or down and self.delta < 0):
            self.verdict = WORSE if up == self.higher_is_worse else BETTER
        else:
            self.verdict = SAME

    @property
    def case(self) -> str:
        return f"{self.unit}: {self.metric}"


@dataclass
class Check:
    """The regression gate's answer: a candidate run against a baseline, gate by gate, with what was not compared."""

    baseline: str
    candidate: str
    slo: str
    tolerance_pct: float
    gates: list[Gate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was not compared, and why; phases flagged noisy

    @property
    def gated(self) -> list[Gate]:
        return [g for g in self.gates if g.verdict != NOT_GATED]

    @property
    def worse(self) -> list[Gate]:
        return [g for g in self.gates if g.verdict == WORSE]


Groups = dict[tuple[str, str, int], list[PhaseRecord]]


def groups(run: Run, notes: list[str]) -> Groups:
    """The run's phases by (instance, scenario, level: users, burst size or sweep level), repetitions together,
    attempts a retry replaced left out; a phase the report flags noisy stays in and is said."""
    assessment = noise.assess(run)
    out: Groups = {}
    for p in run.phases:
        trust = assessment.of(p.instance, p.phase)
        if trust is not None and trust.superseded:
            continue
        if trust is not None and trust.flags:
            notes.append(f"{run.run_id}: {trust.rerun()}: flagged by the report, still compared")
        out.setdefault((p.instance, p.scenario, p.concurrency), []).append(p)
    return out


def instance_pairs(candidate: Groups, baseline: Groups) -> list[tuple[str, str]]:
    """(candidate instance, baseline instance): the same instance in both runs; or, one engine each, those two (the
    comparison section's matching, servescope/report/compare.between_runs)."""
    ci, bi = (list(dict.fromkeys(k[0] for k in g)) for g in (candidate, baseline))
    common = [(i, i) for i in ci if i in bi]
    if not common and len(ci) == 1 and len(bi) == 1:
        return [(ci[0], bi[0])]
    return common


def _levels(g: Groups, instance: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, scenario, level in g:
        if i == instance:
            out.setdefault(scenario, []).append(level)
    return {s: sorted(levels) for s, levels in out.items()}


def _view(run: Run, phases: list[PhaseRecord]) -> Run:
    """The run with only these phases' requests."""
    keep = {(p.instance, p.phase) for p in phases}
    return run.without([(p.instance, p.phase) for p in run.phases if (p.instance, p.phase) not in keep], phases)


def build(candidate: Run, baseline: Run, spec: slo.SloSpec, tolerance_pct: float) -> Check:
    """Every gated metric of every (instance, scenario, level) both runs ran; CheckError when they cannot be compared."""
    check = Check(baseline.run_id, candidate.run_id, f"{spec.text} (objective {spec.objective:g})", tolerance_pct)
    cg, bg = groups(candidate, check.notes), groups(baseline, check.notes)
    pairs = instance_pairs(cg, bg)
    paired_c, paired_b = {c for c, _ in pairs}, {b for _, b in pairs}
    for run, g, paired in ((baseline, bg, paired_b), (candidate, cg, paired_c)):
        for i in dict.fromkeys(k[0] for k in g):
            if i not in paired:
                check.notes.append(f"{i}: only in {run.run_id}: not compared")
    units = []
    for ci, bi in pairs:
        cl, bl = _levels(cg, ci), _levels(bg, bi)
        for scenario in dict.fromkeys([*bl, *cl]):
            if scenario not in cl or scenario not in bl:
                only = baseline.run_id if scenario in bl else candidate.run_id
                check.notes.append(f"{ci} {scenario}: only in {only}: not compared")
            elif cl[scenario] != bl[scenario]:
                raise CheckError(
                    f"different levels: {bi} {scenario} ran {_list(bl[scenario])} in {baseline.run_id}, "
                    f"{ci} {scenario} ran {_list(cl[scenario])} in {candidate.run_id}"
                )
            else:
                units += [(ci, bi, scenario, level) for level in cl[scenario]]
    if not units:
        raise CheckError(
            f"nothing to compare: no engine instance and scenario appear in both {baseline.run_id} and {candidate.run_id}"
        )
    for ci, bi, scenario, level in units:
        why = compare.matched_set((candidate, cg[ci, scenario, level]), (baseline, bg[bi, scenario, level]))
        if why:
            raise CheckError(f"different prompt sets or max_tokens in {ci} {scenario} at level {level}: {why}")
    for ci, bi, scenario, level in units:
        cv, bv = _view(candidate, cg[ci, scenario, level]), _view(baseline, bg[bi, scenario, level])
        name = ci if ci == bi else f"{ci} vs {bi}"
        cur = compare.Side(cv, ci, scenario, f"{candidate.run_id}/{ci}")
        base = compare.Side(bv, bi, scenario, f"{baseline.run_id}/{bi}")
        phases = (cg[ci, scenario, level], bg[bi, scenario, level])
        check.gates += unit_gates(f"{name} {scenario} c{level}", cur, base, spec, phases)
    for g in check.gates:
        g.judge(tolerance_pct)
    return check


def _list(levels: list[int]) -> str:
    return "c" + ",".join(map(str, levels))


def unit_gates(unit: str, cur: compare.Side, base: compare.Side, spec: slo.SloSpec, phases: tuple) -> list[Gate]:
    """The gated metrics of one (instance, scenario, level); phases: the candidate's and the baseline's."""
    out = []
    medians = {d.metric: d for d in compare.compare_groups(cur, base)}
    for metric in LATENCY:
        d = medians[metric]
        title = latency.METRIC_TITLES[metric]
        out.append(
            Gate(unit, f"{title} median", True, "s", d.median_baseline, d.median_current, d.delta, d.ci_low,
                 d.ci_high, d.n_baseline, d.n_current, d.paired)
        )  # fmt: skip
        out += _tails(unit, title, cur, base, metric)
    out += _goodput(unit, cur, base, spec, phases)
    return out


def _tails(unit: str, title: str, cur: compare.Side, base: compare.Side, metric: str) -> list[Gate]:
    """p95 and p99 of one latency metric, unpaired (a tail is of requests, not of prompts)."""
    if metric == "itl_s":
        pc, pb = (latency.pool(s.run, s.instance, s.scenario) for s in (cur, base))
        n_cur, n_base = pc.n, pb.n
    else:
        a, b = (latency.samples(s.run, s.instance, s.scenario, metric, ordered=True) for s in (cur, base))
        n_cur, n_base = len(a), len(b)
    out = []
    for q in TAILS:
        need = -(-thresholds.CHECK_TAIL_BEYOND * 100 // (100 - q))
        if min(n_cur, n_base) < need:
            values = (pb.percentile(q), pc.percentile(q)) if metric == "itl_s" else _percentiles(b, a, q)
            why = f"{n_base}/{n_cur} samples: p{q} is gated from {need} on each side"
            out.append(Gate(unit, f"{title} p{q}", True, "s", *values, n_baseline=n_base, n_candidate=n_cur, why=why))
            continue
        if metric != "itl_s":
            r = stats.bootstrap_percentile_delta(a, b, q)
        elif pc.whole and pb.whole:
            r = stats.bootstrap_percentile_delta(pc.in_order(), pb.in_order(), q)
        else:
            samples = (p.in_order() if p.whole else p.sample(stats.BOOTSTRAP_MAX_SAMPLES) for p in (pc, pb))
            pools = ((pc.n, pc.percentile(q)), (pb.n, pb.percentile(q)))
            r = stats.bootstrap_percentile_delta(*samples, q, pools=pools)
        out.append(
            Gate(unit, f"{title} p{q}", True, "s", r["percentile_baseline"], r["percentile_current"], r["delta"],
                 r["ci_low"], r["ci_high"], r["n_baseline"], r["n_current"])
        )  # fmt: skip
    return out


def _percentiles(baseline: np.ndarray, current: np.ndarray, q: float) -> tuple[float | None, float | None]:
    return stats.percentile(baseline.tolist(), q), stats.percentile(current.tolist(), q)


def _goodput(unit: str, cur: compare.Side, base: compare.Side, spec: slo.SloSpec, phases: tuple) -> list[Gate]:
    """Goodput (good requests/s: each phase cut into slices of its wall, slo.good_slices, as `make tune` measures it)
    and SLO attainment (the good share of the requests), each request good or not by goodput.py's rule."""
    sides = []
    for side, side_phases in zip((cur, base), phases, strict=True):
        good, lengths, flags = [], [], []
        for p in side_phases:
            r = goodput.request_outcomes(side.run, spec, "instance = ? AND phase = ?", [p.instance, p.phase])
            ok_e2e = r["e2e_s"][(r["ok"] > 0) & np.isfinite(r["e2e_s"])].tolist()
            g, _, w = slo.good_slices(
                p.started_at,
                p.ended_at,
                r["finished_at"].tolist(),
                (r["good"] > 0).tolist(),
                r["output_tokens"].tolist(),
                ok_e2e,
            )
            good += g
            lengths += w
            flags.append(r["good"])
        shares = np.concatenate(flags) if flags else np.zeros(0)
        sides.append(((good, lengths, 1.0), (shares, np.ones_like(shares), 1.0)))
    out = []
    for k, (metric, kind) in enumerate((("goodput", "req/s"), ("SLO attainment", "share"))):
        r = stats.bootstrap_ratio_delta(sides[0][k], sides[1][k])
        out.append(
            Gate(unit, metric, False, kind, r["baseline"], r["current"], r["delta"], r["ci_low"], r["ci_high"],
                 r["n_baseline"], r["n_current"])
        )  # fmt: skip
    return out


# ---------------------------------------------------------------- what it says


def value_text(kind: str, v: float | None, signed: bool = False) -> str:
    if v is None:
        return "not measured"
    if kind == "s":
        return numbers.duration_fixed(v, signed)
    if kind == "share":
        return numbers.percentage_points(v, signed=True) if signed else numbers.percent(v)
    return f"{numbers.fixed(v, 3, signed=signed)} {kind}"


def delta_text(g: Gate) -> str:
    if g.delta is None:
        return "not measured"
    text = value_text(g.kind, g.delta, signed=True)
    if g.ci_low is not None and g.ci_high is not None:
        text += f" [{value_text(g.kind, g.ci_low, True)}, {value_text(g.kind, g.ci_high, True)}]"
    pct = g.delta_pct
    return text + (f" ({pct:+.1f}%)" if pct is not None else "")


def verdict_text(g: Gate) -> str:
    return f"{g.verdict} ({g.why})" if g.why else g.verdict + (" (paired)" if g.paired else "")


def rows(check: Check, every: bool) -> list[list[str]]:
    return [
        [
            g.unit,
            g.metric,
            value_text(g.kind, g.baseline),
            value_text(g.kind, g.candidate),
            delta_text(g),
            verdict_text(g),
        ]
        for g in check.gates
        if every or g.verdict != NOT_GATED
    ]


HEADER = ["unit", "metric", "baseline", "candidate", f"delta [{stats.CONFIDENCE:.0%} CI]", "verdict"]


def headline(check: Check) -> str:
    worse = check.worse
    if worse:
        named = ", ".join(g.case for g in worse[:SHOWN_WORSE])
        more = f" and {len(worse) - SHOWN_WORSE} more" if len(worse) > SHOWN_WORSE else ""
        return f"FAIL: {len(worse)} of {len(check.gated)} gated metrics worse: {named}{more}"
    better = sum(g.verdict == BETTER for g in check.gates)
    return f"PASS: none of {len(check.gated)} gated metrics worse ({better} better)"


def text(check: Check) -> str:
    """The terminal's table: every gated metric; the ones not gated counted (check.md lists them)."""
    table = [HEADER, *rows(check, every=False)]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
    lines = [
        f"check: candidate {check.candidate} against baseline {check.baseline}; SLOs {check.slo}; "
        f"tolerance {check.tolerance_pct:g}% ({TOLERANCE_KNOB})"
    ]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    skipped = len(check.gates) - len(check.gated)
    if skipped:
        lines.append(f"{skipped} metric(s) not gated (too few samples, or not measured): listed in {MARKDOWN}")
    lines += [f"note: {n}" for n in check.notes]
    lines.append(headline(check))
    return "\n".join(lines) + "\n"


def markdown(check: Check) -> str:
    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    out = [
        f"# Regression check: {check.candidate} against {check.baseline}",
        "",
        f"**{headline(check)}**",
        "",
        f"SLOs: {check.slo}. Tolerance: {check.tolerance_pct:g}% ({TOLERANCE_KNOB}).",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows(check, every=True)]
    if check.notes:
        out += ["", *[f"- {cell(n)}" for n in check.notes]]
    out += ["", f"Rule: {RULE}", ""]
    return "\n".join(out)


# What XML 1.0 admits (its Char production): tab, newline, carriage return and U+0020 on, less the surrogates and
# U+FFFE/U+FFFF. ElementTree escapes markup but writes any other character as it is: a control character in an
# instance or run name made check.xml not well-formed.
XML_FORBIDDEN = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_safe(tree: ET.Element) -> ET.Element:
    """Every text and attribute value in the tree without the characters XML 1.0 forbids (dropped)."""
    for element in tree.iter():
        if element.text:
            element.text = XML_FORBIDDEN.sub("", element.text)
        if element.tail:
            element.tail = XML_FORBIDDEN.sub("", element.tail)
        for key, value in element.attrib.items():
            element.attrib[key] = XML_FORBIDDEN.sub("", value)
    return tree


def junit(check: Check) -> bytes:
    """JUnit XML: one testcase per gated metric, a <failure> for each worse one; written through xml_safe."""
    gated, worse = check.gated, check.worse
    counts = {"tests": str(len(gated)), "failures": str(len(worse)), "errors": "0", "skipped": "0"}
    suites = ET.Element("testsuites", name="servescope check", **counts)
    suite = ET.SubElement(suites, "testsuite", name=f"check {check.candidate} vs {check.baseline}", **counts)
    props = ET.SubElement(suite, "properties")
    for key, value in (("baseline", check.baseline), ("candidate", check.candidate), ("slo", check.slo)):
        ET.SubElement(props, "property", name=key, value=value)
    ET.SubElement(props, "property", name="tolerance_pct", value=f"{check.tolerance_pct:g}")
    ET.SubElement(props, "property", name="rule", value=RULE)
    for g in gated:
        case = ET.SubElement(suite, "testcase", classname=f"servescope.check.{g.unit}", name=g.metric, time="0")
        detail = (
            f"{g.case}: baseline {value_text(g.kind, g.baseline)}, candidate {value_text(g.kind, g.candidate)}, "
            f"delta {delta_text(g)}; n {g.n_baseline}/{g.n_candidate}: {g.verdict}"
        )
        if g.verdict == WORSE:
            ET.SubElement(case, "failure", message=detail, type="regression").text = detail
        else:
            ET.SubElement(case, "system-out").text = detail
    ET.indent(xml_safe(suites))
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True) + b"\n"


# ---------------------------------------------------------------- the command


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m servescope.report check",
        description=__doc__,
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--baseline", metavar="ID|PATH", required=True, help="the run to compare against")
    p.add_argument("--run", metavar="ID|PATH", help="the candidate run (default: the latest under --results)")
    p.add_argument(
        "--results", metavar="DIR", type=Path, default=None, help="where run folders live (default: SERVESCOPE_RESULTS)"
    )
    p.add_argument(
        "--slo",
        metavar="SPEC",
        help="judge both runs by these SLOs instead of their own (servescope/judgements/slo.py)",
    )
    p.add_argument(
        "--out", metavar="DIR", type=Path, help=f"where {MARKDOWN} and {JUNIT} go (default: the candidate's run folder)"
    )
    p.add_argument("--junit", metavar="FILE", type=Path, help=f"the JUnit XML's path (default: OUT/{JUNIT})")
    p.add_argument(
        "--markdown", metavar="FILE", type=Path, help=f"the Markdown summary's path (default: OUT/{MARKDOWN})"
    )
    return p


def tolerance() -> float:
    return thresholds.knob_number(TOLERANCE_KNOB, 0, 1000)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    knob = ReportSettings.from_env().slo  # the gate's entry: the SLO knobs, read once
    runs: list[Run] = []
    try:
        tolerance_pct = tolerance()
    except ValueError as exc:  # the knob's one line
        print(f"report check: {exc}", file=sys.stderr)
        return 2
    try:
        base_path = load.resolve(args.baseline, args.results or load.results_dir())
        cand_path = load.resolve(args.run, args.results or load.results_dir())
        if cand_path.resolve() == base_path.resolve():
            raise CheckError(f"the candidate is the baseline ({cand_path}): give --run")
        specs = []
        for path in (base_path, cand_path):
            run = load.load(path, lambda manifest: run_slo.manifest_gap_limits(manifest, args.slo, knob))
            runs.append(run)
            if not run.request_count:
                raise CheckError(f"{path}: no requests recorded")
            if run.phases_reconstructed:  # levels and walls guessed: a gate compares phases as they ran
                raise CheckError(f"{path}: no phase records ({PHASES} missing or unreadable): it cannot be gated")
            try:
                specs.append(goodput.spec_of(run, args.slo, strict=True, knob=knob))
            except slo.SloError as exc:
                if args.slo:
                    raise
                raise CheckError(f"{path}: {exc}: give --slo to judge both runs by one") from None
        baseline, candidate = runs
        (bs, cs) = specs
        if (bs.text, bs.objective) != (cs.text, cs.objective):
            raise CheckError(
                f"different SLOs: {baseline.run_id} ran {bs.text} (objective {bs.objective:g}), {candidate.run_id} "
                f"{cs.text} (objective {cs.objective:g}): give --slo to judge both by one"
            )
        check = build(candidate, baseline, cs, tolerance_pct)
        out = args.out or candidate.path
        written = []
        for path, content in (
            (args.markdown or out / MARKDOWN, markdown(check).encode()),
            (args.junit or out / JUNIT, junit(check)),
        ):
            path.parent.mkdir(parents=True, exist_ok=True)
            write_file(path, content)  # never through a link at the name (`ln -s /tmp/victim RUN/check.md`)
            written.append(str(path))
    except (load.RunError, slo.SloError, CheckError) as exc:
        print(f"report check: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"report check: cannot write: {exc.strerror or exc} ({getattr(exc, 'filename', '')})", file=sys.stderr)
        return 2
    finally:
        for run in runs:
            run.close()
    for run in runs:
        for warning in run.warnings:
            print(f"report check: warning: {run.run_id}: {warning}", file=sys.stderr)
    sys.stdout.write(text(check))
    print(f"report check: wrote {', '.join(written)}", file=sys.stderr)
    return 1 if check.worse else 0
