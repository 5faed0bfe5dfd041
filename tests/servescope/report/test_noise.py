"""Repeated trials in the report: medians and CIs over repetitions, host noise carried by the estimates (a pair left out only when its noise could explain the reading), outliers left out, retries, old run folders."""

from __future__ import annotations

import json

import pytest

from servescope.contracts.runfolder import PhaseRecord, RequestRecord, RunFolder
from servescope.report import noise, sections, table
from servescope.report.load import load
from servescope.text import words

SHA = "cd" * 32
T = 1796010000.0
QUIET = {"engine_found": True, "engine_cores": 1.0, "foreign_cores": 0.05, "groups": [], "steal_share": 0.0, "cores": 2}


def loud(name: str, cores: float) -> dict:
    return {**QUIET, "foreign_cores": cores, "groups": [{"name": name, "kind": "other engine", "cores": cores}]}


@pytest.fixture(autouse=True)
def default_rule(monkeypatch):
    for key, value in (
        ("NOISE_GROUP_CPU_CORES", "0.25"),
        ("NOISE_FOREIGN_CPU_CORES", "0.5"),
        ("NOISE_STEAL_SHARE", "0.05"),
        ("OUTLIER_RATIO", "3"),
    ):
        monkeypatch.setenv(key, value)


def write(tmp_path, phases, *, request_times=None, name="run", trials=None):
    """phases: (instance, phase, scenario, repetition, attempt, wall, noise); 3 requests each, 0.3 s unless told."""
    folder = RunFolder.create(tmp_path, name)
    manifest = {"engines": {"llamacpp": {"kind": "llamacpp"}, "vllm": {"kind": "vllm"}}, "run_id": name}
    folder.write_manifest({**manifest, **({"trials": trials} if trials else {})})
    t = T
    for instance, phase, scenario, repetition, attempt, wall, phase_noise in phases:
        burst = scenario == "burst"
        folder.append_phase(
            PhaseRecord(
                instance, instance, scenario, phase, t, t + wall, 3, 3 if burst else 1, "seed3", SHA, 48,
                repetition=repetition, attempt=attempt, noise=phase_noise,
            )
        )  # fmt: skip
        for i in range(3):
            e2e = (request_times or {}).get((instance, phase, i), 0.3)
            folder.append_request(
                RequestRecord(
                    instance, instance, scenario, phase, "openai", "m", "seed3", SHA, f"p{i}", 48,
                    # llama.cpp serves a burst's requests one after another (as it does: one slot); vLLM together
                    t + (0.3 * i if not burst or instance == "llamacpp" else 0), True, 200, ttft_s=0.05, e2e_s=e2e,
                    output_tokens=20,
                    tokens_source="usage", arrival_index=i if burst else None,
                )
            )  # fmt: skip
        t += wall + 1
    return load(folder.path)


def three_reps(hog_in: str | None = None):
    """llama.cpp: sequential ~0.9 s, burst ~0.9 s (1.0x); vLLM: sequential ~0.9, burst ~0.3 (3x); A B B A order."""
    walls = {
        ("vllm", "sequential"): (0.90, 0.95, 0.92),
        ("vllm", "burst-1"): (0.30, 0.31, 0.29),
        ("llamacpp", "sequential"): (0.91, 0.90, 0.93),
        ("llamacpp", "burst-1"): (0.90, 0.92, 0.88),
    }
    phases = []
    for rep in (1, 2, 3):
        order = list(walls) if rep % 2 else list(reversed(walls))
        for instance, base in order:
            name = base if rep == 1 else f"{base}#{rep}"
            scenario = "burst" if base.startswith("burst") else "sequential"
            n = loud("vllm", 0.61) if name == hog_in and instance == "llamacpp" else QUIET
            phases.append((instance, name, scenario, rep, 1, walls[(instance, base)][rep - 1], n))
    return phases


def test_medians_and_cis_over_repetitions(tmp_path):
    rows = {(r.instance, r.phase): r for r in table.build(write(tmp_path, three_reps()))}
    burst = rows[("vllm", "burst-1")]
    assert burst.wall_s == pytest.approx(0.30) and len(burst.repetitions) == 3
    factors = sorted([0.90 / 0.30, 0.95 / 0.31, 0.92 / 0.29])
    assert burst.scaling_factor == pytest.approx(factors[1])  # the median of the per-repetition factors
    lo, hi = burst.scaling_ci
    assert factors[0] - 1e-6 <= lo <= hi <= factors[2] + 1e-6  # three repetitions: the CI stays inside their range
    assert [r.matched_phase for r in burst.repetitions] == ["sequential", "sequential#2", "sequential#3"]
    assert burst.reading.startswith("strongly sub-linear") and burst.left_out == []
    assert rows[("llamacpp", "sequential")].wall_s == pytest.approx(0.91)
    text = table.render_text(list(rows.values()), "run")
    assert "vLLM-CPU: median of 3 repetitions 3.06x [95% CI 3.00x-3.17x]" in text
    assert "Flagged" not in text


def test_a_noisy_phase_stays_in_when_its_noise_cannot_explain_the_reading(tmp_path):
    """Other programs slowed llama.cpp's sequential#2: that can only make its factor look larger, never "near-linear"."""
    run = write(tmp_path, three_reps(hog_in="sequential#2"))
    rows = {(r.instance, r.phase): r for r in table.build(run)}
    seq = rows[("llamacpp", "sequential")]
    assert seq.left_out == [] and seq.wall_s == pytest.approx(0.91)  # all three repetitions
    burst = rows[("llamacpp", "burst-1")]
    assert [r.phase for r in burst.repetitions if r.factor_used] == ["burst-1", "burst-1#2", "burst-1#3"]
    second = burst.repetitions[1]
    assert second.partner_slowdown == pytest.approx(2 / (2 - 0.61))
    lo, hi = second.band  # the burst side saw 0.05 cores of others, the sequential side 0.61
    assert lo == pytest.approx(second.scaling_factor * (2 / 1.95) / (2 / 1.39)) and hi == second.scaling_factor
    assert burst.reading == table.NEAR_LINEAR and burst.undecided is None
    assert burst.busy.startswith("1 of 6 phases measured on a busy host, each up to x1.44 slower")
    # The CI reaches down to what the noisy pair could be at most.
    assert burst.scaling_ci[0] <= lo + 1e-9
    # The other engine's numbers do not move.
    clean = {(r.instance, r.phase): r for r in table.build(write(tmp_path, three_reps(), name="clean"))}
    assert rows[("vllm", "burst-1")].scaling_factor == clean[("vllm", "burst-1")].scaling_factor
    assert rows[("vllm", "burst-1")].scaling_ci == clean[("vllm", "burst-1")].scaling_ci


def test_a_pair_whose_noise_could_explain_the_reading_is_left_out_of_the_factor(tmp_path):
    """sequential#2 ran slow under a neighbour: its 1.41x could be 1.0x on a quiet host, so it cannot claim overlap."""
    phases = [
        (i, n, s, r, a, 1.30 if n == "sequential#2" and i == "llamacpp" else w, nz)
        for i, n, s, r, a, w, nz in three_reps(hog_in="sequential#2")
    ]
    rows = {(r.instance, r.phase): r for r in table.build(write(tmp_path, phases))}
    burst = rows[("llamacpp", "burst-1")]
    assert [r.phase for r in burst.left_out] == ["burst-1#2"]
    assert burst.left_out[0].left_out.startswith(
        "its noise could explain the reading (1.01x-1.41x under the noise it measured, claimed near-linear): "
        "noisy: 61% of a core used by vllm while measuring llamacpp"
    )
    assert burst.scaling_factor == pytest.approx((0.91 / 0.90 + 0.93 / 0.88) / 2)
    assert burst.reading == table.NEAR_LINEAR
    text = table.render_text(list(rows.values()), "run")
    assert "llama.cpp server burst-1#2: its noise could explain the reading" in text


def test_a_factor_every_pair_of_which_is_noisy_is_still_estimated_and_says_what_would_settle_it(tmp_path):
    """One pair, its sequential side slowed by a neighbour: 1.60x measured, as little as 0.90x without the neighbour."""
    phases = [
        ("llamacpp", "sequential", "sequential", 1, 1, 1.44, loud("vllm", 0.9)),
        ("llamacpp", "burst-1", "burst", 1, 1, 0.9, QUIET),
    ]
    (seq, burst) = table.build(write(tmp_path, phases))
    assert burst.scaling_factor == pytest.approx(1.6) and burst.refusal is None and burst.trusted
    lo, hi = burst.scaling_ci
    assert lo == pytest.approx(1.6 * (2 / 1.95) / (2 / 1.1)) and hi == pytest.approx(1.6)
    assert burst.reading.startswith("undecided: the CI straddles 1.30x (near-linear below, partially sub-linear above)")
    assert burst.more_repetitions >= 1  # derived: the band's half-width facing 1.3x shrunk as 1 / sqrt(pairs)
    assert burst.left_out == []


def test_walls_a_busy_host_skewed_against_the_bursts_own_overlap_are_undecided(tmp_path):
    """A neighbour slowed llama.cpp's sequential passes three times over: the walls read 3x, but its burst's requests
    (served one after another, measured inside the burst) say no overlap. Seen on a 2-core VM, priority off."""
    phases = []
    for rep, (seq, burst) in {1: (2.7, 0.9), 2: (2.8, 0.92), 3: (2.6, 0.88)}.items():
        suffix = "" if rep == 1 else f"#{rep}"
        phases += [
            ("llamacpp", f"sequential{suffix}", "sequential", rep, 1, seq, loud("python -c", 0.9)),
            ("llamacpp", f"burst-1{suffix}", "burst", rep, 1, burst, loud("python -c", 0.9)),
        ]
    (seq, burst) = table.build(write(tmp_path, phases))
    assert burst.scaling_factor == pytest.approx(3.0) and burst.overlap == pytest.approx(0.75 / 0.85)
    assert burst.reading.startswith(
        "undecided: the walls read strongly sub-linear, but the burst's requests generated 0.88"
    )
    # The same walls on a quiet host are the measure: nothing to cross-check them against.
    quiet = [(i, n, sc, r, a, w, QUIET) for i, n, sc, r, a, w, _ in phases]
    (_, burst) = table.build(write(tmp_path, quiet, name="quiet"))
    assert burst.reading == table.STRONG


def test_the_ci_of_repetitions_that_straddle_a_bound_is_undecided_and_counts_what_would_settle_it(tmp_path):
    walls = {1: (1.0, 0.95), 2: (1.0, 0.75), 3: (1.0, 0.80)}  # factors 1.05, 1.33, 1.25: the median near 1.3
    phases = []
    for rep, (seq, burst) in walls.items():
        suffix = "" if rep == 1 else f"#{rep}"
        phases += [
            ("llamacpp", f"sequential{suffix}", "sequential", rep, 1, seq, QUIET),
            ("llamacpp", f"burst-1{suffix}", "burst", rep, 1, burst, QUIET),
        ]
    (seq, burst) = table.build(write(tmp_path, phases))
    assert burst.scaling_factor == pytest.approx(1.25)
    assert burst.undecided and burst.reading == burst.undecided
    assert burst.more_repetitions is not None and burst.more_repetitions >= 1
    _, numbers = sections.build(write(tmp_path, phases, name="summary"), "http://127.0.0.1:9", figures=False)
    (line,) = [x for s in numbers["summary"] for x in s["lines"] if x.startswith("Scaling")]
    per_pass = burst.wall_s + burst.matched_wall_s
    assert line.endswith(
        f"about {words.count(burst.more_repetitions, 'more repetition')} on this host, at least "
        f"{burst.more_repetitions * per_pass / 60:.1f} min of phases would settle it (LOADGEN_REPETITIONS, "
        f"LOADGEN_MAX_REPETITIONS)"
    )


def test_an_outlier_request_flags_its_phase(tmp_path):
    """A 25.9 s request among 0.5 s ones: flagged, never averaged in."""
    slow = {("llamacpp", "sequential#2", 0): 25.9}
    run = write(tmp_path, three_reps(), request_times=slow)
    assessment = noise.assess(run)
    trust = assessment.of("llamacpp", "sequential#2")
    assert trust.outliers == ["p0 25.900s"]
    assert "outlier request: p0 25.900s against the phase's median 0.300s (more than 3x)" in trust.flags
    assert [t.phase for t in assessment.flagged()] == ["sequential#2"]


def test_a_retry_supersedes_the_flagged_attempt(tmp_path):
    phases = [
        ("llamacpp", "sequential", "sequential", 1, 1, 0.9, QUIET),
        ("llamacpp", "burst-1", "burst", 1, 1, 2.0, loud("vllm", 0.9)),
        ("llamacpp", "burst-1.retry1", "burst", 1, 2, 0.9, QUIET),
    ]
    run = write(tmp_path, phases)
    (seq, burst) = table.build(run)
    assert burst.scaling_factor == pytest.approx(1.0) and burst.wall_s == pytest.approx(0.9)
    first = burst.repetitions[0]
    assert first.superseded and first.left_out == "superseded by a retry" and burst.left_out == []
    assert [p.phase for p in noise.clean(run, noise.assess(run)).phases] == ["sequential", "burst-1.retry1"]


def test_the_verdict_concludes_from_a_busy_hosts_phases_and_says_so(tmp_path):
    phases = [
        (i, n, s, r, a, w, loud("vllm", 0.7) if i == "llamacpp" else QUIET) for i, n, s, r, a, w, _ in three_reps()
    ]
    doc, numbers = sections.build(write(tmp_path, phases), "http://127.0.0.1:9", figures=False)
    verdicts = {v["instance"]: v for v in numbers["verdict"]["verdicts"]}
    llama = verdicts["llamacpp"]
    assert not llama["text"].startswith("no verdict: every phase") and llama["left_out"] == []
    assert verdicts["vllm"]["left_out"] == [] and verdicts["vllm"]["busy"] == ""
    setup = next(sec for sec in doc.sections if sec.title == "Setup")
    noise_table = next(b for b in setup.blocks if getattr(b, "caption", "").startswith("Host noise per phase"))
    assert len(noise_table.rows) == 12
    assert noise_table.rows[0][:5] == ["vLLM-CPU", "sequential", "0.900s", "1.00", "0.05 (-)"]
    llama_row = next(r for r in noise_table.rows if r[0].startswith("llama.cpp"))
    assert llama_row[-1] == "used, up to x1.54 slower: noisy: 70% of a core used by vllm while measuring llamacpp"
    assert numbers["noise"]["thresholds"]["group_cores"] == 0.25
    summary = {s["instance"]: s for s in numbers["summary"]}
    flag = next(line for line in summary["llamacpp"]["lines"] if line.startswith("Flag: busy host"))
    assert flag.startswith("Flag: busy host: 6 phases measured while other programs took the CPU (largest: vllm 0.70")
    assert "NOISE_FOREIGN_CPU_CORES=0.5" in flag


def test_the_setup_says_the_passes_added_while_a_factor_was_undecided(tmp_path):
    doc, _ = sections.build(
        write(tmp_path, three_reps(), trials={"repetitions": 2}), "http://127.0.0.1:9", figures=False
    )
    setup = next(sec for sec in doc.sections if sec.title == "Setup")
    trials = next(b.text for b in setup.blocks if getattr(b, "text", "").startswith("Trials:"))
    assert trials.startswith("Trials: 2 repetitions (3 ran: passes added while a scaling factor was undecided)")


def test_a_host_busy_before_the_run_is_said_when_no_phase_was_noisy(tmp_path):
    """The CPU priority kept a neighbour off the engines while they were measured: the Summary still says it was there."""
    before = {"window_s": 1.0, "foreign_cores": 1.01, "groups": [{"name": "bash -c", "kind": "process", "cores": 0.99}]}
    trials = {"repetitions": 3, "host_before": before, "cpu_priority": {"applied": True}}
    _, numbers = sections.build(write(tmp_path, three_reps(), trials=trials), "http://127.0.0.1:9", figures=False)
    lines = {s["instance"]: s["lines"] for s in numbers["summary"]}
    assert (
        "Flag: busy host: other programs used 1.01 cores just before the run (bash -c 0.99); no phase was noisy "
        "(the CPU priority kept them off the engines while measured)"
    ) in lines["vllm"]
    quiet = {**trials, "host_before": {**before, "foreign_cores": 0.1}}
    _, numbers = sections.build(
        write(tmp_path, three_reps(), trials=quiet, name="quiet"), "http://127.0.0.1:9", figures=False
    )
    assert not any("busy host" in line for s in numbers["summary"] for line in s["lines"])


def test_the_verdict_leaves_out_phases_with_outlier_requests(tmp_path):
    slow = {("llamacpp", name, 0): 25.9 for name in ("sequential", "burst-1")}
    phases = [p for p in three_reps() if p[3] == 1]
    doc, numbers = sections.build(write(tmp_path, phases, request_times=slow), "http://127.0.0.1:9", figures=False)
    llama = {v["instance"]: v for v in numbers["verdict"]["verdicts"]}["llamacpp"]
    assert llama["text"].startswith("no verdict: every phase of llamacpp held outlier requests")


def test_a_run_folder_from_before_repetitions_reads_as_one_repetition(tmp_path):
    folder = RunFolder.create(tmp_path, "old")
    folder.write_manifest({"engines": {"vllm": {"kind": "vllm"}}})
    record = json.loads(PhaseRecord("vllm", "vllm", "burst", "burst-1", T, T + 1, 3, 3, "seed3", SHA, 48).to_json())
    for key in ("repetition", "attempt", "noise"):
        del record[key]
    (folder.path / "phases.jsonl").write_text(json.dumps(record) + "\n")
    (phase,) = load(folder.path).phases
    assert (phase.repetition, phase.attempt, phase.noise) == (1, 1, None)
    assert noise.assess(load(folder.path)).of("vllm", "burst-1").usable


@pytest.mark.parametrize("bad", [{"repetition": 0}, {"attempt": -1}, {"noise": [1, 2]}, {"noise": {"x": 1e400}}])
def test_a_bad_repetition_or_noise_field_costs_only_its_record(tmp_path, bad):
    folder = RunFolder.create(tmp_path, "bad")
    folder.write_manifest({"engines": {"vllm": {"kind": "vllm"}}})
    good = json.loads(PhaseRecord("vllm", "vllm", "burst", "burst-1", T, T + 1, 3, 3, "seed3", SHA, 48).to_json())
    text = json.dumps({**good, "phase": "burst-2", **bad}).replace("Infinity", "1e400")
    (folder.path / "phases.jsonl").write_text(json.dumps(good) + "\n" + text + "\n")
    run = load(folder.path)
    assert [p.phase for p in run.phases] == ["burst-1"]
    assert any("phases.jsonl: 1 record skipped" in w for w in run.warnings)


def test_a_bad_noise_knob_is_one_line_in_the_report(tmp_path, monkeypatch, capsys):
    from servescope.report import cli

    monkeypatch.setenv("OUTLIER_RATIO", "0.5")
    assert cli.main(["--results", str(tmp_path), "--table-only"]) == 2
    assert capsys.readouterr().err == "report: OUTLIER_RATIO='0.5': expected a number >= 1\n"


def test_the_knees_summary_line_says_one_user_not_one_users():
    from servescope.report import summary

    knee = {"unit": "users", "status": "found", "knee": 1, "first_failing": 2, "binding": {}}
    assert summary._knee_line(knee) == "Knee: 1 user (fails at 2 users)"
    assert summary._knee_line({**knee, "knee": 2, "first_failing": 3}) == "Knee: 2 users (fails at 3 users)"
    stopped = {**knee, "unsettled": 3}
    assert (
        summary._knee_line(stopped)
        == "Knee: at most 1 user (failed at 2 users), not settled: about 3 more measurements would settle it"
    )
    rate = {"unit": "req/s", "status": "fails at the lowest load", "knee": None, "first_failing": 1, "binding": {}}
    assert summary._knee_line(rate) == "Knee: none: the SLOs fail at 1 req/s"


@pytest.mark.parametrize("as_array", [False, True])
def test_outliers_and_medians_are_the_same_from_a_list_or_an_array(tmp_path, monkeypatch, as_array):
    """A short run's request times are read as Python floats, a long run's as one array (stats.SORTED_IN_PYTHON):
    the same medians either way, so the same phases flagged, against the same median."""
    slow = {("llamacpp", "sequential#2", 0): 25.9, ("vllm", "burst-1", 1): 0.31}
    run = write(tmp_path, three_reps(), request_times=slow)
    if as_array:
        monkeypatch.setattr(noise.stats, "SORTED_IN_PYTHON", 0)
    assessment = noise.assess(run)
    assert [(t.instance, t.phase) for t in assessment.flagged()] == [("llamacpp", "sequential#2")]
    assert assessment.of("llamacpp", "sequential#2").flags == [
        "outlier request: p0 25.900s against the phase's median 0.300s (more than 3x)"
    ]
