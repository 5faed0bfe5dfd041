"""servescope.judgements.pace: a measurement's pace, and when repeated measurements of one load agree on it."""

from __future__ import annotations

import pytest

from servescope.judgements import pace
from tests.servescope.judgements.test_slo import rec


def test_the_pace_a_profile_is_scaled_to_is_the_mean_of_the_known_times():
    # A queue's capacity is one over its mean service time: a slow tail counts, where a median would leave it out.
    assert pace.pace([1.0, 1.0, 1.0, 5.0]) == pytest.approx(2.0)
    assert pace.pace([1.0, None, float("nan"), 3.0]) == pytest.approx(2.0)
    assert pace.pace([]) is None and pace.pace([None, float("inf")]) is None


def test_a_measurements_pace_is_its_successful_requests_mean_time_per_token():
    records = [rec(ttft=0.1, e2e=0.7), rec(ttft=0.1, e2e=1.0), rec(ok=False), rec(tokens=1, itl=())]
    assert pace.of_records(records) == pytest.approx((0.2 + 0.3) / 2)
    assert pace.of_records([rec(ok=False)]) is None


def test_paces_agree_within_a_twentieth_of_the_faster():
    assert pace.agree(1.0, 1.0 + pace.AGREE) and pace.agree(1.05, 1.0)
    assert not pace.agree(1.0, 1.0 + pace.AGREE * 1.01)


def test_one_pace_the_others_outvote_stands_out_and_nothing_else_does():
    assert pace.outvoted([13.9, 15.1, 13.5]) == {1}  # pass G's knee, with the third measurement it lacked
    assert pace.outvoted([13.9, 15.1]) == set()  # two: no majority says which was the transient
    assert pace.outvoted([13.0, 14.0, 15.0]) == set()  # no two agree: the speed moved, none stands out
    assert pace.outvoted([13.0, 13.1, 13.2]) == set()
    assert pace.outvoted([13.0, None, 13.1, 16.0, -1.0]) == {3}  # what is not a time is neither compared nor left out


def test_a_measurement_is_owed_while_no_two_known_paces_agree():
    assert pace.owed([13.9, 15.1]) and pace.owed([13.0, 14.0, 15.0])
    assert not pace.owed([13.9, 14.1]) and not pace.owed([13.9, 15.1, 13.5])
    assert not pace.owed([13.9]) and not pace.owed([13.9, None]) and not pace.owed([-0.3, -0.3])
