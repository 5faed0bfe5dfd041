"""The open-loop arrival schedules (servescope/judgements/arrivals.py) and the two users that must agree on them: a load phase and a plan."""

from __future__ import annotations

import math
from itertools import islice

import pytest

from loadgen.runplan import replay_phase
from loadgen.scenarios import RatePhase, Settings
from loadgen.targets import Target
from servescope.judgements import arrivals
from servescope.report import traffic
from servescope.workloads.prompts import load as load_prompts


def settings(prompt_set="seed3") -> Settings:
    target = Target("vllm", "vllm", "http://127.0.0.1:9", "openai", "/v1/chat/completions")
    return Settings(target, load_prompts(prompt_set), max_tokens=4, temperature=0.0, timeout_s=10.0)


def test_constant_gaps_put_the_nth_arrival_at_n_over_the_rate_however_long_the_run():
    offsets = list(islice(arrivals.Constant(3.0).offsets(), 100_001))
    assert offsets[:4] == [0.0, 1 / 3, 2 / 3, 1.0]
    assert offsets[-1] == 100_000 / 3  # a running sum of 1/3 drifts from this


def test_a_poisson_schedule_is_its_seed_and_starts_with_an_arrival_unless_told_otherwise():
    first = list(islice(arrivals.Poisson(5.0, seed=1).offsets(), 1000))
    assert first == list(islice(arrivals.Poisson(5.0, seed=1).offsets(), 1000))
    assert first != list(islice(arrivals.Poisson(5.0, seed=2).offsets(), 1000))
    assert first[0] == 0.0 and all(b > a for a, b in zip(first, first[1:], strict=False))
    observed = list(islice(arrivals.Poisson(5.0, seed=1, at_start=False).offsets(), 999))
    assert observed == first[1:]  # the same draws, without the send at the start
    assert 5.0 * 0.85 < len(first) / first[-1] < 5.0 * 1.15  # the rate it was asked for (1000 gaps: within ~10%)


def test_a_trace_schedule_is_the_trace_offsets_played_faster():
    schedule = arrivals.Trace((0.0, 1.0, 4.0), speed=2.0)
    assert list(schedule.offsets()) == [0.0, 0.5, 2.0]
    assert (schedule.length, schedule.label) == (3, "2x")


@pytest.mark.parametrize(
    "build", [lambda: arrivals.Constant(0), lambda: arrivals.Poisson(-1), lambda: arrivals.Trace((0.0,), 0)]
)
def test_a_schedule_that_never_moves_is_refused(build):
    with pytest.raises(ValueError):
        build()


def test_a_phase_sends_its_schedule_within_its_bounds():
    by_count = RatePhase(settings(), arrivals.Constant(10.0), duration_s=None, requests=7)
    assert list(by_count.due()) == [i / 10 for i in range(7)]
    by_time = RatePhase(settings(), arrivals.Constant(10.0), duration_s=1.0, requests=None)
    assert list(by_time.due()) == [i / 10 for i in range(10)]  # an arrival due at 1.0 s is past the phase
    assert by_count.name == "rate-10rps" and by_count.expected_requests(None) == 7


def test_a_replay_knows_how_many_requests_it_holds_within_its_bounds():
    phase = replay_phase(settings("trace"), speed=4.0, duration=None, requests=None)
    offsets = phase.settings.prompt_set.schedule(4.0).offsets_s
    assert phase.expected_requests(None) == len(offsets)
    cut = replay_phase(settings("trace"), speed=4.0, duration=offsets[10] / 4.0, requests=None)
    assert cut.expected_requests(None) == sum(1 for o in offsets if o / 4.0 < offsets[10] / 4.0)
    assert cut.name == "replay-4x" and cut.scenario == "replay"


def test_a_plan_is_made_for_the_arrivals_a_run_sends():
    planned = traffic.constant(5.0, 10.0)
    assert [a.at for a in planned.arrivals] == list(islice(arrivals.Constant(5.0).offsets(), 50))
    trace = load_prompts("trace")
    played = traffic.trace("trace-small", speed=2.0)
    assert [a.at for a in played.arrivals] == list(trace.schedule(2.0).offsets())
    poisson = traffic.poisson(8.0, 60.0)
    assert all(0 < a.at < 60.0 for a in poisson.arrivals) and not math.isclose(poisson.arrivals[0].at, 0.0)
