"""Report section 9: goodput per engine and phase under the run's own SLOs (or the ones asked for), and the knee's summary."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servescope.contracts import thresholds
from servescope.contracts.runfolder import PhaseRecord, RunFolder
from servescope.judgements import slo
from servescope.report import goodput, run_slo
from servescope.report.load import Run, load
from tests.servescope.judgements.test_slo import rec


def run_with(flags, records=(), counted: bool = False) -> Run:
    """A run folder holding one phase of these records under this manifest's flags, read as the report reads one;
    counted: with the manifest SLO's gap limits counted while it is read (as `python -m servescope.report` does)."""
    folder = RunFolder.create(Path(tempfile.mkdtemp()), "r")
    folder.append_phase(PhaseRecord("vllm", "vllm", "knee", "p", 100.0, 104.0, len(records), 2, "s", "x", 4))
    for r in records:
        folder.append_request(r)
    folder.write_manifest({"run_id": "r", "flags": flags, "engines": {"vllm": {"kind": "vllm"}}})
    limits_of = (lambda manifest: run_slo.gap_limits(run_slo.spec_of_manifest(manifest))) if counted else None
    run = load(folder.path, limits_of)
    shutil.rmtree(folder.path.parent)  # the engine holds what it read
    return run


@pytest.mark.parametrize(
    "flags", [None, [], "ttft<=1", {"slo": 5}, {"slo": "not a spec"}, {"slo": "", "slo_attainment": True}]
)
def test_a_manifest_without_a_usable_slo_gets_the_knobs_one_never_an_error(flags, monkeypatch):
    monkeypatch.delenv("SLO", raising=False)
    monkeypatch.delenv("SLO_ATTAINMENT", raising=False)
    assert goodput.spec_of(run_with(flags)).text == slo.parse(thresholds.SLO_DEFAULT).text


def test_the_runs_own_slo_unless_the_report_is_asked_for_another():
    run = run_with({"slo": "e2e<=3", "slo_attainment": 0.5})
    assert goodput.spec_of(run).text == "e2e<=3" and goodput.spec_of(run).objective == 0.5
    assert goodput.spec_of(run, "ttft<=1").text == "ttft<=1"
    with pytest.raises(slo.SloError):
        goodput.spec_of(run, "ttft<1")  # the user's own flag: said, not swallowed


def test_goodput_per_phase_is_the_slo_rule_over_the_phase_wall():
    records = [rec(ttft=0.1), rec(ttft=0.2), rec(ttft=0.9), rec(ok=False)]
    for r in records:
        r.phase = "p"
    run = run_with({"slo": "ttft<=0.5"}, records)
    (row,) = goodput.build(run, goodput.spec_of(run))
    assert row.result.good == 2 and row.result.attainment == 0.5
    assert row.result.goodput_rps == pytest.approx(0.5) and row.result.good_tokens_per_s == pytest.approx(2.0)
    assert row.result.failed_most in ("ttft<=0.5", "errors") and not row.result.meets


def test_a_manifest_time_past_year_9999_is_said_not_raised():
    """Found by the fuzzed run folders: a manifest started_at of 2.5e11 (year 10000) or 6.8e16 crashed the setup."""
    from servescope.report import sections

    assert sections._utc(253402300800.0) == "2.53402e+11 (not a date)"
    assert "not a date" in sections._utc(6.77680361916768e16)
    assert sections._utc(0.0) == "1970-01-01 00:00:00 UTC"


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.floats(0, 2),
            st.floats(0, 20),
            st.lists(st.floats(0, 0.3), max_size=6),
            st.integers(1, 40),
            st.none() | st.floats(-1, 1),
        ),
        max_size=25,
    ),
    st.sampled_from(["ttft_p95<=0.5,itl_p95<=0.1", "e2e<=10,itl<=0.2", "tpot_p50<=0.05,ttft<=1", "itl_p99<=100ms"]),
    st.booleans(),
)
def test_the_engine_judges_a_phase_as_servescope_slo_does(ok_ttft_e2e_itl_tokens_lag, text, counted):
    """The report asks the engine what servescope/judgements/slo.py computes from records: the same result, field by field,
    whether each request's gaps within a limit were counted as the run was read or are counted now."""
    records = []
    for ok, ttft, e2e, itl, tokens, lag in ok_ttft_e2e_itl_tokens_lag:
        r = rec(ttft=ttft, e2e=ttft + e2e, itl=itl, tokens=tokens, ok=ok, started=100.0)
        r.scheduled_at = None if lag is None else 100.0 - lag
        records.append(r)
    spec = slo.parse(text)
    run = run_with({"slo": text}, records, counted)
    assert run.db.limits == (run_slo.gap_limits(spec) if counted else ())
    assert goodput.evaluate(run, spec, "vllm", "p", 4.0) == slo.evaluate(spec, records, 4.0)


@pytest.mark.parametrize(
    "itl, text",
    [
        ([0.05, 0.1, 0.2], "itl_p50<=0.1"),  # the percentile falls on a gap equal to the limit: met
        ([0.05, 0.09, 0.2], "itl_p75<=0.1"),  # between a gap under the limit and one over it: interpolated, missed
        ([0.05, 0.09, 0.2], "itl_p25<=0.1"),  # between two gaps under it: met without interpolating
        ([0.05, 0.1], "itl_p100<=0.1"),  # the largest gap, at the limit
        ([0.05, 0.11], "itl_p100<=0.1"),
        ([0.2, 0.3, 0.4], "itl_p10<=0.1"),  # every gap over it
        ([], "itl_p95<=0.1"),  # no gap: nothing to miss
    ],
)
def test_an_itl_percentile_term_is_judged_at_the_limit_as_numpy_would(itl, text):
    """Each request's own ITL percentile against the limit, without sorting its gaps, at the edge cases (its gaps
    within the limit counted now, or as the run was read)."""
    records = [rec(ttft=0.1, e2e=1.0, itl=itl, tokens=4, ok=True, started=100.0)]
    spec = slo.parse(text)
    for counted in (False, True):
        got = goodput.evaluate(run_with({"slo": text}, records, counted), spec, "vllm", "p", 4.0)
        assert got == slo.evaluate(spec, records, 4.0)
