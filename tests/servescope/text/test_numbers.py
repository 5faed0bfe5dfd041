"""servescope/text/numbers.py: each form's text, its missing value, NaN and inf, rounding edges, and that each function
writes what the helper it replaced wrote (the originals are kept below, verbatim, as the reference)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.text import numbers

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (numbers.percent(0.125), "12.5%"),
        (numbers.percent(0.125, 0), "12%"),  # an exact half: to even
        (numbers.percent(0.135, 0), "14%"),
        (numbers.percent(None), "n/a"),
        (numbers.percent(None, 0, "-"), "-"),
        (numbers.percent(NAN), "nan%"),
        (numbers.percent(INF, 0), "inf%"),
        (numbers.percent_figure(12.5), "12.5%"),
        (numbers.percent_figure(None, 1, "-"), "-"),
        (numbers.percent_significant(0.125), "12.5%"),
        (numbers.percent_significant(0.5), "50%"),
        (numbers.percent_range(0.88, 0.97), "88-97%"),
        (numbers.percentage_points(0.021), "2.1 pp"),
        (numbers.percentage_points(0.021, signed=True), "+2.1 pp"),
        (numbers.percentage_points(-0.021, signed=True), "-2.1 pp"),
        (numbers.cores(0.61), "61% of a core"),
        (numbers.cores(0.994), "99% of a core"),
        (numbers.cores(0.995), "1.0 cores"),  # 99.5% would round up to "100% of a core": a whole core instead
        (numbers.cores(1.44), "1.4 cores"),
        (numbers.seconds(0.25), "0.250s"),
        (numbers.seconds(12.3456, 1), "12.3s"),
        (numbers.seconds(None), "n/a"),
        (numbers.milliseconds(0.0123), "12.3"),
        (numbers.milliseconds(0.0123, unit=" ms"), "12.3 ms"),
        (numbers.milliseconds(None, missing="-", unit=" ms"), "-"),
        (numbers.duration(0.25), "250 ms"),
        (numbers.duration(1.5), "1.5 s"),
        (numbers.duration(0.9999), "1e+03 ms"),  # just under a second: ms, as the SLO's words always said it
        (numbers.duration(-2), "-2e+03 ms"),
        (numbers.duration(-2, by_magnitude=True), "-2 s"),
        (numbers.duration_fixed(0.25), "250.0 ms"),
        (numbers.duration_fixed(1.5, signed=True), "+1.500 s"),
        (numbers.duration_fixed(-0.25, signed=True), "-250.0 ms"),
        (numbers.elapsed(95.9), "95s"),  # fractions dropped, not rounded
        (numbers.elapsed(119.9), "119s"),
        (numbers.elapsed(120), "2m00s"),
        (numbers.elapsed(3725), "62m05s"),
        (numbers.minutes(35.4), "35 s"),
        (numbers.minutes(59.5), "1 min 0 s"),  # rounded (to even) first
        (numbers.minutes(95), "1 min 35 s"),
        (numbers.number(48.0), "48"),
        (numbers.number(0.5), "0.5"),
        (numbers.number(4, "-", unit=" u"), "4 u"),
        (numbers.number(None, "-", unit=" u"), "-"),
        (numbers.number(None), "n/a"),
        (numbers.fixed(1.234), "1.23"),
        (numbers.fixed(2.675), "2.67"),  # 2.675 is 2.67499... in binary
        (numbers.fixed(1.5, 0), "2"),
        (numbers.fixed(2.5, 0), "2"),
        (numbers.fixed(0.1234, 3), "0.123"),
        (numbers.fixed(1.234, signed=True), "+1.23"),
        (numbers.fixed(None), "n/a"),
        (numbers.fixed(None, 4, "not measured"), "not measured"),
        (numbers.fixed(NAN), "nan"),
        (numbers.fixed(NAN, missing_when="None or NaN"), "n/a"),
        (numbers.fixed(INF, missing_when="None or NaN"), "inf"),
        (numbers.fixed(INF, missing_when="None or not finite"), "n/a"),
        (numbers.fixed(-INF, missing_when="None or not finite"), "n/a"),
        (numbers.fixed("0.5", missing_when="not a number"), "n/a"),
        (numbers.fixed(None, missing_when="not a number"), "n/a"),
        (numbers.fixed(3, missing_when="not a number"), "3.00"),
        (numbers.fixed(NAN, missing_when="not a number"), "nan"),
        (numbers.trimmed(0.256), "0.26"),
        (numbers.trimmed(3.0), "3"),
        (numbers.trimmed(4), "4"),
        (numbers.trimmed(1234.5, 1), "1234.5"),
        (numbers.trimmed(None), "n/a"),
        (numbers.trimmed(NAN), "n/a"),
        (numbers.trimmed(INF), "n/a"),
        (numbers.significant(1234.5), "1.23e+03"),
        (numbers.significant(0.01234), "0.0123"),
        (numbers.significant(None, 3, "not priced"), "not priced"),
        (numbers.integer(3), "3"),
        (numbers.integer(None, ">8"), ">8"),
        (numbers.rate(2.345), "2.3"),
        (numbers.rate(9.99), "10"),
        (numbers.rate(12.6), "13"),
        (numbers.grouped(12345), "12,345"),
        (numbers.grouped(999.9), "1e+03"),
        (numbers.grouped(0.1234), "0.123"),
        (numbers.grouped(-2500), "-2,500"),
        (numbers.binary_size(512), "512 B"),
        (numbers.binary_size(1536), "1.5 KiB"),
        (numbers.binary_size(3 * 2**30), "3.0 GiB"),
        (numbers.file_size(2.5 * 2**30), "2.50 GB"),
        (numbers.file_size(2**30 - 1), "1024 MB"),
        (numbers.file_size(5 * 2**20), "5 MB"),
        (numbers.sql_double(0.1), "0.1::DOUBLE"),
        (numbers.sql_double(3), "3.0::DOUBLE"),
    ],
)
def test_each_form_reads_as_written(text, expected):
    assert text == expected


def test_an_integer_is_refused_a_fraction():
    with pytest.raises(ValueError):
        numbers.integer(2.0)


def test_an_unknown_missing_rule_is_refused():
    with pytest.raises(ValueError, match="missing_when"):
        numbers.fixed(1.0, missing_when="never")


def test_a_clock_refuses_nan_and_inf_as_the_helpers_it_replaced_did():
    for form in (numbers.elapsed, numbers.minutes):
        for value in (NAN, INF):
            with pytest.raises((ValueError, OverflowError)):
                form(value)


# ---------------------------------------------------------------- the helpers each function replaced, verbatim

ORIGINALS = {  # (the new call, the helper it replaced): servescope/report, loadgen, stack, dashboards, bench
    "sections._s": (lambda v: numbers.seconds(v), lambda v: "n/a" if v is None else f"{v:.{3}f}s"),
    "sections._s(v, 1)": (lambda v: numbers.seconds(v, 1), lambda v: "n/a" if v is None else f"{v:.{1}f}s"),
    "goodput._s": (lambda v: numbers.seconds(v), lambda v: "n/a" if v is None else f"{v:.3f}s"),
    "sections._ms": (lambda v: numbers.milliseconds(v), lambda v: "n/a" if v is None else f"{v * 1000:.1f}"),
    "workloads._ms": (lambda v: numbers.milliseconds(v), lambda v: "n/a" if v is None else f"{v * 1000:.1f}"),
    "plan_check._ms": (
        lambda v: numbers.milliseconds(v, missing="-", unit=" ms"),
        lambda v: "-" if v is None else f"{v * 1000:.1f} ms",
    ),
    "sections._pct": (lambda v: numbers.percent(v), lambda v: "n/a" if v is None else f"{v:.1%}"),
    "goodput._pct": (lambda v: numbers.percent(v), lambda v: "n/a" if v is None else f"{v:.1%}"),
    "workloads._pct": (lambda v: numbers.percent(v, 0), lambda v: "n/a" if v is None else f"{v:.0%}"),
    "knee._pct": (lambda v: numbers.percent(v, 0, "-"), lambda v: "-" if v is None else f"{v:.0%}"),
    "quick_words._pct": (lambda v: numbers.percent(v, 0, "-"), lambda v: "-" if v is None else f"{v:.0%}"),
    "plan._num {:.0%}": (
        lambda v: numbers.percent(v, 0, "-"),
        lambda v: "-" if v is None else "{:.0%}".format(v),  # noqa: UP032 (plan._num's form.format, verbatim)
    ),
    "plan_check._pct": (lambda v: numbers.percent(v, 1, "-"), lambda v: "-" if v is None else f"{v:.1%}"),
    "plan_check._pct_num": (lambda v: numbers.percent_figure(v, 1, "-"), lambda v: "-" if v is None else f"{v:.1f}%"),
    "sections._num": (lambda v: numbers.number(v), lambda v: "n/a" if v is None else f"{v:g}"),
    "verdict._num": (lambda v: numbers.number(v), lambda v: "n/a" if v is None else f"{v:g}"),
    "plan._num {:g} u": (
        lambda v: numbers.number(v, "-", unit=" u"),
        lambda v: "-" if v is None else "{:g} u".format(v),  # noqa: UP032 (plan._num's form.format, verbatim)
    ),
    "verdict._num3": (lambda v: numbers.fixed(v, 3), lambda v: "n/a" if v is None else f"{v:.3f}"),
    "workloads._num": (lambda v: numbers.fixed(v, 0), lambda v: "n/a" if v is None else f"{v:.{0}f}"),
    "knee._num": (lambda v: numbers.fixed(v, 2, "-"), lambda v: "-" if v is None else f"{v:.2f}"),
    "goodput._rate": (lambda v: numbers.fixed(v), lambda v: "n/a" if v is None else f"{v:.2f}"),
    "fleet_scale.shown": (
        lambda v: numbers.fixed(v, 4, "not measured"),
        lambda v: "not measured" if v is None else f"{v:.{4}f}",
    ),
    "tune._n": (
        lambda v: numbers.fixed(v, missing_when="None or NaN"),
        lambda v: "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}",
    ),
    "sections._cores": (
        lambda v: numbers.fixed(v, missing_when="not a number"),
        lambda v: f"{v:.2f}" if isinstance(v, (int, float)) else "n/a",
    ),
    "tuning._num": (
        lambda v: numbers.trimmed(v),
        lambda v: (
            "n/a"
            if v is None or (isinstance(v, float) and not math.isfinite(v))
            else (f"{v:.{2}f}" if isinstance(v, float) and v != int(v) else f"{v:g}")
        ),
    ),
    "energy.joules": (
        lambda v: numbers.significant(v, 3, "not measured"),
        lambda v: "not measured" if v is None else f"{v:.3g}",
    ),
    "plan._num {:.3g}": (
        lambda v: numbers.significant(v, 3, "-"),
        lambda v: "-" if v is None else "{:.3g}".format(v),  # noqa: UP032 (plan._num's form.format, verbatim)
    ),
    "hostnoise.share": (
        lambda v: numbers.cores(v),
        lambda v: f"{v:.0%} of a core" if v < 0.995 else f"{v:.1f} cores",
    ),
    "quick_words._s": (
        lambda v: numbers.duration(v),
        lambda v: f"{v * 1000:.3g} ms" if v < 1 else f"{v:.3g} s",
    ),
    "quick_words._rate": (lambda v: numbers.rate(v), lambda v: f"{v:.2g}" if v < 10 else f"{v:.0f}"),
    "render.fmt s": (
        lambda v: numbers.duration(v, by_magnitude=True),
        lambda v: f"{v * 1000:.3g} ms" if abs(v) < 1 else f"{v:.3g} s",
    ),
    "render.fmt percentunit": (lambda v: numbers.percent_significant(v), lambda v: f"{v * 100:.3g}%"),
    "render.fmt reqps": (lambda v: f"{numbers.significant(v)} req/s", lambda v: f"{v:.3g} req/s"),
    "render.number": (
        lambda v: numbers.grouped(v),
        lambda v: f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}",
    ),
    "check.value_text s": (
        lambda v: numbers.duration_fixed(v, True),
        lambda v: f"{v * 1000:{'+'}.1f} ms" if abs(v) < 1 else f"{v:{'+'}.3f} s",
    ),
    "check.value_text s unsigned": (
        lambda v: numbers.duration_fixed(v),
        lambda v: f"{v * 1000:{''}.1f} ms" if abs(v) < 1 else f"{v:{''}.3f} s",
    ),
    "check.value_text share signed": (
        lambda v: numbers.percentage_points(v, signed=True),
        lambda v: f"{v * 100:+.1f} pp",
    ),
    "check.value_text other": (lambda v: numbers.fixed(v, 3, signed=True), lambda v: f"{v:+.3f}"),
    "table.ci_text": (lambda v: numbers.fixed(v), lambda v: f"{v:.2f}"),
    "plan.band": (lambda v: numbers.percent_range(v, v / 2), lambda v: f"{v * 100:.0f}-{v / 2:.0%}"),
    "runreader._num": (lambda v: numbers.sql_double(v), lambda v: f"{float(v)!r}::DOUBLE"),
}


def _binary_size(value: float) -> str:  # dashboards/render.py's "bytes" branch, verbatim
    for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {name}"
    return f"{value:.0f} B"


ORIGINALS["render.fmt bytes"] = (numbers.binary_size, _binary_size)
ORIGINALS["report_scale._size"] = (
    numbers.file_size,
    lambda v: f"{v / 2**30:.2f} GB" if v >= 2**30 else f"{v / 2**20:.0f} MB",
)
TAKES_NONE = {  # the helpers that said "missing" for None (the others were never handed one)
    name
    for name in ORIGINALS
    if not name.startswith(
        ("hostnoise", "quick_words", "render", "check", "table", "plan.band", "runreader", "report_scale")
    )
}
CLOCKS = {  # the two that raised on NaN and inf: compared on finite values only
    "progress.elapsed": (
        numbers.elapsed,
        lambda v: f"{int(v)}s" if int(v) < 120 else f"{int(v) // 60}m{int(v) % 60:02d}s",
    ),
    "quick_words._minutes": (
        numbers.minutes,
        lambda v: f"{int(round(v)) // 60} min {int(round(v)) % 60} s" if int(round(v)) >= 60 else f"{int(round(v))} s",
    ),
}

ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [0.0, -0.0, 0.995, 1.0, 10.0, 999.5, 1e3, 2.0**30]
)


@settings(derandomize=True, max_examples=200)
@given(value=ANY_FLOAT)
def test_every_form_writes_a_str_for_any_float_and_what_its_original_wrote(value):
    for name, (new, original) in ORIGINALS.items():
        text = new(value)
        assert isinstance(text, str), name
        assert text == original(value), name


@settings(derandomize=True, max_examples=200)
@given(value=st.one_of(st.none(), st.integers(-(10**6), 10**6), ANY_FLOAT, st.text(max_size=3), st.booleans()))
def test_the_missing_value_reads_as_before(value):
    for name in TAKES_NONE:
        new, original = ORIGINALS[name]
        if value is None or not isinstance(value, (int, float)):
            if name == "sections._cores" or value is None:
                assert new(value) == original(value), name
        else:
            assert new(value) == original(value), name


@settings(derandomize=True, max_examples=200)
@given(value=st.floats(min_value=-1e6, max_value=1e9, allow_nan=False, allow_infinity=False))
def test_the_clocks_write_what_their_originals_wrote_on_finite_seconds(value):
    for name, (new, original) in CLOCKS.items():
        assert new(value) == original(value), name


@settings(derandomize=True, max_examples=200)
@given(value=st.one_of(st.none(), st.integers(), st.booleans()))
def test_a_whole_count_writes_what_the_plan_wrote(value):
    expected = "-" if value is None else "{:d}".format(value)  # noqa: UP032 (plan._num's form.format, verbatim)
    assert numbers.integer(value, "-") == expected
