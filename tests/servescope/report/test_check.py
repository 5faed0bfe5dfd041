"""`python -m servescope.report check`: the regression gate's verdicts, exit codes, check.md and JUnit XML on crafted run folders."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from servescope.contracts.runfolder import PhaseRecord, RequestRecord, RunFolder
from servescope.judgements import slo, stats
from servescope.report import check, cli, goodput
from servescope.report.load import load

SHA = "a" * 64


def write_run(
    root: Path,
    run_id: str,
    *,
    n: int = 200,
    ttft_scale: float = 1.0,
    failed_every: int = 0,
    sha: str = SHA,
    prompt_set: str = "set",
    prompt_sets: dict | None = None,
    slo_text: str = "ttft<=0.5,e2e<=2",
    levels: tuple[int, ...] = (2,),
    instances: tuple[str, ...] = ("vllm",),
    seed: int = 1,
) -> Path:
    """A sweep run folder: per instance and level, n requests of 8 tokens over 20 prompts (lognormal TTFT around
    0.1 s times ttft_scale, gaps around 20 ms), the phases and a manifest naming the SLOs, as loadgen writes them."""
    folder = RunFolder.create(root, run_id)
    rng = np.random.default_rng(seed)
    t = 1_000_000.0
    for instance in instances:
        for level in levels:
            phase, start = f"sweep-c{level}", t
            for i in range(n):
                ok = not failed_every or i % failed_every
                ttft = float(rng.lognormal(math.log(0.1), 0.25)) * ttft_scale
                itl = [float(g) for g in rng.lognormal(math.log(0.02), 0.2, size=7)]
                e2e = ttft + sum(itl)
                folder.append_request(
                    RequestRecord(
                        engine="vllm",
                        instance=instance,
                        scenario="sweep",
                        phase=phase,
                        api="openai",
                        model="m",
                        prompt_set=prompt_set,
                        prompt_set_sha256=sha,
                        prompt_id=f"p{i % 20}",
                        max_tokens=8,
                        started_at=t,
                        ok=bool(ok),
                        status=200 if ok else 503,
                        error=None if ok else "busy",
                        ttft_s=ttft if ok else None,
                        e2e_s=e2e if ok else None,
                        itl_s=itl if ok else [],
                        output_tokens=8 if ok else None,
                    )
                )
                t += e2e / level
            folder.append_phase(PhaseRecord("vllm", instance, "sweep", phase, start, t, n, level, prompt_set, sha, 8))
            t += 1
    manifest = {"run_id": run_id, "flags": {"slo": slo_text}, "engines": {i: {"kind": "vllm"} for i in instances}}
    if prompt_sets is not None:
        manifest["prompt_sets"] = prompt_sets
    folder.write_manifest(manifest)
    return folder.path


def run_check(*args: str, capsys) -> tuple[int, str, str]:
    code = cli.main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_identical_runs_pass_and_write_the_summary_and_junit(tmp_path, capsys):
    base, cand = write_run(tmp_path, "base"), write_run(tmp_path, "cand")
    code, out, err = run_check("--baseline", str(base), "--run", str(cand), capsys=capsys)
    assert code == 0, err
    assert "PASS: none of 9 gated metrics worse (0 better)" in out
    assert all(g.verdict in (check.SAME, check.NOT_GATED) and g.delta in (0, None) for g in _build(cand, base).gates)
    assert (cand / check.MARKDOWN).is_file() and (cand / check.JUNIT).is_file()
    suite = ET.parse(cand / check.JUNIT).getroot()
    assert suite.tag == "testsuites" and suite.get("failures") == "0"
    assert not suite.findall(".//failure")


def test_a_clearly_slower_ttft_fails_naming_the_metric_with_a_failure_in_the_junit(tmp_path, capsys):
    base, cand = write_run(tmp_path, "base"), write_run(tmp_path, "cand", ttft_scale=1.4)
    code, out, _ = run_check("--baseline", str(base), "--run", str(cand), capsys=capsys)
    assert code == 1
    assert "FAIL" in out and "vllm sweep c2: TTFT median" in out
    failures = ET.parse(cand / check.JUNIT).getroot().findall(".//testcase/failure")
    names = {f.get("message").split(":")[1].strip() for f in failures}
    assert {"TTFT median", "TTFT p95"} <= names
    assert "ITL median" not in names  # the gaps did not change
    md = (cand / check.MARKDOWN).read_text()
    assert "| vllm sweep c2 | TTFT median |" in md and "worse" in md


def test_a_noise_level_change_passes(tmp_path, capsys):
    """+1 %: the CI excludes zero (every request moved by it) but the change is within the 5 % tolerance."""
    base, cand = write_run(tmp_path, "base"), write_run(tmp_path, "cand", ttft_scale=1.01)
    code, out, _ = run_check("--baseline", str(base), "--run", str(cand), capsys=capsys)
    assert code == 0, out
    built = _build(cand, base)
    ttft = next(g for g in built.gates if g.metric == "TTFT median")
    assert ttft.ci_low > 0 and ttft.verdict == check.SAME


def test_the_tolerance_is_the_knob(tmp_path, capsys, monkeypatch):
    base, cand = write_run(tmp_path, "base"), write_run(tmp_path, "cand", ttft_scale=1.03)
    assert run_check("--baseline", str(base), "--run", str(cand), capsys=capsys)[0] == 0
    monkeypatch.setenv("CHECK_TOLERANCE_PCT", "1")
    assert run_check("--baseline", str(base), "--run", str(cand), capsys=capsys)[0] == 1
    monkeypatch.setenv("CHECK_TOLERANCE_PCT", "five")
    code, _, err = run_check("--baseline", str(base), "--run", str(cand), capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and "CHECK_TOLERANCE_PCT" in err


def test_fewer_good_requests_fail_goodput_and_attainment(tmp_path, capsys):
    base, cand = write_run(tmp_path, "base"), write_run(tmp_path, "cand", failed_every=4)
    code, out, _ = run_check("--baseline", str(base), "--run", str(cand), capsys=capsys)
    assert code == 1
    built = _build(cand, base)
    by_metric = {g.metric: g for g in built.gates}
    assert by_metric["SLO attainment"].verdict == check.WORSE and by_metric["SLO attainment"].delta < 0
    assert by_metric["goodput"].verdict == check.WORSE
    # The other way round it is better, never worse: goodput's worse side is down.
    assert {g.metric: g.verdict for g in _build(base, cand).gates}["goodput"] == check.BETTER


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"sha": "b" * 64, "prompt_set": "other"}, "different prompt sets"),
        ({"slo_text": "ttft<=0.3"}, "different SLOs"),
        ({"levels": (2, 4)}, "different levels"),
        ({"instances": ("llamacpp", "ollama")}, "nothing to compare"),
    ],
)
def test_runs_that_cannot_be_compared_exit_2_with_one_line(tmp_path, capsys, changes, said):
    base, cand = write_run(tmp_path, "base", n=40), write_run(tmp_path, "cand", n=40, **changes)
    code, out, err = run_check("--baseline", str(base), "--run", str(cand), capsys=capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and said in err and "Traceback" not in err
    assert not (cand / check.JUNIT).exists()


def test_a_missing_folder_is_one_line(tmp_path, capsys):
    base = write_run(tmp_path, "base", n=20)
    code, out, err = run_check("--baseline", str(base), "--run", str(tmp_path / "nope"), capsys=capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and "nope" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run_check("--baseline", str(tmp_path / "empty"), "--run", str(base), capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and "not a run folder" in err


def test_fresh_prompt_sets_of_one_kind_are_compared_unpaired(tmp_path, capsys):
    """Two sweeps of `synthetic:256` draw their prompts from seeds of their own: two draws of one workload."""

    def fresh(seed: int) -> dict:
        return {f"synthetic-256-seed{seed}": {"kind": "fresh", "tokens": 256, "seed": seed, "sha256": str(seed) * 64}}

    base = write_run(tmp_path, "base", prompt_set="synthetic-256-seed1", sha="1" * 64, prompt_sets=fresh(1))
    cand = write_run(tmp_path, "cand", prompt_set="synthetic-256-seed2", sha="2" * 64, prompt_sets=fresh(2))
    code, _, err = run_check("--baseline", str(base), "--run", str(cand), capsys=capsys)
    assert code == 0, err
    other = write_run(
        tmp_path,
        "other",
        prompt_set="synthetic-512-seed3",
        sha="3" * 64,
        prompt_sets={"synthetic-512-seed3": {"kind": "fresh", "tokens": 512, "seed": 3}},
    )
    assert run_check("--baseline", str(base), "--run", str(other), capsys=capsys)[0] == 2


def test_an_instance_on_one_side_only_is_said_not_gated(tmp_path, capsys):
    base = write_run(tmp_path, "base", instances=("vllm",))
    cand = write_run(tmp_path, "cand", instances=("vllm", "llamacpp"))
    code, out, _ = run_check("--baseline", str(base), "--run", str(cand), capsys=capsys)
    assert code == 0
    assert "note: llamacpp: only in cand: not compared" in out
    assert all(g.unit.startswith("vllm") for g in _build(cand, base).gates)


def test_the_junit_counts_one_testcase_per_gated_metric_and_one_failure_per_worse(tmp_path, capsys):
    base, cand = write_run(tmp_path, "base"), write_run(tmp_path, "cand", ttft_scale=1.4)
    out = tmp_path / "ci"
    junit = tmp_path / "elsewhere" / "gate.xml"
    assert (
        run_check("--baseline", str(base), "--run", str(cand), "--out", str(out), "--junit", str(junit), capsys=capsys)[
            0
        ]
        == 1
    )
    built = _build(cand, base)
    root = ET.parse(junit).getroot()
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == int(suite.get("tests")) == int(root.get("tests")) == len(built.gated)
    assert len(suite.findall("testcase/failure")) == int(suite.get("failures")) == len(built.worse) >= 2
    # p99 of 200 requests is 2 of them: shown in check.md, no testcase.
    assert not [c for c in cases if c.get("name") == "TTFT p99"]
    assert "TTFT p99" in (out / check.MARKDOWN).read_text()
    assert not (cand / check.JUNIT).exists()


def test_names_with_markup_are_escaped_in_the_junit(tmp_path):
    gate = check.Gate('vllm<&"x"> sweep c1', "TTFT median", True, "s", 0.1, 0.2, 0.1, 0.05, 0.15, 10, 10)
    gate.judge(5)
    result = check.Check("b&<", "c>", "ttft<=0.5 (objective 0.95)", 5, [gate])
    root = ET.fromstring(check.junit(result))
    assert root.find("testsuite/testcase").get("classname") == 'servescope.check.vllm<&"x"> sweep c1'
    assert root.find("testsuite/testcase/failure") is not None


@pytest.mark.parametrize(
    ("higher_is_worse", "baseline", "delta", "ci", "verdict"),
    [
        (True, 1.0, 0.2, (0.1, 0.3), check.WORSE),
        (True, 1.0, 0.2, (-0.1, 0.3), check.SAME),  # beyond the tolerance, but the CI holds zero
        (True, 1.0, 0.03, (0.01, 0.05), check.SAME),  # the CI excludes zero, within the tolerance
        (True, 1.0, -0.2, (-0.3, -0.1), check.BETTER),
        (False, 1.0, -0.2, (-0.3, -0.1), check.WORSE),  # goodput down
        (False, 1.0, 0.2, (0.1, 0.3), check.BETTER),
    ],
)
def test_the_rule(higher_is_worse, baseline, delta, ci, verdict):
    gate = check.Gate("u", "m", higher_is_worse, "s", baseline, baseline + delta, delta, *ci, 100, 100)
    gate.judge(5)
    assert gate.verdict == verdict


def test_request_outcomes_are_evaluates_rule_request_by_request(tmp_path):
    path = write_run(tmp_path, "r", failed_every=5, slo_text="ttft<=0.1,e2e<=0.3")
    run = load(path)
    spec = goodput.spec_of(run)
    (phase,) = run.phases
    result = goodput.evaluate(run, spec, phase.instance, phase.phase, phase.wall_s)
    r = goodput.request_outcomes(run, spec, "instance = ? AND phase = ?", [phase.instance, phase.phase])
    assert 0 < r["good"].sum() == result.good < result.requests == len(r["good"])
    assert r["ok"].sum() == result.ok and np.isnan(r["e2e_s"][r["ok"] == 0]).all()
    # Goodput from the slices is the good requests over the phase's wall, as evaluate says.
    good, _, lengths = slo.good_slices(
        phase.started_at,
        phase.ended_at,
        r["finished_at"].tolist(),
        (r["good"] > 0).tolist(),
        r["output_tokens"].tolist(),
        r["e2e_s"][r["ok"] > 0].tolist(),
    )
    assert sum(good) / sum(lengths) == pytest.approx(result.goodput_rps)


def test_the_percentile_bootstrap_shares_the_medians_resampling():
    rng = np.random.default_rng(3)
    a, b = rng.normal(1.0, 0.1, 300), rng.normal(1.2, 0.1, 300)
    r = stats.bootstrap_percentile_delta(a, b, 95)
    assert r["percentile_current"] == pytest.approx(stats.percentile(a.tolist(), 95))
    assert r["ci_low"] < r["delta"] < r["ci_high"] < 0
    # At q = 50 it is the median delta over the same resamples, up to the interpolation's rounding.
    m, p = stats.bootstrap_median_delta(a, b, paired=True), stats.bootstrap_percentile_delta(a, b, 50, paired=True)
    assert (p["ci_low"], p["ci_high"]) == pytest.approx((m["ci_low"], m["ci_high"]), abs=1e-12)


def _build(cand: Path, base: Path) -> check.Check:
    c, b = load(cand), load(base)
    return check.build(c, b, goodput.spec_of(c), check.tolerance())


def test_help_explains_the_exit_codes_and_the_report_still_takes_its_own_options(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["check", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert all(f"\n  {code}  " in out for code in (0, 1, 2)) and "CHECK_TOLERANCE_PCT" in out
    assert cli.parser().parse_args(["--run", "check"]).run == "check"  # a run named check is still a run


def test_the_candidate_defaults_to_the_latest_run_and_never_to_the_baseline(tmp_path, capsys):
    base = write_run(tmp_path, "20260101-000000-1", n=20)
    code, _, err = run_check("--baseline", str(base), "--results", str(tmp_path), capsys=capsys)
    assert code == 2 and "the candidate is the baseline" in err
    write_run(tmp_path, "20260102-000000-1", n=20)
    code, out, _ = run_check("--baseline", base.name, "--results", str(tmp_path), capsys=capsys)
    assert code == 0 and "candidate 20260102-000000-1 against baseline 20260101-000000-1" in out


def _set_manifest_slo(run: Path, text: str) -> None:
    import json

    manifest = json.loads((run / "manifest.json").read_text())
    manifest["flags"]["slo"] = text
    (run / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("missing", ["candidate", "both"])
def test_a_run_without_its_phase_records_cannot_be_gated(tmp_path, capsys, missing):
    """Issue 42: with phases.jsonl gone from both runs the gate compared phases guessed from the requests and passed
    (exit 0); a gate compares phases as they ran: exit 2, one line naming the run."""
    base, cand = write_run(tmp_path, "base", n=40), write_run(tmp_path, "cand", n=40)
    for run in (cand, base) if missing == "both" else (cand,):
        (run / "phases.jsonl").unlink()
    code, out, err = run_check("--baseline", str(base), "--run", str(cand), capsys=capsys)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "no phase records (phases.jsonl missing or unreadable)" in err and "Traceback" not in err
    assert not (cand / check.JUNIT).exists()


def test_a_manifest_slo_that_cannot_be_read_is_not_replaced_by_the_knobs(tmp_path, capsys):
    """Issue 42: two runs recorded with the SLO `banana` were both judged by the knobs' SLO and passed (exit 0)."""
    base, cand = write_run(tmp_path, "base", n=40), write_run(tmp_path, "cand", n=40)
    for run in (base, cand):
        _set_manifest_slo(run, "banana")
    code, out, err = run_check("--baseline", str(base), "--run", str(cand), capsys=capsys)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "records ('banana') cannot be read" in err and "give --slo" in err
    # --slo judges both by one: the gate runs.
    code, out, err = run_check("--baseline", str(base), "--run", str(cand), "--slo", "ttft<=0.5", capsys=capsys)
    assert code == 0 and "PASS" in out, err


def test_the_check_files_replace_a_link_at_their_name_and_never_write_through_it(tmp_path, capsys):
    """Issue 42: `ln -s /tmp/victim RUN/check.md` had `report check` overwrite the link's target."""
    base, cand = write_run(tmp_path, "base", n=40), write_run(tmp_path, "cand", n=40)
    victims = {}
    for name in (check.MARKDOWN, check.JUNIT):
        victim = tmp_path / f"victim-{name}"
        victim.write_text("the victim's own words\n")
        (cand / name).symlink_to(victim)
        victims[name] = victim
    code, _, err = run_check("--baseline", str(base), "--run", str(cand), capsys=capsys)
    assert code == 0, err
    for name, victim in victims.items():
        assert victim.read_text() == "the victim's own words\n"  # untouched
        assert not (cand / name).is_symlink() and (cand / name).stat().st_size > 100  # the check's own file
    assert ET.parse(cand / check.JUNIT).getroot().tag == "testsuites"


def test_names_with_control_characters_give_a_well_formed_junit(tmp_path):
    """Issue 42: an instance or run name with a control character made check.xml not well-formed (500 of 500 fuzzed);
    the JUnit goes through a writer that drops what XML 1.0 forbids."""
    gate = check.Gate("vl\x00l\x1bm\x07 sweep c1", "TTFT median", True, "s", 0.1, 0.2, 0.1, 0.05, 0.15, 10, 10)
    gate.judge(5)
    result = check.Check("base\x01\ufffe", "cand\x0b\ud800", "ttft<=0.5 (objective 0.95)", 5, [gate])
    root = ET.fromstring(check.junit(result))
    assert root.find("testsuite/testcase").get("classname") == "servescope.check.vllm sweep c1"
    assert root.find("testsuite").get("name") == "check cand vs base"


def test_any_names_give_a_well_formed_junit():
    """Property (fixed seed): whatever the run and instance names and the SLO text hold, check.xml parses."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    names = st.text(st.characters(codec=None, exclude_categories=()), max_size=30)

    @settings(derandomize=True, max_examples=200, deadline=None)
    @given(unit=names, metric=names, baseline=names, candidate=names, slo_text=names, worse=st.booleans())
    def check_names(unit, metric, baseline, candidate, slo_text, worse):
        gate = check.Gate(unit, metric, True, "s", 0.1, 0.2 if worse else 0.1, 0.1, 0.05, 0.15, 10, 10)
        gate.judge(5)
        root = ET.fromstring(check.junit(check.Check(baseline, candidate, slo_text, 5, [gate])))
        kept = check.XML_FORBIDDEN.sub("", candidate)
        assert root.find("testsuite/properties/property[@name='candidate']").get("value") == kept

    check_names()
