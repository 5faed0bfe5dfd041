"""The report's figures as drawn (servescope/report/plots.py): token counts are whole numbers on every axis, and a
distribution with one value is drawn as that value."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.report import plots


def _ticks(ax, axis: str) -> list[str]:
    """The tick labels a reader sees: drawn, inside the axis' limits."""
    ax.figure.canvas.draw()
    labels = ax.get_xticklabels() if axis == "x" else ax.get_yticklabels()
    low, high = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    seen = [t for t in labels if t.get_text() and low <= (t.get_position()[0 if axis == "x" else 1]) <= high]
    return [t.get_text().replace("\u2212", "-") for t in seen]


def test_one_output_length_is_one_bar_at_that_length():
    """Issue 40: every request gave 128 tokens; drawn as one bin from 128.0 to 129.0 with ticks 128.2, 128.4 ..."""
    fig = plots.output_tokens_figure({"vLLM-CPU": ([128], [25])})
    (ax,) = fig.axes
    assert _ticks(ax, "x") == ["128"]
    (bar,) = ax.patches
    assert bar.get_height() == 25 and bar.get_width() < 1
    assert bar.get_x() < ax.get_xticks()[0] < bar.get_x() + bar.get_width()  # the bar stands on its tick
    assert "gave 128 tokens" in ax.get_title()
    assert all(float(t).is_integer() for t in _ticks(ax, "y"))
    plots.plt.close(fig)


def test_two_engines_of_one_length_each_get_a_bar_at_it():
    fig = plots.output_tokens_figure({"vLLM-CPU": ([128], [20]), "llama.cpp server": ([120, 128], [2, 25])})
    (ax,) = fig.axes
    assert _ticks(ax, "x") == ["120", "128"] and len(ax.patches) == 3
    plots.plt.close(fig)


@settings(derandomize=True, max_examples=15, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=4096), min_size=1, max_size=200, unique=True),
    st.integers(min_value=1, max_value=50),
)
def test_output_length_ticks_are_whole_tokens(lengths, count):
    lengths = sorted(lengths)
    fig = plots.output_tokens_figure({"engine": (lengths, [count] * len(lengths))})
    (ax,) = fig.axes
    xs = _ticks(ax, "x")
    assert xs and all(float(t).is_integer() for t in xs), xs
    if len(lengths) <= plots.DISCRETE_LENGTHS:
        assert xs == [str(v) for v in lengths]
    else:  # whole-token bins: every edge halfway between two counts
        assert all((p.get_x() + 0.5).is_integer() for p in ax.patches if p.get_height())
    plots.plt.close(fig)


@pytest.mark.parametrize("lengths", [[1], [1, 2], list(range(1, 200))])
def test_the_figure_is_written(tmp_path, lengths):
    path = plots.output_tokens({"e": (lengths, [1] * len(lengths))}, tmp_path / "output_tokens.png")
    assert path.stat().st_size > 1000


def test_a_knees_levels_are_whole_users_and_throughput_starts_at_zero():
    """quick on llama.cpp measured 1 and 2 users: ticks 1 and 2 (not 1.2, 1.4 ...), and 50.7 -> 49.1 tokens/s drawn
    from 0 (a 3% change, not a fall down the whole plot)."""
    line = {"label": "llama.cpp server (knee)", "concurrency": [1, 2], "tokens_per_s": [50.7, 49.1]}
    line |= {"e2e_p50": [2.4, 5.0], "e2e_p95": [2.9, 5.7], "knee": 1}
    fig = plots.sweeps_figure({"lines": [line]})
    for ax in fig.axes:
        assert _ticks(ax, "x") == ["1", "2"] and ax.get_ylim()[0] == 0
    assert any("saturation knee" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    plots.plt.close(fig)


def test_running_and_waiting_are_counted_in_whole_requests():
    trace = {"bands": [("knee-c1-1", 0.0, 10.0)]}
    trace |= {g: ([0.0, 5.0, 10.0], [0.0, 1.0, 0.0]) for g in plots.series.LEVER_GAUGES}
    fig = plots.gauges_figure({"panels": [("llama.cpp server", trace)]})
    requests_axis = fig.axes[0]
    assert all(float(t).is_integer() for t in _ticks(requests_axis, "y")), _ticks(requests_axis, "y")
    plots.plt.close(fig)
