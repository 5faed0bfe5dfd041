"""The plan bounded and fast (issue 42, cases 5, 6, 8, 9, 10): a simulation that always ends, limits checked before any
work, ITL terms modelled or refused in one line, and a knee.json that cannot crash or hold it."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest

from servescope.contracts.runfolder import KNEE
from servescope.contracts.settings import PlanSettings
from servescope.judgements import slo
from servescope.report import plan, replica_events, replicas, traffic
from servescope.report.replicas import Arrival, Level, Profile
from tests.servescope.report.plan_knees import knee_folder, real_knee

pytestmark = pytest.mark.timeout(120)  # a hang is what several of these guard against: it fails, never blocks


def refused(capsys, argv: list[str], said: str) -> None:
    """plan.main refuses `argv` with exit 2 and one line that says `said`."""
    assert plan.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("plan: ") and said in err[0], err


# ---------------------------------------------------------------- case 5: the simulation always ends


def test_a_knee_of_one_token_answers_decodes_in_no_time_and_the_plan_refuses_longer_answers(tmp_path, capsys):
    # Regression: a knee made with --max-tokens 1 measured no time per token (0): the loop rescheduled a request
    # whose tokens never decreased at the same instant for ever (replicas.py:259).
    no_decode = Profile("one-token", "vllm", (Level(1.0, np.array([0.1]), np.zeros(0), 0.0, 10),), None, None, 1, None)
    out = replicas.simulate([Arrival(0.0, 200), Arrival(0.05, 200)], no_decode, 1)
    assert [o.ok for o in out] == [True, False]  # the second meets 2 in flight, above the knee's 1: beyond
    assert out[0].e2e_s == pytest.approx(out[0].ttft_s)
    folder = knee_folder(tmp_path, tokens=1, gap=None)
    refused(capsys, [str(folder), "--trace", "trace-small", "--out", str(tmp_path / "o")], "no time per output token")
    assert plan.main([str(folder), "--rate", "1", "--duration", "30", "--out", str(tmp_path / "o")]) == 0  # 1 token


def _late_profile_and_trace(seed: int) -> tuple[Profile, list[Arrival], int, str]:
    """A realistic profile and 200 arrivals 1e5-6e5 s into a trace (the attack's generator)."""
    rng = random.Random(seed)
    levels, c = [], 0
    for _ in range(rng.randint(1, 5)):
        c += rng.randint(1, 4)
        ttft = np.sort([rng.uniform(0.05, 3) for _ in range(5)])
        tpot = np.sort([rng.uniform(0.01, 0.2) for _ in range(5)])
        levels.append(Level(float(c), ttft, tpot, 0.0, 5))
    profile = Profile("p", "vllm", tuple(levels), None, rng.choice([None, 1, 2, 4]), rng.randint(2, 300), None)
    t, arrivals = rng.uniform(1e5, 6e5), []
    for _ in range(200):
        t += rng.expovariate(rng.uniform(0.2, 3))
        arrivals.append(Arrival(t, rng.randint(1, 300)))
    return profile, arrivals, rng.randint(1, 3), rng.choice(replicas.POLICIES)


@pytest.mark.parametrize("seed", [21, 23, 24, 30])  # each hung the loop before (float absorption)
def test_a_trace_hundreds_of_thousands_of_seconds_long_ends(seed):
    # Regression: at 6e5 s a step of a few tokens' remainder is below the clock's resolution: `last + remaining * pace
    # == last`, and the request was scheduled again at the same instant for ever.
    profile, arrivals, n, policy = _late_profile_and_trace(seed)
    out = replicas.simulate(arrivals, profile, n, policy, seed)
    assert len(out) == len(arrivals) and all(o.e2e_s is None or o.e2e_s >= o.ttft_s >= 0 for o in out)


def test_the_compiled_loop_gives_what_its_python_source_gives():
    # numba compiles servescope/report/replica_events.py's own source; run as Python it must say the same, request by request.
    profile, arrivals, n, policy = _late_profile_and_trace(21)
    schedule = replicas.Schedule.of(arrivals)
    tokens = np.where(schedule.output_tokens > 0, schedule.output_tokens, profile.output_tokens)
    compiled = replicas.run(schedule, profile, n, policy, 21)
    own = replicas._pack(profile)
    args = (schedule.at, tokens, replicas.draws(21, len(arrivals)), n, policy == replicas.ROUND_ROBIN, 21)
    interpreted = replica_events._run(*args, -1 if profile.slots is None else profile.slots, 1, False, *own, *own)
    np.testing.assert_array_equal(compiled.replica, interpreted[0])
    np.testing.assert_array_equal(compiled.e2e_s, interpreted[2])


# ---------------------------------------------------------------- case 6: limits checked before any work


@pytest.mark.parametrize(
    "argv, env, said",
    [
        (["--rate", "1e-6", "--duration", "1e9"], {}, "PLAN_WINDOW_S"),  # 1,000 requests over 31 years
        (["--trace", "trace-small", "--speed", "1e-9"], {}, "PLAN_WINDOW_S"),
        (["--rate", "1", "--duration", "60"], {"PLAN_WINDOW_S": "1e-300"}, "PLAN_WINDOW_S"),
        (["--rate", "1", "--duration", "60"], {"PLAN_REPEATS": "100000"}, "PLAN_REPEATS=100000: expected 1 to 100"),
        (["--rate", "1", "--duration", "60"], {"PLAN_MAX_REPLICAS": "1000000"}, "PLAN_MAX_REPLICAS"),
        (["--rate", "1", "--duration", "60"], {"PLAN_WINDOW_S": "abc"}, "PLAN_WINDOW_S='abc'"),
        (["--trace", "trace-small"], {"PLAN_SPEED": "nan"}, "PLAN_SPEED"),
        (["--rate", "3000", "--duration", "1000"], {}, "2,000,000"),
        (["--rate", "1", "--per-host", "100000", "--busy-knee", "x"], {}, "--per-host 100000: expected 1 to 64"),
    ],
)
def test_a_plan_too_large_is_refused_in_one_line_before_any_work(tmp_path, capsys, monkeypatch, argv, env, said):
    # Regression: these ran past 120 s or reached MemoryError at 4 GB.
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    refused(capsys, [str(knee_folder(tmp_path)), *argv, "--out", str(tmp_path / "o")], said)


def test_a_traffic_of_millions_is_one_repetition():
    big = traffic.Traffic("big", (Arrival(0.0),) * 2_000_000, 1000.0)
    assert plan.repetitions(big, 3) == 1
    assert plan.repetitions(traffic.constant(1, 60), 3) == 3


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_million_arrivals_are_planned_on_a_real_knee(tmp_path, capsys):
    # Regression: `--rate 2000 --duration 1000`, the loader's own maximum, ran past 240 s (bench/plan_scale.py times
    # it; here only that it ends with an answer).
    knee = real_knee(tmp_path)
    assert plan.main([str(knee), "--rate", "2000", "--duration", "1000", "--out", str(tmp_path / "o")]) == 0
    doc = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert doc["traffic"]["requests"] == 2_000_000
    row = doc["rows"][0]
    assert row["replicas"] is None and row["attainment"] is not None  # one replica serves ~0.2 req/s: > 64


# ---------------------------------------------------------------- case 8: ITL terms modelled, or refused


def test_itl_terms_are_modelled_from_the_knees_gaps_and_never_make_every_count_miss(tmp_path, capsys):
    # Regression: the model's requests carried no gaps, so any itl_pQ term missed and the plan said ">64".
    folder = knee_folder(tmp_path, gap=0.02)
    offered = traffic.poisson(4, 120)
    s = plan.settings_of(PlanSettings.from_env())

    def replicas_for(text: str) -> int | None:
        row, _ = plan.plan(
            plan.profile_of(folder), offered, slo.parse(text, 0.9), s["routing"], 1, 60, 16, None
        )  # fmt: skip
        return row.replicas

    alone = replicas_for("ttft_p95<=0.5")
    assert alone is not None
    assert replicas_for("ttft_p95<=0.5,itl_p95<=10") == alone  # a loose ITL term changes nothing
    assert replicas_for("ttft_p95<=0.5,itl_p95<=0.1") == alone  # the knee's 0.02-s gaps meet it
    assert replicas_for("ttft_p95<=0.5,itl_p95<=0.01") is None  # every gap is 0.02 s: no count meets it


def test_the_knee_reports_plan_under_the_default_shaped_slo_names_a_count(tmp_path, monkeypatch):
    # Regression: the knee report's "Replicas for a traffic" said ">64" for every run with ttft_p95<=0.5,itl_p95<=0.1.
    monkeypatch.setenv("PLAN_TRACE", "trace-small")
    knobs = PlanSettings.from_env()  # as the report's entry reads them
    doc, rows = plan.for_report(knee_folder(tmp_path, gap=0.02), slo.parse("ttft_p95<=0.5,itl_p95<=0.1"), knobs)
    assert rows and rows[0].replicas is not None and "not_planned" not in doc


def test_itl_terms_on_a_knee_without_gaps_are_refused_in_one_line(tmp_path, capsys, monkeypatch):
    folder = knee_folder(tmp_path, gap=None)
    argv = [str(folder), "--rate", "1", "--duration", "60", "--out", str(tmp_path / "o")]
    refused(capsys, [*argv, "--slo", "ttft_p95<=0.5,itl_p95<=0.1"], "no inter-token gaps")
    # The knee report's section says the same instead of ">64" for the default-shaped SLO
    monkeypatch.setenv("PLAN_TRACE", "trace-small")
    doc, rows = plan.for_report(folder, slo.parse("ttft_p95<=0.5,itl_p95<=0.1"), PlanSettings.from_env())
    assert rows == [] and "no inter-token gaps" in doc["not_planned"]


def test_the_model_gaps_judged_from_columns_agree_with_slo_evaluate_on_the_real_knee(tmp_path):
    profile = plan.profile_of(real_knee(tmp_path))
    load = traffic.poisson(0.4, 300)
    out = replicas.run(replicas.Schedule.of(load.arrivals), profile, 2)
    shapes = replicas.shapes(profile)
    made = plan.records(profile, out, shapes)
    assert any(r.itl_s and max(r.itl_s) > 5 * min(g for g in r.itl_s if g > 0) for r in made)  # stalls carried over
    window = np.zeros(len(out), np.int64)
    for text in ("ttft_p95<=3,itl_p95<=0.2", "itl<=1,tpot<=0.1", "itl_p50<=0.08,e2e<=20", "ttft<=2,itl_p99<=0.3"):
        spec = slo.parse(text, 0.9)
        tally = plan._Tally(spec, 1)
        tally.add(out, window, shapes)
        expected = slo.evaluate(spec, made, 300.0)
        assert tally.holds(0) == expected.meets, text
        assert int(tally.good[0]) == expected.good, text


# ---------------------------------------------------------------- case 9: the plan's wrong answers


def test_a_level_where_every_request_failed_is_modelled_as_failing(tmp_path, capsys):
    # Regression: IndexError (replicas.py:57) drawing a TTFT from a level with no successful request.
    folder = knee_folder(tmp_path, failed_levels=(4,))
    profile = plan.profile_of(folder)
    assert len(profile.levels[-1].ttft_s) == 0 and profile.levels[-1].failed_share == 1.0
    out = replicas.simulate([Arrival(i * 0.01) for i in range(4)], profile, 1)
    assert [o.ok for o in out] == [True, True, False, False]  # the third and fourth met the 4-user level
    assert plan.main([str(folder), "--rate", "5", "--duration", "60", "--out", str(tmp_path / "o")]) == 0
    capsys.readouterr()
    refused(capsys, [str(knee_folder(tmp_path / "all", failed_levels=(1, 2, 4))), "--rate", "1"], "every request")


@pytest.mark.parametrize("slots", ["0", "-1"])
def test_slots_below_one_are_refused(tmp_path, capsys, slots):
    # Regression: exit 0, "1 replica".
    refused(capsys, [str(knee_folder(tmp_path)), "--rate", "1", "--slots", slots], f"--slots {slots}")


@pytest.mark.parametrize("argv", [["--rate", "0.5", "--duration", "1"], ["--poisson", "0.001", "--duration", "1"]])
def test_a_traffic_of_no_request_is_refused(tmp_path, capsys, argv):
    # Regression: planned as "1 replica".
    refused(capsys, [str(knee_folder(tmp_path)), *argv, "--out", str(tmp_path / "o")], "no request arrives")


# ---------------------------------------------------------------- case 10: knee.json read through a schema


def _mutate(folder, change) -> None:
    summary = json.loads((folder / KNEE).read_text())
    change(summary)
    (folder / KNEE).write_text(json.dumps(summary))


@pytest.mark.parametrize(
    "change, said",
    [
        (lambda s: s.update(knee=[2]), "knee: expected a load above 0"),  # was: unhashable
        (lambda s: s["probes"][0].update(level=0), "probes[0].level: expected a load above 0"),  # ZeroDivisionError
        (lambda s: s["probes"][1].update(level="2"), "probes[1].level"),
        (lambda s: s["probes"][0].update(level=True), "probes[0].level"),
        (lambda s: s.update(over="users"), "over: expected"),
        (lambda s: s.update(probes={"a": 1}), "no probes"),
        (lambda s: s["probes"].append(7), "probes[3]: expected an object"),
        (lambda s: s.update(objective=7), "objective"),
        (lambda s: s.update(instance={"x": 1}), "instance: expected a string"),
    ],
)
def test_a_damaged_knee_json_is_refused_in_one_line(tmp_path, capsys, change, said):
    folder = knee_folder(tmp_path)
    _mutate(folder, change)
    refused(capsys, [str(folder), "--rate", "1", "--out", str(tmp_path / "o")], said)


def test_deep_nesting_and_a_fifo_in_place_of_knee_json_are_refused(tmp_path, capsys):
    # Regression: RecursionError; and a FIFO held the plan for ever.
    folder = knee_folder(tmp_path)
    (folder / KNEE).write_text('{"probes": [], "over": "concurrency", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    refused(capsys, [str(folder), "--rate", "1"], "nested too deep")
    (folder / KNEE).unlink()
    os.mkfifo(folder / KNEE)
    refused(capsys, [str(folder), "--rate", "1"], "not a regular file")
