"""The plan check's speed probe: a row predicted at the speed probed beside it, from the knee's measured shape."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bench.plan_check import Measured, Speed, at_row_speed, at_speed
from report.replicas import Level, Profile, Sharing


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
