"""Percentiles (type 7, hand-computed), summaries and the seeded bootstrap on medians."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.judgements import stats


def test_percentile_by_hand():
    data = [0.6, 0.2, 0.4]  # sorted: 0.2 0.4 0.6
    assert stats.percentile(data, 50) == pytest.approx(0.4)
    assert stats.percentile(data, 90) == pytest.approx(0.4 + 0.8 * 0.2)  # rank 1.8
    assert stats.percentile(data, 95) == pytest.approx(0.58)  # rank 1.9
    assert stats.percentile(data, 99) == pytest.approx(0.596)  # rank 1.98
    assert stats.percentile([7.0], 99) == 7.0
    assert stats.percentile([], 50) is None
    ten = list(range(1, 11))  # rank for p90 = 8.1 -> 9 + 0.1 x 1
    assert stats.percentile(ten, 90) == pytest.approx(9.1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=40), st.sampled_from([0, 50, 90, 95, 99, 100]))
def test_percentile_matches_numpy_linear(values, q):
    assert stats.percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-9)


def test_summary_ignores_missing_and_non_finite():
    s = stats.summary([1.0, None, float("nan"), 3.0])
    assert s["n"] == 2 and s["mean"] == 2.0 and s["p50"] == 2.0 and s["min"] == 1.0 and s["max"] == 3.0
    empty = stats.summary([])
    assert empty["n"] == 0 and empty["p99"] is None and empty["mean"] is None


def test_paired_bootstrap_of_a_constant_shift_is_exact():
    baseline = [0.5, 0.9, 1.7, 2.2, 3.1, 0.3]
    current = [b + 1.0 for b in baseline]  # every prompt exactly 1 s slower
    r = stats.bootstrap_median_delta(current, baseline, paired=True)
    assert r["delta"] == pytest.approx(1.0)
    assert r["ci_low"] == pytest.approx(1.0) and r["ci_high"] == pytest.approx(1.0)
    assert r["resamples"] == 2000 and r["paired"] is True


def test_unpaired_bootstrap_is_seeded_and_brackets_the_delta():
    rng = np.random.default_rng(1)
    a, b = list(rng.normal(2.0, 0.2, 60)), list(rng.normal(1.0, 0.2, 50))
    r1 = stats.bootstrap_median_delta(a, b, paired=False)
    r2 = stats.bootstrap_median_delta(a, b, paired=False)
    assert r1 == r2  # same seed, same interval
    assert r1["ci_low"] < r1["delta"] < r1["ci_high"]
    assert 0.8 < r1["ci_low"] and r1["ci_high"] < 1.2
    assert r1["delta_pct"] == pytest.approx(100 * r1["delta"] / r1["median_baseline"])


def test_bootstrap_with_an_empty_side_gives_no_interval():
    r = stats.bootstrap_median_delta([], [1.0], paired=False)
    assert r["delta"] is None and r["ci_low"] is None
    with pytest.raises(ValueError):
        stats.bootstrap_median_delta([1.0, 2.0], [1.0], paired=True)


def test_huge_pools_are_subsampled_and_stay_fast():
    rng = np.random.default_rng(2)
    a, b = list(rng.exponential(0.02, 300_000)), list(rng.exponential(0.01, 250_000))
    r = stats.bootstrap_median_delta(a, b, paired=False, resamples=200)
    assert r["subsampled"] and r["n_current"] == 300_000
    true_delta = 0.02 * np.log(2) - 0.01 * np.log(2)
    assert r["ci_low"] < true_delta < r["ci_high"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=30),
    st.integers(1, 8),
    st.integers(0, 2**32),
)
def test_resampled_medians_are_numpys_medians(values, rows, seed):
    """The bootstrap counts ranks instead of partitioning: the same medians, bit for bit (ties and odd/even sizes)."""
    data = np.asarray(values + values[: len(values) // 3])  # some exact ties
    idx = np.random.default_rng(seed).integers(0, len(data), size=(rows, len(data) + seed % 2))
    assert np.array_equal(stats.resampled_medians(data, idx), np.median(data[idx], axis=1))


@pytest.mark.parametrize("size", [1, 2, 7, 8])
@pytest.mark.parametrize("q", [None, 10, 90])
def test_drawn_resamples_have_the_distribution_of_resampled_values(size, q):
    """Unpaired resamples are drawn from their order statistics: each value (median or type-7 percentile) comes up
    as often as when n indices are drawn and partitioned."""
    data = np.asarray([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0][:size])
    ranked, k = stats._Ranked(data), 200_000
    idx = np.random.default_rng(7).integers(0, size, size=(k, size))
    if q is None:
        direct, drawn = ranked.medians(idx), ranked.drawn_medians(np.random.default_rng(8), k)
    else:
        direct, drawn = ranked.percentiles(idx, q), ranked.drawn_percentiles(np.random.default_rng(8), k, q)
    values = np.union1d(direct, drawn)
    counts = [np.bincount(np.searchsorted(values, x), minlength=len(values)) / k for x in (direct, drawn)]
    assert np.abs(counts[0] - counts[1]).sum() / 2 < 0.02  # total variation: sampling noise only


def test_a_subsampled_interval_sits_around_the_exact_delta():
    """Regression: with pools too large to pass whole, the delta came from the exact medians and the interval from
    the subsample's, which need not hold it (the comparison plot then failed on a negative error bar)."""
    rng = np.random.default_rng(5)
    cur, base = rng.normal(1.0, 0.01, 20_000), rng.normal(0.5, 0.01, 20_000)
    r = stats.bootstrap_median_delta(cur, base, paired=False, resamples=200, pools=((10**8, 1.2), (10**8, 0.5)))
    assert r["delta"] == pytest.approx(0.7) and r["ci_low"] < 0.7 < r["ci_high"]
    assert r["ci_high"] - r["ci_low"] < 0.01  # the subsample's spread, moved, not widened


def test_the_ratio_bootstrap_sees_goodput_rise_and_not_when_the_sides_are_alike():
    from servescope.judgements.stats import bootstrap_ratio_delta

    # 3 users; 40 requests of 0.2 s each: all good (15 good/s) against 3 in 4 good (11.25 good/s).
    better = ([1.0] * 40, [0.2] * 40, 3.0)
    worse = ([1.0, 1.0, 1.0, 0.0] * 10, [0.2] * 40, 3.0)
    d = bootstrap_ratio_delta(better, worse)
    assert d["current"] == pytest.approx(15.0) and d["baseline"] == pytest.approx(11.25)
    assert d["delta"] == pytest.approx(3.75) and 0 < d["ci_low"] <= d["delta"] <= d["ci_high"]
    same = bootstrap_ratio_delta(worse, ([0.0, 1.0, 1.0, 1.0] * 10, [0.2] * 40, 3.0))
    assert same["delta"] == pytest.approx(0) and same["ci_low"] < 0 < same["ci_high"]
    assert bootstrap_ratio_delta(([], [], 1.0), worse)["delta"] is None


def test_the_median_ci_of_one_value_is_that_value_without_drawing(monkeypatch):
    # A run of one repetition (every short run's table row): each resample would be the value itself.
    monkeypatch.setattr(stats.np.random, "default_rng", lambda *a, **k: pytest.fail("drew resamples of one value"))
    assert stats.bootstrap_median_ci([0.25]) == (0.25, 0.25, 0.25)
    assert stats.bootstrap_median_ci([None, 0.25, float("nan")]) == (0.25, 0.25, 0.25)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.floats(allow_nan=True, allow_infinity=True, width=64).filter(lambda v: v != 0.0),  # no signed zeros
            st.integers(-(10**6), 10**6),
            st.none(),
            st.sampled_from([0.25, 0.5, 3.0]),  # ties
        ),
        max_size=stats.SORTED_IN_PYTHON,
    )
)
def test_a_short_lists_median_sorted_in_python_is_the_arrays(values):
    """A list up to SORTED_IN_PYTHON long is sorted as Python floats; an array is partitioned by numpy: the same ranks
    (None read as NaN, NaN last, as numpy puts it), so the same median, to the bit."""
    by_list, by_array = stats.median(values), stats.median(np.asarray(values, dtype=float))
    if by_array is None or np.isnan(by_array):
        assert by_list is by_array or np.isnan(by_list)
    else:
        assert by_list == by_array and np.float64(by_list).tobytes() == np.float64(by_array).tobytes()


def test_a_long_list_and_a_tuple_take_the_same_median():
    long = [float(v % 997) for v in range(stats.SORTED_IN_PYTHON * 3 + 1)]
    assert stats.median(long) == stats.median(tuple(long)) == stats.median(np.asarray(long)) == np.median(long) == 384.0
    assert stats.median([]) is None and stats.median(()) is None and stats.median([2, 1]) == 1.5
