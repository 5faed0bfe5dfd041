"""The plan over the speed its knee measured: the spread read from a knee's repeated measurements (servescope/report/speed.py),
the band it predicts, the count rule, PLAN_SLOWER as an override, and the predicted latency percentiles."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.contracts.runfolder import KNEE, PhaseRecord, RequestRecord, RunFolder
from servescope.contracts.settings import PlanSettings
from servescope.judgements import slo
from servescope.report import plan, replicas, speed, traffic
from servescope.report.replicas import Level, Profile

# (users, [(TTFT s, time per token s, load average), one a measurement])
VARYING = (
    (1, [(0.10, 0.020, 1.0)]),
    (2, [(0.12, 0.020, 1.2), (0.144, 0.024, 3.5)]),  # the second measurement ran 20% slower: a neighbour came in
    (4, [(0.90, 0.030, 3.0), (0.90, 0.030, 3.1)]),
)


def varying_knee(tmp_path, measured=VARYING, tokens=11, engine_prefill=False):
    """A closed-loop knee whose levels were measured once or more, each measurement at its own speed, 20 requests
    each, its host noise beside it (the load average; the engine alone on 2 cores, 0.5 cores taken by others)."""
    folder = RunFolder.create(tmp_path, "knee")
    folder.write_manifest(
        {"run_id": "knee", "engines": [{"instance": "vllm", "kind": "vllm"}], "flags": {"slo": "ttft<=0.5"}}
    )
    probes = []
    t0 = 1_000_000.0
    for users, runs in measured:
        for rep, (ttft, tpot, load1) in enumerate(runs, 1):
            phase = f"knee-c{users}-{rep}"
            for i in range(20):
                stats = {"timings": {"prompt_ms": ttft * 800}} if engine_prefill else None
                folder.append_request(
                    RequestRecord(
                        "vllm",
                        "vllm",
                        "knee",
                        phase,
                        "openai",
                        "m",
                        "synthetic:256",
                        "sha",
                        f"p{i}",
                        tokens,
                        t0 + i,
                        True,
                        200,
                        ttft_s=ttft,
                        e2e_s=ttft + (tokens - 1) * tpot,
                        output_tokens=tokens,
                        prompt_tokens=256,
                        engine_stats=stats,
                    )  # fmt: skip
                )
            noise = {
                "engine_found": True,
                "cores": 2,
                "engine_allowed_cores": 2.0,
                "foreign_cores": 0.5,
                "steal_share": 0.0,
                "load1_end": load1,
            }
            folder.append_phase(
                PhaseRecord(
                    "vllm",
                    "vllm",
                    "knee",
                    phase,
                    t0,
                    t0 + 20,
                    20,
                    users,
                    "synthetic:256",
                    "sha",
                    tokens,
                    rep,
                    noise=noise,
                )  # fmt: skip
            )
            probes.append({"phase": phase, "level": users, "trusted": True})
            t0 += 100
    summary = {"over": "concurrency", "engine": "vllm", "instance": "vllm", "spec": "ttft<=0.5", "objective": 0.9}
    (folder.path / KNEE).write_text(json.dumps({**summary, "knee": 2, "status": "found", "probes": probes}))
    return folder.path


def test_the_spread_is_each_repeated_measurements_speed_against_its_level_pooled(tmp_path):
    spread = plan.profile_of(varying_knee(tmp_path)).speed
    assert spread.source == speed.MEASURED
    # Level 2: time per token 0.020 and 0.024 against the pooled median 0.022 (ratios 0.909, 1.091), TTFT 0.12 and
    # 0.144 against 0.132; level 4: both at its pooled speed (1.0, 1.0); level 1, measured once, counts nothing.
    assert sorted(m.phase for m in spread.measurements) == ["knee-c2-1", "knee-c2-2", "knee-c4-1", "knee-c4-2"]
    # The band: level 2's two log ratios sit +-d from their mean, level 4's at 0; pooled over 4 - 2 = 2 degrees of
    # freedom, s = sqrt(2 d^2 / 2) = d; the 90th percentile of a later run is t(0.9, 2) * s * sqrt(1 + 1/2) out.
    d = (np.log(0.024 / 0.022) - np.log(0.02 / 0.022)) / 2
    half = 1.886 * d * np.sqrt(1.5)
    assert spread.slow.tpot == pytest.approx(np.exp(half), rel=1e-3)
    assert spread.fast.tpot == pytest.approx(np.exp(-half), rel=1e-3)
    assert spread.slow.ttft == pytest.approx(np.exp(half), rel=1e-3)  # TTFT moved by the same 20%
    text = spread.describe()
    assert "4 measurements of 2 level(s)" in text and "load average 1.2-3.5" in text and "up to x1.33" in text
    # 0.5 cores taken by others is under the noise rule's threshold: the spread is not said to be a busy host's
    assert "busy host" not in text


def test_a_spread_measured_on_a_busy_host_says_the_band_holds_only_while_it_stays_busy(tmp_path, monkeypatch):
    monkeypatch.setenv("NOISE_FOREIGN_CPU_CORES", "0.4")  # the knee's rule: 0.5 cores taken by others is busy
    text = plan.profile_of(varying_knee(tmp_path)).speed.describe()
    assert "4 of 4 measured on a busy host (the knee's noise rule): the band holds only while the host stays" in text


def test_the_engines_own_prefill_timing_sets_the_prefill_spread_where_it_times_each_request(tmp_path):
    # TTFT moves 20% at level 2 but the engine's prefill timing (prompt_ms) is what is read: here the same 20%.
    timed = plan.profile_of(varying_knee(tmp_path / "a", engine_prefill=True)).speed
    assert timed.slow.ttft == pytest.approx(plan.profile_of(varying_knee(tmp_path / "b")).speed.slow.ttft)
    assert all(m.prefill is not None for m in timed.measurements)


def test_a_knee_measuring_each_level_once_has_no_spread_and_says_so(tmp_path):
    once = ((1, [(0.1, 0.02, 1.0)]), (2, [(0.12, 0.02, 1.0)]), (4, [(0.9, 0.03, 1.0)]))
    spread = plan.profile_of(varying_knee(tmp_path, once)).speed
    assert spread.point and spread.source == speed.NONE
    assert "no level of the knee measured twice" in spread.describe()


def test_one_token_answers_take_the_prefill_spread_for_the_decode_too(tmp_path):
    spread = plan.profile_of(varying_knee(tmp_path, tokens=1)).speed
    assert spread.slow.ttft > 1 and spread.slow.tpot == pytest.approx(spread.slow.ttft)


def test_the_band_holds_the_knee_speed_and_is_printed_from_slow_to_fast(tmp_path, capsys):
    knee = varying_knee(tmp_path)
    assert plan.main([str(knee), "--poisson", "5", "--duration", "120", "--out", str(tmp_path / "o")]) == 0
    printed = capsys.readouterr().out
    row = json.loads((tmp_path / "o" / "plan.json").read_text())["rows"][0]
    slow, fast = row["attainment_band"]
    assert slow <= row["attainment"] <= fast
    assert row["speed"]["source"] == speed.MEASURED and row["speed"]["percentiles"] == [10, 90]
    assert plan.band([slow, fast]) in printed and "speed spread: time per token" in printed
    assert row["replicas"] >= row["replicas_at_knee_speed"]
    for edge in ("knee", "slow", "fast"):
        assert set(row["latency"][edge]) == {"ttft_s", "e2e_s"}
        assert set(row["latency"][edge]["e2e_s"]) == {"p50", "p90", "p99"}
    # A slower engine is never predicted faster: the slow edge's percentiles at or above the knee's, the fast's below
    lat = row["latency"]
    assert lat["fast"]["e2e_s"]["p50"] <= lat["knee"]["e2e_s"]["p50"] <= lat["slow"]["e2e_s"]["p50"]
    assert "predicted latency at" in printed


def test_plan_slower_overrides_the_measured_spread_and_zero_turns_the_band_off(tmp_path, monkeypatch):
    profile = plan.profile_of(varying_knee(tmp_path))
    monkeypatch.setenv("PLAN_SLOWER", "")
    assert plan.spread_of(plan.settings_of(PlanSettings.from_env()), profile) is profile.speed
    monkeypatch.setenv("PLAN_SLOWER", "0.25")
    over = plan.spread_of(plan.settings_of(PlanSettings.from_env()), profile)
    assert over.source == speed.OVERRIDE and over.slow == speed.Edge(1.25, 1.25)
    assert over.fast == speed.Edge(pytest.approx(0.8), pytest.approx(0.8))
    assert "PLAN_SLOWER, set by hand" in over.describe()
    monkeypatch.setenv("PLAN_SLOWER", "0")
    assert plan.spread_of(plan.settings_of(PlanSettings.from_env()), profile).point
    monkeypatch.setenv("PLAN_SLOWER", "-1")
    with pytest.raises(plan.PlanError, match="PLAN_SLOWER='-1': expected empty"):
        plan.settings_of(PlanSettings.from_env())


def test_the_plan_json_says_which_spread_a_row_was_predicted_over(tmp_path, monkeypatch):
    monkeypatch.setenv("PLAN_SLOWER", "0.1")
    out = tmp_path / "o"
    assert plan.main([str(varying_knee(tmp_path)), "--rate", "2", "--duration", "60", "--out", str(out)]) == 0
    row = json.loads((out / "plan.json").read_text())["rows"][0]
    assert row["speed"]["source"] == "PLAN_SLOWER" and row["speed"]["slow"]["tpot"] == pytest.approx(1.1)


def test_a_slow_edge_that_needs_more_replicas_names_both_counts():
    # One slot, a request 0.3 s alone; arrivals every 0.31 s: one replica keeps up at the knee's speed, not at +20%.
    one_slot = Profile("t", "vllm", (Level(1, np.array([0.1]), np.array([0.02]), 0.0, 10),), 1, 1, 11, None)
    spread = speed.Spread(speed.Edge(0.9, 0.9), speed.Edge(1.2, 1.2), speed.MEASURED)
    spec = slo.parse("ttft<=0.5", 0.9)
    row, _ = plan.plan(
        one_slot, traffic.constant(1 / 0.31, 60), spec, replicas.LEAST_CONN, 1, 60, 8, None, spread=spread
    )
    assert (row.replicas_at_knee_speed, row.replicas) == (1, 2)
    slow, fast = row.attainment_band
    assert slow >= 0.9  # the recommended count holds at the slow edge
    assert any(n.startswith("1 replica(s) meet the SLOs if the engine keeps its knee speed; 2 hold") for n in row.notes)


@settings(derandomize=True, max_examples=200, deadline=None)
@given(need=st.integers(1, 5000), missing=st.integers(0, 5000), limit=st.integers(1, 5000))
def test_the_search_finds_the_fewest_count_above_a_known_miss_in_logarithmic_steps(need, missing, limit):
    missing = min(missing, need - 1, limit - 1)
    asked: list[int] = []

    def meets(n: int) -> bool:
        asked.append(n)
        return n >= need

    found = plan._fewest(meets, missing, limit)
    assert found == (need if need <= limit else None)
    assert all(missing < n <= limit for n in asked)
    assert len(asked) <= 2 * (limit - missing).bit_length() + 1


def test_the_predicted_percentiles_are_numpys_of_the_successful_requests():
    values = np.array([0.3, 0.1, 0.2, 0.5])
    assert plan.percentiles(values) == {f"p{q}": pytest.approx(np.percentile(values, q)) for q in (50, 90, 99)}
    assert plan.percentiles(np.zeros(0)) == {}


def _knee_and_later(rng, levels: int, repeats: int, sd: float) -> tuple[list[speed.Measurement], float]:
    """A knee's measurements of `levels` levels, `repeats` each, every one's log speed drawn around its level's with
    `sd`, taken as `measurements` takes them (each against its level's pooled median); and a later run's speed at one
    of those levels against the same pooled median (the knee's speed, ratio 1, is what the plan draws from)."""
    found = []
    later = 1.0
    for level in range(1, levels + 1):
        logs = rng.normal(0.0, sd, repeats)
        pooled = np.median(np.exp(logs))
        found += [
            speed.Measurement(f"c{level}-{i}", level, float(np.exp(x) / pooled), None) for i, x in enumerate(logs)
        ]
        later = float(np.exp(rng.normal(0.0, sd)) / pooled)
    return found, later


@pytest.mark.parametrize(("levels", "repeats"), [(1, 2), (2, 2), (3, 2), (2, 3)])
def test_a_later_runs_speed_falls_in_the_band_as_often_as_its_percentiles_say(levels, repeats):
    # The band's promise is about a later run: its 10th-90th percentiles should hold it 80% of the time. Simulated
    # knees with a true spread between runs; the measurements' own percentiles held it far less often (with two
    # measurements of a level, their ratios to the pooled median sit at half their difference).
    rng = np.random.default_rng(7)
    inside = 0
    trials = 3000
    for _ in range(trials):
        found, later = _knee_and_later(rng, levels, repeats, sd=0.05)
        spread = speed.of(found)
        inside += spread.fast.tpot <= later <= spread.slow.tpot
    assert 0.76 <= inside / trials <= 0.86


def test_the_t_table_falls_towards_the_normal_as_the_measurements_grow():
    values = [speed.t90(df) for df in (1, 2, 3, 5, 10, 15, 20, 30, 100)]
    assert values == sorted(values, reverse=True) and values[0] == pytest.approx(3.078) and values[-1] == speed.Z90


def test_a_levels_engine_prefill_is_its_pace(tmp_path):
    # Engine-timed prefill 80 ms at every measurement of level 1 but one, 20% slower: the mean, not the median.
    measured = ((1, [(0.10, 0.020, 1.0), (0.10, 0.020, 1.0), (0.10, 0.020, 1.0), (0.12, 0.020, 1.0)]),)
    profile = plan.profile_of(varying_knee(tmp_path, measured, engine_prefill=True))
    assert profile.levels[0].prefill_ms == pytest.approx(80 * 1.05)


def test_a_measurement_its_levels_others_outvote_in_pace_is_left_out_of_the_replica_not_the_spread(tmp_path, capsys):
    # Level 2 measured three times: the second 20% slower a token, the other two alike. The replica is modelled from
    # the two that agree; the spread still counts all three; the plan's notes name the one left out.
    measured = (
        (1, [(0.10, 0.020, 1.0)]),
        (2, [(0.12, 0.020, 1.0), (0.144, 0.024, 1.0), (0.12, 0.0201, 1.0)]),
    )
    profile = plan.profile_of(varying_knee(tmp_path, measured))
    two = profile.levels[1]
    assert two.requests == 40 and float(two.tpot_s.max()) == pytest.approx(0.0201)
    assert len(profile.speed.measurements) == 3
    assert profile.outvoted == ("knee-c2-2 (24.0 ms a token; the level's others 20.0, 20.1)",)
    row, _ = plan.plan(profile, traffic.constant(0.5, 60), slo.parse("ttft<=0.5"), replicas.LEAST_CONN, 1, 60, 4, None)
    assert any(
        note.startswith("left out of the modelled replica, in the spread only: knee-c2-2 (24.0 ms")
        for note in row.notes
    )


def test_two_measurements_that_disagree_are_both_kept(tmp_path):
    # Without a third to say which one was the transient, neither is left out.
    profile = plan.profile_of(varying_knee(tmp_path))
    assert profile.outvoted == () and profile.levels[1].requests == 40
