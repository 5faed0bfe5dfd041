"""Property-based tests of the plan's boundaries (issue 42): the replica model on any profile and traffic, the windows
judged from columns as slo.evaluate judges records, and knee.json, traces and the plan's knobs as anyone may write them.

Fixed seed (derandomize) and modest example counts: the same inputs every run, a few seconds each.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servescope.contracts.runfolder import KNEE
from servescope.judgements import slo
from servescope.report import plan, replica_events, replicas
from servescope.report.replicas import Arrival, Level, Profile, Sharing
from tests.servescope.report.plan_knees import knee_folder

pytestmark = pytest.mark.timeout(300)

FUZZ = settings(
    derandomize=True,
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

seconds = st.floats(0, 5, allow_nan=False) | st.sampled_from([0.0, 1e-12, 0.02, 0.07])


@st.composite
def profiles(draw, name: str = "p") -> Profile:
    """A replica as any knee could have measured it: 1-5 levels, values of 0 to seconds, some levels failing,
    gaps' shapes or none."""
    loads = sorted(set(draw(st.lists(st.floats(0.3, 64, allow_nan=False), min_size=1, max_size=5))))
    levels = []
    for c in loads:
        ttft = np.sort(np.array(draw(st.lists(seconds, max_size=6)), np.float64))
        tpot = np.sort(np.array(draw(st.lists(seconds, max_size=6)), np.float64))
        shape = np.sort(np.array(draw(st.lists(st.floats(0, 30, allow_nan=False), max_size=8)), np.float64))
        failed = draw(st.sampled_from([0.0, 0.0, 0.1, 1.0]))
        levels.append(Level(c, ttft, tpot, failed, 10, None, shape))
    slots = draw(st.sampled_from([None, 1, 2, 8]))
    return Profile(name, "vllm", tuple(levels), None, slots, draw(st.integers(1, 300)), None)


@st.composite
def arrival_lists(draw) -> list[Arrival]:
    """Arrivals of any spacing, late in a long trace too (1e5-6e5 s, where a clock absorbs small steps)."""
    start = draw(st.sampled_from([0.0, 1e5, 6e5]))
    gaps = draw(st.lists(st.floats(0, 3, allow_nan=False) | st.just(0.0), max_size=60))
    at = start + np.cumsum(gaps) if gaps else np.zeros(0)
    return [Arrival(float(t), draw(st.sampled_from([None, 1, 2, 200]))) for t in at]


@FUZZ
@given(
    profile=profiles(),
    arrivals=arrival_lists(),
    n=st.integers(1, 5),
    policy=st.sampled_from(replicas.POLICIES),
    busy=st.none() | st.tuples(st.integers(1, 3), profiles("busy")),
    seed=st.integers(0, 3),
)
def test_the_model_always_ends_with_an_outcome_for_every_arrival(profile, arrivals, n, policy, busy, seed):
    sharing = Sharing(busy[0], busy[1]) if busy else None
    out = replicas.run(replicas.Schedule.of(arrivals), profile, n, policy, seed, sharing)
    assert len(out) == len(arrivals)
    assert np.all((out.replica >= 0) & (out.replica < n))
    ok = out.ok
    assert np.all(out.ttft_s[ok] >= 0) and np.all(out.e2e_s[ok] >= out.ttft_s[ok] - 1e-9)
    assert np.all(np.isnan(out.ttft_s[~ok])) and np.all(np.isnan(out.e2e_s[~ok]))
    # The same source run as Python gives the same outcomes (numba compiles it; nothing of its own)
    if len(arrivals) <= 20:
        own = replicas._pack(profile)
        other = replicas._pack(sharing.busy) if sharing else own
        schedule = replicas.Schedule.of(arrivals)
        tokens = np.where(schedule.output_tokens > 0, schedule.output_tokens, profile.output_tokens)
        py = replica_events._run(
            schedule.at, tokens, replicas.draws(seed, len(arrivals)), n, policy == replicas.ROUND_ROBIN, seed,
            -1 if profile.slots is None else profile.slots, sharing.per_host if sharing else 1, sharing is not None,
            *own, *other,
        )  # fmt: skip
        np.testing.assert_array_equal(out.replica, py[0])
        np.testing.assert_array_equal(out.e2e_s, py[2])


terms = st.sampled_from(
    ["ttft<=0.5", "ttft_p90<=0.3", "e2e<=2", "e2e_p50<=1", "tpot<=0.05", "tpot_p95<=0.03"]
    + ["itl<=0.1", "itl_p95<=0.04", "itl_p50<=0.02", "itl_p99<=0.5", "itl_p100<=0.06"]
)


@FUZZ
@given(
    profile=profiles(),
    arrivals=arrival_lists(),
    n=st.integers(1, 3),
    spec_terms=st.lists(terms, min_size=1, max_size=3, unique_by=lambda t: t.split("<=")[0]),
    objective=st.sampled_from([0.5, 0.9, 1.0]),
)
def test_windows_judged_from_columns_agree_with_slo_evaluate_on_the_records(
    profile, arrivals, n, spec_terms, objective
):
    # The plan counts millions of outcomes without making records; made, slo.evaluate (the knee's rule) must agree.
    spec = slo.parse(",".join(spec_terms), objective)
    out = replicas.run(replicas.Schedule.of(arrivals), profile, n)
    shapes = replicas.shapes(profile)
    made = plan.records(profile, out, shapes)
    windows = 3
    window = np.minimum((out.at / 7.0).astype(np.int64) % windows, windows - 1)
    tally = plan._Tally(spec, windows)
    tally.add(out, window, shapes)
    for w in range(windows):
        mine = [r for r, x in zip(made, window, strict=True) if x == w]
        expected = slo.evaluate(spec, mine, 7.0)
        assert int(tally.requests[w]) == expected.requests
        assert int(tally.good[w]) == expected.good
        if mine:
            assert tally.holds(w) == expected.meets


# ---------------------------------------------------------------- what users write: knee.json, traces, knobs

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _paths(value, prefix=()):
    """Every place in a JSON value: (path, value) pairs."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


@pytest.fixture(scope="module")
def knee_dir():
    with tempfile.TemporaryDirectory() as d:
        folder = knee_folder(Path(d))
        yield folder, (folder / KNEE).read_text()


def one_line_or_ok(capsys, argv: list[str]) -> None:
    code = plan.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code in (0, 2), err
    if code == 2:
        assert len(err) == 1 and err[0].startswith("plan: "), err


@FUZZ
@given(data=st.data(), how=st.sampled_from(["set", "delete", "deep"]))
def test_any_mutation_of_knee_json_plans_or_says_why_in_one_line(knee_dir, capsys, data, how):
    # Regression: 244 of 1,000 such mutations crashed it.
    folder, original = knee_dir
    summary = json.loads(original)
    places = [p for p in _paths(summary) if p]
    path = data.draw(st.sampled_from(places))
    parent = summary
    for key in path[:-1]:
        parent = parent[key]
    if how == "delete":
        del parent[path[-1]]
    else:
        parent[path[-1]] = "[" * 5000 if how == "deep" else data.draw(json_values)
    text = json.dumps(summary) if how != "deep" else json.dumps(summary).replace('"' + "[" * 5000 + '"', "[" * 5000)
    (folder / KNEE).write_text(text)
    try:
        one_line_or_ok(capsys, [str(folder), "--rate", "1", "--duration", "30", "--out", str(folder.parent / "o")])
    finally:
        (folder / KNEE).write_text(original)


trace_rows = st.fixed_dictionaries(
    {},
    optional={
        "offset_s": st.floats(allow_nan=True, allow_infinity=True)
        | st.sampled_from([1e5, 6e5, 0.0])
        | st.text(max_size=3),
        "input_tokens": st.integers(-5, 10**7) | st.none(),
        "output_tokens": st.integers(-5, 10**7) | st.sampled_from([1, 40]),
        "conversation_id": st.text(max_size=3) | st.integers(),
        "timestamp": st.floats(0, 1e12),
    },
)


@FUZZ
@given(rows=st.lists(trace_rows, max_size=8), speed=st.sampled_from(["1", "1e-9", "1e9", "0.001"]))
def test_any_trace_plans_or_says_why_in_one_line(tmp_path_factory, capsys, knee_dir, rows, speed):
    folder, _ = knee_dir
    trace = tmp_path_factory.mktemp("trace") / "t.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    one_line_or_ok(capsys, [str(folder), "--trace", str(trace), "--speed", speed, "--out", str(trace.parent / "o")])


knob_values = st.sampled_from(["", "0", "-1", "1", "3", "1e-300", "1e300", "nan", "inf", "abc", "100000", "0.5"])


@FUZZ
@given(
    knobs=st.dictionaries(
        st.sampled_from(["PLAN_WINDOW_S", "PLAN_REPEATS", "PLAN_MAX_REPLICAS", "PLAN_SPEED", "PLAN_SLOWER"])
        | st.just("PLAN_ROUTING"),
        knob_values | st.sampled_from(["least_conn", "round_robin"]),
        max_size=4,
    )
)
def test_any_plan_knob_plans_or_says_why_in_one_line(knee_dir, capsys, monkeypatch, knobs):
    folder, _ = knee_dir
    with monkeypatch.context() as m:
        for key, value in knobs.items():
            m.setenv(key, value)
        one_line_or_ok(capsys, [str(folder), "--trace", "trace-small", "--out", str(folder.parent / "o")])


def test_the_knee_json_strategy_reaches_the_fields_the_plan_reads():
    # A fuzz that never touched `level`, `knee` or `over` could not fail on them.
    summary = json.loads((knee_folder(Path(tempfile.mkdtemp())) / KNEE).read_text())
    reached = {p[-1] for p in _paths(summary) if p}
    assert {"over", "knee", "level", "phase", "trusted", "probes", "spec", "objective"} <= reached
    assert math.isfinite(plan.MAX_WINDOWS)
