"""The plan: the replica model's queueing and routing, the replica search, and `python -m servescope.report plan` on a knee folder."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from servescope.contracts.runfolder import KNEE, PhaseRecord, RequestRecord, RunFolder
from servescope.contracts.settings import PlanSettings
from servescope.judgements import binding, slo
from servescope.report import plan, replicas, speed, traffic
from servescope.report.replicas import Arrival, Level, Profile


def level(concurrency, ttft=0.1, tpot=0.02, failed=0.0):
    return Level(concurrency, np.array([ttft]), np.array([tpot]), failed, 10)


def profile(levels, slots=None, tokens=11, knee=None):
    return Profile("test", "vllm", tuple(levels), knee, slots, tokens, None)


def test_a_request_beyond_the_slots_waits_for_one_and_its_wait_is_in_its_ttft():
    one_slot = profile([level(1)], slots=1)  # e2e alone: 0.1 + 10 x 0.02 = 0.3 s
    out = replicas.simulate([Arrival(0.0), Arrival(0.2)], one_slot, 1)
    assert out[0].e2e_s == pytest.approx(0.3)
    assert out[1].ttft_s == pytest.approx(0.1 + 0.1)  # waited 0.3 - 0.2, then its own prefill
    assert out[1].e2e_s == pytest.approx(0.1 + 0.3)


def test_a_request_admitted_later_slows_the_one_decoding():
    # Alone a token takes 0.02 s, beside another 0.04 s: A decodes 5 tokens alone (0.1 -> 0.2), B arrives at 0.2
    # (its prefill 0.1 s counts it in flight), so A's last 5 tokens take 0.04 each: A ends at 0.4.
    two = profile([level(1, tpot=0.02), level(2, tpot=0.04)])
    out = replicas.simulate([Arrival(0.0), Arrival(0.2)], two, 1)
    assert out[0].e2e_s == pytest.approx(0.4)


def test_a_replica_at_another_speed_scales_prefill_and_decode_apart_and_keeps_its_failures():
    measured = profile([level(1, failed=0.25), level(2, tpot=0.04)], slots=1)
    slower = measured.scaled(ttft=2.0, tpot=1.5)  # prefill 0.2 s, decode 0.03 s a token: 0.2 + 10 x 0.03
    assert [lv.failed_share for lv in slower.levels] == [0.25, 0.0]
    assert slower.levels[1].tpot(0.5) == pytest.approx(0.06)
    out = replicas.simulate([Arrival(0.0)], replace(slower, levels=(replace(slower.levels[0], failed_share=0.0),)), 1)
    assert out[0].ttft_s == pytest.approx(0.2)
    assert out[0].e2e_s == pytest.approx(0.5)
    assert measured.levels[0].ttft(0.5) == pytest.approx(0.1)  # the knee's own profile is left as it was


def test_replicas_on_one_machine_slow_each_other_only_while_both_have_work():
    # Alone 0.02 s a token, 0.04 s with a neighbour busy. A (replica 0) decodes alone 0.1 -> 0.2 (5 tokens), B lands
    # on replica 1 at 0.2: A's last 5 tokens take 0.04 each, A ends at 0.4; B (first token at 0.3) decodes at 0.04
    # until A leaves at 0.4 (2.5 tokens), then alone: 7.5 x 0.02 = 0.15, ending at 0.55.
    alone, busy = profile([level(1, tpot=0.02)]), profile([level(1, tpot=0.04)])
    arrivals = [Arrival(0.0), Arrival(0.2)]
    shared = replicas.simulate(arrivals, alone, 2, replicas.LEAST_CONN, sharing=replicas.Sharing(2, busy))
    assert [o.replica for o in shared] == [0, 1]
    assert shared[0].e2e_s == pytest.approx(0.4)
    assert shared[1].e2e_s == pytest.approx(0.55 - 0.2)
    apart = replicas.simulate(arrivals, alone, 2, replicas.LEAST_CONN, sharing=replicas.Sharing(1, busy))
    assert [o.e2e_s for o in apart] == pytest.approx([0.3, 0.3])  # a machine each: nobody's neighbour
    assert [o.e2e_s for o in replicas.simulate(arrivals, alone, 2)] == pytest.approx([0.3, 0.3])


def test_a_busy_knee_without_shared_machines_is_refused_in_one_line(tmp_path):
    with pytest.raises(plan.PlanError, match="only with --per-host"):
        plan._sharings(plan.parser().parse_args(["k", "--rate", "1", "--busy-knee", "b"]), tmp_path)
    with pytest.raises(plan.PlanError, match="one --busy-knee per knee run"):
        plan._sharings(
            plan.parser().parse_args(["k", "j", "--rate", "1", "--per-host", "2", "--busy-knee", "b"]), tmp_path
        )


def test_least_connections_sends_to_the_idle_replica_where_round_robin_does_not():
    # Three arrivals while the first is still running: round robin puts the third back on replica 0.
    slow = profile([level(1, tpot=1.0), level(2, tpot=1.0)], tokens=3)
    arrivals = [Arrival(0.0), Arrival(0.1), Arrival(0.2)]
    rr = replicas.simulate(arrivals, slow, 3, replicas.ROUND_ROBIN)
    lc = replicas.simulate(arrivals, slow, 2, replicas.LEAST_CONN)
    assert [o.replica for o in rr] == [0, 1, 2]
    assert lc[2].replica in (0, 1) and lc[0].replica != lc[1].replica


def test_least_connections_takes_ties_in_turn_moving_on_a_tie_only_from_a_turn_each_repetition_starts_at():
    # Nothing ends within the second: both idle (a tie), then one busy (no tie), then both busy (a tie again).
    slow = profile([level(1, tpot=1.0), level(2, tpot=1.0)], tokens=3)
    arrivals = [Arrival(0.0), Arrival(0.05), Arrival(0.1)]
    first = replicas.simulate(arrivals, slow, 2, replicas.LEAST_CONN, seed=0)
    other = replicas.simulate(arrivals, slow, 2, replicas.LEAST_CONN, seed=1)
    # nginx's turn moved once (the first tie), not per arrival: the third goes to the replica the first did not
    assert [o.replica for o in first] == [0, 1, 1]
    assert [o.replica for o in other] == [1, 0, 0]  # the router's starting turn is not known: another repetition's


def _predicted(attainment, repetitions=()):
    return plan.Prediction(1, attainment, True, [True], 0.0, 0.0, 0.0, 0, {}, tuple(repetitions))


def test_the_band_is_the_speed_edges_widened_by_how_far_one_repetition_lands_from_another():
    knee = _predicted(0.95, (0.95, 0.95, 0.95))
    # Repetitions that agree: the band is the speed edges'
    assert plan.attainment_band(knee, _predicted(0.90, (0.9, 0.9)), _predicted(0.97, (0.97, 0.97))) == pytest.approx(
        [0.90, 0.97]
    )
    # Repetitions that scatter widen each side in quadrature with the edge's own move (Student's t over them)
    slow, fast = _predicted(0.90, (0.88, 0.92)), _predicted(0.97, (0.94, 1.0))
    scatter = speed.t90(1) * float(np.std([0.88, 0.92], ddof=1)) * np.sqrt(1 + 1 / 2)  # one more run about 2
    low, high = plan.attainment_band(knee, slow, fast)
    assert low == pytest.approx(0.95 - np.hypot(0.05, scatter))
    assert high == 1.0  # never past 100%
    # A point spread (the knee's prediction at both edges): the band is the repetitions' scatter alone
    point = _predicted(0.82, (0.80, 0.84))
    low, high = plan.attainment_band(point, point, point)
    assert low < 0.82 < high and high - 0.82 == pytest.approx(0.82 - low)
    assert plan.attainment_band(knee, _predicted(None), fast) == [None, 0.97]  # unknown: said as unknown


def test_a_prediction_keeps_each_repetitions_attainment():
    spec = slo.parse("ttft<=0.5", 0.9)
    one_slot = profile([level(1)], slots=1, knee=1)
    found = plan.predict(one_slot, traffic.poisson(4, 30), 1, spec, replicas.LEAST_CONN, 4, 30)
    assert len(found.repetitions) == 4 and all(0 <= a <= 1 for a in found.repetitions)
    assert float(np.mean(found.repetitions)) == pytest.approx(found.attainment)  # the same requests in each


def test_a_load_above_the_highest_measured_level_is_a_failure_not_an_extrapolation():
    out = replicas.simulate([Arrival(0.0), Arrival(0.01)], profile([level(1)]), 1)
    assert out[0].ok and not out[1].ok and out[1].error == replicas.BEYOND


def test_the_search_finds_the_fewest_replicas_and_says_one_fewer_misses():
    # One slot, 0.3 s a request: a replica serves about 3 req/s; 8 req/s of Poisson needs more than 3 of them.
    spec = slo.parse("ttft<=0.5", 0.9)
    one_slot = profile([level(1)], slots=1, knee=1)
    row, tried = plan.plan(one_slot, traffic.poisson(8, 120), spec, replicas.LEAST_CONN, 2, 60, 16, price=1.0)
    assert row.replicas is not None and row.replicas >= 3
    assert tried[-1].meets and not tried[-2].meets
    assert row.attainment >= 0.9 > row.attainment_one_fewer
    assert row.cost_per_million_good_tokens > 0
    assert 0.5 < row.utilisation < 1.5  # requests held per replica (running or queued) over the knee's 1 user


def test_a_count_at_the_edge_of_the_speed_spread_takes_one_more_replica_and_says_the_knee_speed_count():
    # One slot, 0.3 s a request alone, deterministic arrivals every 0.31 s: one replica keeps up with 3% to spare, so
    # at 5% slower each request waits a little longer than the last (TTFT past 0.5 s soon); at 0.6 s apart it never does.
    spec = slo.parse("ttft<=0.5", 0.9)
    one_slot = profile([level(1)], slots=1, knee=1)
    five = speed.override(0.05)
    edge, _ = plan.plan(
        one_slot, traffic.constant(1 / 0.31, 60), spec, replicas.LEAST_CONN, 1, 60, 4, None, spread=five
    )
    assert edge.replicas_at_knee_speed == 1 and edge.replicas == 2
    assert edge.attainment == pytest.approx(1.0)  # at 2 replicas, the knee's speed
    assert any("1 replica(s) meet the SLOs if the engine keeps its knee speed; 2 hold across" in n for n in edge.notes)
    room, _ = plan.plan(one_slot, traffic.constant(1 / 0.6, 60), spec, replicas.LEAST_CONN, 1, 60, 4, None, spread=five)
    assert room.replicas == room.replicas_at_knee_speed == 1 and room.attainment_band == pytest.approx([1.0, 1.0])
    assert not any("knee speed;" in n for n in room.notes)
    off, _ = plan.plan(
        one_slot, traffic.constant(1 / 0.31, 60), spec, replicas.LEAST_CONN, 1, 60, 4, None, spread=speed.override(0)
    )
    assert off.replicas == 1 and off.attainment_band is None and plan.band(off.attainment_band) == "-"


def test_a_count_that_holds_only_at_the_knee_speed_within_the_limit_is_not_recommended():
    spec = slo.parse("ttft<=0.5", 0.9)
    one_slot = profile([level(1)], slots=1, knee=1)
    row, _ = plan.plan(
        one_slot, traffic.constant(1 / 0.31, 60), spec, replicas.LEAST_CONN, 1, 60, 1, None, spread=speed.override(0.05)
    )
    assert row.replicas is None and row.replicas_at_knee_speed == 1
    assert any("more than 1 (PLAN_MAX_REPLICAS) would be needed" in n for n in row.notes)


def test_a_search_that_reaches_its_limit_says_so():
    spec = slo.parse("ttft<=0.5", 0.9)
    row, _ = plan.plan(profile([level(1)], slots=1), traffic.poisson(20, 30), spec, replicas.LEAST_CONN, 1, 60, 2, None)
    assert row.replicas is None and any("PLAN_MAX_REPLICAS" in n for n in row.notes)


def _knee_folder(tmp_path, slots_flag=None, joules=None):
    folder = RunFolder.create(tmp_path, "knee")
    engine = {"instance": "vllm", "kind": "vllm", "url": "http://127.0.0.1:1"}
    if slots_flag is not None:
        engine["flags"] = {"--max-num-seqs": str(slots_flag)}
    # A knee run records its SLOs among its flags (the report judges by them), as knee.json does below.
    flags = {"slo": "ttft<=0.5", "slo_attainment": 0.9}
    folder.write_manifest({"run_id": "knee", "engines": [engine], "flags": flags})
    probes = []
    for users, ttft in ((1, 0.1), (2, 0.12), (4, 0.9)):
        phase = f"knee-c{users}"
        t0 = 1_000_000.0 + users * 100
        for i in range(20):
            folder.append_request(
                RequestRecord(
                    "vllm",
                    "vllm",
                    "sweep",
                    phase,
                    "openai",
                    "m",
                    "synthetic:256",
                    "sha",
                    f"p{i}",
                    11,
                    t0 + i,
                    True,
                    200,
                    ttft_s=ttft,
                    e2e_s=ttft + 0.2,
                    output_tokens=11,
                    prompt_tokens=256,
                )  # fmt: skip
            )
        record = PhaseRecord("vllm", "vllm", "sweep", phase, t0, t0 + 20, 20, users, "synthetic:256", "sha", 11)
        record.energy = {"joules": joules, "reason": None if joules else "not measured: no RAPL here"}
        folder.append_phase(record)
        probes.append({"phase": phase, "level": users, "trusted": True})
    probes.append({"phase": "knee-c8", "level": 8, "trusted": False})  # left out: a fault, never modelled
    summary = {"over": "concurrency", "engine": "vllm", "instance": "vllm", "spec": "ttft<=0.5", "objective": 0.9}
    # The rest of knee.json as loadgen/knee.py writes it: the report's other sections read it.
    b = binding.Binding(binding.UNDECIDED, "not read in this test")
    knee = {
        "unit": "users",
        "status": "found",
        "first_failing": 4,
        "non_monotonic": False,
        "note": "",
        "binding_level": 4,
        "binding": {**b.to_json(), "advice": b.advice("vllm")},
        "prompt_set": {"name": "synthetic:256", "repeats": False, "asked_reuse": False},
        "knob": None,
    }
    (folder.path / KNEE).write_text(json.dumps({**summary, **knee, "knee": 2, "probes": probes}))
    return folder.path


def test_a_knee_folder_becomes_a_replica_of_its_trusted_levels_and_recorded_slots(tmp_path):
    p = plan.profile_of(_knee_folder(tmp_path, slots_flag=2))
    assert [lv.concurrency for lv in p.levels] == [1, 2, 4]
    assert p.slots == 2 and p.knee == 2 and p.output_tokens == 11
    assert "max-num-seqs=2" in p.label
    assert plan.profile_of(_knee_folder(tmp_path / "b")).slots is None  # not recorded: not guessed


def test_plan_command_prints_the_table_and_writes_plan_json(tmp_path, capsys):
    knee = _knee_folder(tmp_path)
    out = tmp_path / "plan"
    code = plan.main([str(knee), "--poisson", "6", "--duration", "60", "--price", "vllm=0.5", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "replicas" in printed and "predicted, not measured" in printed
    doc = json.loads((out / "plan.json").read_text())
    assert doc["rows"][0]["replicas"] >= 1 and doc["slo"]["spec"] == "ttft<=0.5"


@pytest.mark.parametrize(
    "args, said",
    [
        (["--poisson", "1", "--rate", "1"], "one of --trace"),
        (["--trace", "/nonexistent/trace.jsonl"], "trace"),
        (["--rate", "-1"], "above 0"),
        (["--rate", "1", "--price", "nope=1"], "ENGINE=PRICE_PER_HOUR"),
    ],
)
def test_bad_plan_input_is_one_line_and_exit_2(tmp_path, capsys, args, said):
    assert plan.main([str(_knee_folder(tmp_path)), *args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("plan: ") and said in err[0]


def test_a_folder_without_knee_json_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    assert plan.main([str(tmp_path / "run"), "--rate", "1"]) == 2
    assert "knee.json" in capsys.readouterr().err


def test_the_router_config_streams_through_kept_alive_connections_to_every_replica(tmp_path):
    from servescope.stack.router import config

    text = config(["http://127.0.0.1:8001", "127.0.0.1:8002/"], 9000, replicas.LEAST_CONN, tmp_path)
    assert "least_conn;" in text and "server 127.0.0.1:8001 " in text and "server 127.0.0.1:8002 " in text
    assert "proxy_buffering off;" in text and "listen 127.0.0.1:9000;" in text
    assert "least_conn" not in config(["127.0.0.1:1"], 9000, replicas.ROUND_ROBIN, tmp_path)


def test_energy_per_good_token_is_the_knee_level_s_measured_joules_or_says_why_not(tmp_path):
    # At the knee (2 users): 20 good requests of 11 tokens; 440 J over 220 good tokens.
    assert plan.profile_of(_knee_folder(tmp_path / "a", joules=440.0)).joules_per_good_token == pytest.approx(2.0)
    p = plan.profile_of(_knee_folder(tmp_path / "b"))
    assert p.joules_per_good_token is None and "no RAPL here" in p.energy_reason


def test_a_knee_runs_report_carries_the_plan_for_the_default_traffic(tmp_path, monkeypatch):
    from servescope.report import sections
    from servescope.report.load import load as load_run

    monkeypatch.setenv("PLAN_TRACE", "trace-small")
    monkeypatch.setenv("PLAN_SPEED", "4")
    knee = _knee_folder(tmp_path)
    doc, numbers = sections.build(load_run(knee), "http://127.0.0.1:9", figures=False)
    section = next(s for s in doc.sections if s.title.startswith("Replicas for a traffic"))
    # The same answer `python -m servescope.report plan` gives for that traffic and those SLOs, from the same model.
    spec = slo.resolve("ttft<=0.5", 0.9)
    s = plan.settings_of(PlanSettings.from_env())
    expected, _ = plan.plan(
        plan.profile_of(knee), traffic.trace("trace-small", 4), spec, s["routing"], s["repeats"], s["window_s"],
        s["max_replicas"], None,
    )  # fmt: skip
    row = numbers["plan"]["rows"][0]
    assert row["replicas"] == expected.replicas and row["attainment"] == expected.attainment
    assert numbers["plan"]["traffic"]["name"] == traffic.trace("trace-small", 4).name
    table_ = next(b for b in section.blocks if hasattr(b, "headers"))
    assert table_.headers[2] == "replicas" and table_.rows[0][2] == plan.cells(expected, s["max_replicas"])[2]
    assert "predicted, not measured" in " ".join(getattr(b, "text", "") for b in section.blocks).lower()


def test_the_report_says_why_it_could_not_plan_and_other_runs_have_no_plan(tmp_path, monkeypatch):
    from servescope.report import sections
    from servescope.report.load import load as load_run

    monkeypatch.setenv("PLAN_TRACE", "")
    doc, numbers = sections.build(load_run(_knee_folder(tmp_path / "k")), "http://127.0.0.1:9", figures=False)
    assert "PLAN_TRACE is empty" in numbers["plan"]["not_planned"]
    section = next(s for s in doc.sections if s.title.startswith("Replicas for a traffic"))
    assert section.blocks[0].text.startswith("Not planned:")
    plain = _knee_folder(tmp_path / "p")
    (plain / KNEE).unlink()
    doc, numbers = sections.build(load_run(plain), "http://127.0.0.1:9", figures=False)
    assert numbers["plan"] is None and not any(s.title.startswith("Replicas") for s in doc.sections)


def test_the_plan_command_without_traffic_plans_for_plan_trace(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PLAN_TRACE", "trace-small")
    monkeypatch.setenv("PLAN_SPEED", "2")
    assert plan.main([str(_knee_folder(tmp_path)), "--out", str(tmp_path / "o")]) == 0
    assert f"plan for {traffic.trace('trace-small', 2).name}" in capsys.readouterr().out
