"""The plan check: a row predicted at the speed probed beside it, from the knee's measured shape; the band, the latency
MAPE over rows and the goal judged from them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bench import plan_check
from bench.plan_check import Measured, Speed, at_row_speed, at_speed, inside, latency_pairs, mape
from servescope.report.replicas import Level, Profile, Sharing


def _profile(ttft: float, tpot: float) -> Profile:
    return Profile("test", "llamacpp", (Level(1.0, np.array([ttft]), np.array([tpot]), 0.0, 10),), None, 1, 11, None)


def test_a_row_probed_slower_than_the_knee_is_predicted_at_the_probed_pace_busy_twin_too():
    knee, busy = _profile(0.1, 0.02), _profile(0.12, 0.025)
    now = Speed.mean([Speed(0.1, 0.021), Speed(0.1, 0.023)])  # before and after the row
    scaled, sharing = at_speed(knee, Sharing(2, busy), Speed.of_level(knee.levels[0]), now)  # no busy probe
    assert scaled.levels[0].tpot(0.5) == pytest.approx(0.022)
    assert scaled.levels[0].ttft(0.5) == pytest.approx(0.1)
    assert sharing.per_host == 2
    assert sharing.busy.levels[0].tpot(0.5) == pytest.approx(0.025 * 1.1)


def test_an_unknown_speed_leaves_the_knee_as_measured():
    knee = _profile(0.1, 0.02)
    assert at_speed(knee, None, Speed.of_level(knee.levels[0]), Speed.mean([None, None])) == (knee, None)


def test_a_busy_probe_sets_the_busy_twin_at_its_own_pace():
    knee, busy = _profile(0.1, 0.02), _profile(0.12, 0.025)
    alone_now, busy_now = Speed(0.1, 0.02), Speed(0.18, 0.03)
    scaled, sharing = at_speed(knee, Sharing(2, busy), Speed.of_level(knee.levels[0]), alone_now, busy_now)
    assert scaled.levels[0].tpot(0.5) == pytest.approx(0.02)
    assert sharing.busy.levels[0].ttft(0.5) == pytest.approx(0.18)
    assert sharing.busy.levels[0].tpot(0.5) == pytest.approx(0.03)


def test_the_row_speed_diagnostic_scales_prefill_by_the_engines_timing_and_tokens_by_the_rows_pace():
    knee = replace(_profile(0.1, 0.02), levels=(replace(_profile(0.1, 0.02).levels[0], prefill_ms=80.0),))
    busy = _profile(0.12, 0.025)  # no engine timing: its prefill follows its decode
    row = Measured(0.9, True, None, 0.03, 120.0)
    own, sharing = at_row_speed(knee, Sharing(2, busy), row)
    assert own.levels[0].tpot(0.5) == pytest.approx(0.03)
    assert own.levels[0].ttft(0.5) == pytest.approx(0.15)  # x 120/80
    assert own.levels[0].prefill_ms == pytest.approx(120.0)
    assert sharing.busy.levels[0].tpot(0.5) == pytest.approx(0.03)
    assert sharing.busy.levels[0].ttft(0.5) == pytest.approx(0.12 * 0.03 / 0.025)
    assert at_row_speed(knee, None, Measured(None, False, None, None, None)) == (knee, None)


def test_mape_is_the_mean_absolute_percentage_error_over_the_rows_that_have_both_sides():
    # |1.1 - 1| / 1 = 10%, |1.5 - 2| / 2 = 25%: 17.5%; a row missing a side, or measured at 0, is left out.
    assert mape([(1.1, 1.0), (1.5, 2.0), (None, 3.0), (2.0, None), (1.0, 0.0)]) == pytest.approx(17.5)
    assert mape([]) is None and mape([(None, 1.0)]) is None
    assert mape([(0.9, 1.0), (1.1, 1.0)]) == pytest.approx(10.0)  # over and under count alike


def test_latency_pairs_take_one_percentile_of_each_row_predicted_against_measured():
    rows = [
        ({"e2e_s": {"p50": 2.2, "p90": 3.0}}, {"e2e_s": {"p50": 2.0, "p90": 3.3}}),
        ({}, {"e2e_s": {"p50": 1.0}}),  # nothing succeeded in the prediction
    ]
    assert latency_pairs(rows, "e2e_s", "p50") == [(2.2, 2.0), (None, 1.0)]
    assert mape(latency_pairs(rows, "e2e_s", "p50")) == pytest.approx(10.0)


def test_a_measured_attainment_is_inside_the_band_from_slow_edge_to_fast_edge():
    assert inside([0.8, 0.95], 0.9) and inside([0.8, 0.95], 0.8) and inside([1.0, 1.0], 1.0)
    assert inside([0.8, 0.95], 0.96) is False and inside([0.8, 0.95], 0.79) is False
    assert inside(None, 0.9) is None and inside([None, 0.9], 0.9) is None and inside([0.8, 0.9], None) is None


def test_the_goal_needs_five_rows_of_six_in_the_band_and_the_e2e_p50_mapes_and_the_counts(capsys):
    def rows(error: float) -> list[tuple[dict, dict]]:
        return [({"e2e_s": {"p50": 1.0 + error}}, {"e2e_s": {"p50": 1.0}})] * 6

    five = [True] * 5 + [False]
    assert plan_check.judge(five, [True, True], rows(0.09), rows(0.04)) == 0
    assert plan_check.judge([True] * 4 + [False] * 2, [True], rows(0.0), rows(0.0)) == 1
    assert plan_check.judge(five, [True], rows(0.11), rows(0.0)) == 1  # 11% at the knee's speed
    assert plan_check.judge(five, [True], rows(0.0), rows(0.06)) == 1  # 6% at the row's
    assert plan_check.judge(five, [True, False], rows(0.0), rows(0.0)) == 1  # a count fewer than measured
    out = capsys.readouterr().out
    assert "inside the band in 4 of 6 rows (goal: 5): MISSED" in out and "E2E p50 MAPE 11.0%" in out


def test_the_band_widths_are_said_against_the_speed_spread_they_were_predicted_over():
    from servescope.report import speed

    spread = speed.Spread(speed.Edge(0.95, 0.97), speed.Edge(1.05, 1.03), speed.MEASURED)
    line = plan_check.band_widths([[0.8, 0.9], [1.0, 1.0], None], spread)
    assert line.startswith("band: 0.0-10.0 points wide over 2 rows (median 5.0), for a speed spread of 10.0%")
    assert "none" in plan_check.band_widths([None], speed.none("no level of the knee measured twice"))


def test_a_row_outside_the_band_says_by_how_many_points_and_which_side():
    assert plan_check.outside([0.8, 0.9], 0.75) == pytest.approx(-5.0)
    assert plan_check.outside([0.8, 0.9], 0.93) == pytest.approx(3.0)
    assert plan_check.outside([0.8, 0.9], 0.85) == 0.0


def test_a_speed_is_the_pace_of_its_level_so_a_slow_tail_moves_it():
    level = Level(1.0, np.array([0.1, 0.1, 0.1, 0.5]), np.array([0.02, 0.02, 0.02, 0.06]), 0.0, 4)
    pace = Speed.of_level(level)
    assert pace.ttft_s == pytest.approx(0.2) and pace.tpot_s == pytest.approx(0.03)
    assert plan_check.knee_speed(Profile("t", "llamacpp", (level,), None, 1, 11, None)) == pytest.approx(0.03)
