"""servescope/judgements/slo.py: the SLO spec, per-request goodness, attainment, goodput and the per-phase verdict."""

from __future__ import annotations

import pytest

from servescope.contracts import thresholds
from servescope.contracts.runfolder import RequestRecord
from servescope.contracts.settings import SloKnobs
from servescope.judgements import slo


def rec(ttft=0.1, e2e=1.0, itl=(0.02, 0.02, 0.02), tokens=4, ok=True, started=100.0, scheduled=None) -> RequestRecord:
    return RequestRecord(
        engine="vllm",
        instance="vllm",
        scenario="knee",
        phase="p",
        api="openai",
        model="m",
        prompt_set="s",
        prompt_set_sha256="x",
        prompt_id="0",
        max_tokens=tokens,
        started_at=started,
        ok=ok,
        status=200 if ok else 0,
        ttft_s=ttft if ok else None,
        e2e_s=e2e if ok else None,
        itl_s=list(itl) if ok else [],
        output_tokens=tokens if ok else None,
        scheduled_at=scheduled,
    )


def test_a_spec_parses_percentile_and_per_request_terms_with_units():
    spec = slo.parse("ttft_p95<=500ms, itl_p99<=0.1,e2e<=10")
    assert spec.terms == (slo.Term("ttft", 0.5, 95.0), slo.Term("itl", 0.1, 99.0), slo.Term("e2e", 10.0, None))
    assert spec.text == "ttft_p95<=0.5,itl_p99<=0.1,e2e<=10"
    assert slo.parse(spec.text) == spec  # the text round-trips (the manifest records it)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ttft_p95<0.5", "expected terms METRIC[_pQ]<=SECONDS"),
        ("latency<=1", "expected terms"),
        ("ttft<=0", "must be a number of seconds > 0"),
        ("ttft<=nan", "must be a number of seconds > 0"),
        ("ttft_p0<=1", "the percentile must be above 0"),
        ("ttft_p101<=1", "the percentile must be above 0"),
        ("ttft<=1,ttft<=2", "limited twice"),
        (" , ", "empty SLO spec"),
    ],
)
def test_a_bad_spec_is_one_line_saying_what_is_wrong(text, says):
    with pytest.raises(slo.SloError) as err:
        slo.parse(text)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_the_default_comes_from_the_threshold_table_and_the_knob_overrides_it(monkeypatch):
    monkeypatch.delenv("SLO", raising=False)
    monkeypatch.delenv("SLO_ATTAINMENT", raising=False)
    assert slo.resolve(knob=SloKnobs.from_env()).text == slo.parse(thresholds.SLO_DEFAULT).text
    assert slo.resolve(knob=SloKnobs.from_env()).objective == thresholds.SLO_ATTAINMENT
    monkeypatch.setenv("SLO", "e2e<=3")
    monkeypatch.setenv("SLO_ATTAINMENT", "0.5")
    knob = SloKnobs.from_env()  # the knobs as an entry reads them
    assert slo.resolve(knob=knob).text == "e2e<=3" and slo.resolve(knob=knob).objective == 0.5
    assert slo.resolve("ttft<=1", 0.9, knob).text == "ttft<=1"  # a flag beats the knob
    with pytest.raises(slo.SloError, match="SLO attainment"):
        slo.resolve("ttft<=1", "1.5")


def test_a_request_is_good_only_when_it_succeeded_and_meets_every_term_on_its_own():
    spec = slo.parse("ttft_p95<=0.5,itl_p95<=0.05,e2e<=2")
    assert spec.good(rec())
    assert not spec.good(rec(ttft=0.6))
    assert not spec.good(rec(e2e=2.5))
    assert not spec.good(rec(itl=[0.02] * 9 + [0.2]))  # its own p95 gap: 0.02 + 0.55 x 0.18 = 0.119
    assert spec.good(rec(itl=[0.02] * 99 + [0.2]))  # one stall in 100 gaps: its p95 gap stays 0.02
    assert not spec.good(rec(ok=False))
    assert spec.good(rec(itl=[], tokens=1))  # one token: no ITL to miss


def test_a_plain_itl_term_is_the_requests_longest_gap():
    spec = slo.parse("itl<=0.05")
    assert not spec.good(rec(itl=[0.02] * 99 + [0.2]))


def test_ttft_and_e2e_count_from_the_schedule_when_the_client_fell_behind():
    spec = slo.parse("ttft<=0.5")
    on_time = rec(ttft=0.1, started=100.0, scheduled=100.0)
    late = rec(ttft=0.1, started=102.0, scheduled=100.0)  # sent 2 s after its scheduled instant
    assert spec.good(on_time) and not spec.good(late)
    assert slo.schedule_lag(late) == pytest.approx(2.0) and slo.schedule_lag(rec()) == 0.0


def test_a_phase_meets_a_percentile_term_when_that_share_of_requests_meet_the_limit_failures_counting_as_misses():
    spec = slo.parse("ttft_p90<=0.5")
    records = [rec(ttft=0.1) for _ in range(9)] + [rec(ttft=0.9)]
    result = slo.evaluate(spec, records, wall_s=2.0)
    assert result.meets and result.attainment == pytest.approx(0.9)
    assert result.good == 9 and result.goodput_rps == pytest.approx(4.5) and result.good_tokens_per_s == 18
    (term,) = result.terms
    assert term.met_share == pytest.approx(0.9) and term.observed == pytest.approx(0.1 + 0.1 * 0.8)  # type 7: rank 8.1
    failing = records[:8] + [rec(ok=False), rec(ttft=0.9)]  # 8 of 10 meet it: below p90
    result = slo.evaluate(spec, failing, wall_s=2.0)
    assert not result.meets and result.misses == {"errors": 1, "ttft_p90<=0.5": 1}


def test_pooled_itl_counts_gaps_not_requests():
    spec = slo.parse("itl_p95<=0.05")
    # 2 requests of 10 gaps each, 1 slow gap in all: 95% of 20 gaps meet the limit.
    records = [rec(itl=[0.01] * 10), rec(itl=[0.01] * 9 + [0.3])]
    assert slo.evaluate(spec, records, 1.0).meets
    records.append(rec(itl=[0.01] * 9 + [0.3]))  # 2 slow of 30: 93% meet it
    assert not slo.evaluate(spec, records, 1.0).meets


def test_per_request_terms_need_the_objective_share_and_the_most_missed_term_is_named():
    spec = slo.parse("ttft<=0.5,e2e<=2", objective=0.75)
    records = [rec(), rec(), rec(ttft=0.9), rec(e2e=3.0, ttft=0.9)]
    result = slo.evaluate(spec, records, 4.0)
    assert result.attainment == 0.5 and not result.meets
    assert result.failed_most == "ttft<=0.5" and result.misses == {"ttft<=0.5": 2, "e2e<=2": 1}
    assert slo.evaluate(spec, [rec(), rec(), rec(), rec(ttft=0.9)], 4.0).meets


def test_an_empty_phase_meets_nothing():
    result = slo.evaluate(slo.parse("ttft<=1"), [], 0.0)
    assert not result.meets and result.attainment is None and result.goodput_rps is None


def test_a_verdict_more_requests_could_not_flip_is_settled():
    spec = slo.parse("ttft<=2,tpot<=0.2", 0.9)
    low, high = slo.attainment_interval(6, 6)
    assert 0.6 < low < 0.62 and high == pytest.approx(1.0)  # 6 of 6: still compatible with 90%, not settled
    result = slo.evaluate(spec, [rec(ttft=0.1, e2e=0.5) for _ in range(6)], 10.0)
    assert result.meets and not slo.settled(spec, result)
    assert slo.settled(spec, slo.evaluate(spec, [rec(ttft=0.1, e2e=0.5) for _ in range(40)], 10.0))  # 40 of 40
    failing = [rec(ttft=0.1, e2e=0.5)] * 3 + [rec(ttft=3.0, e2e=3.5)] * 6  # 3 of 9: far below 90%
    assert slo.settled(spec, slo.evaluate(spec, failing, 10.0))
    # A percentile term's verdict is never "settled" here: it has no such interval.
    assert not slo.settled(slo.parse("ttft_p95<=2", 0.9), slo.evaluate(slo.parse("ttft_p95<=2", 0.9), failing, 10.0))
