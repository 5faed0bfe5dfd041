"""`python -m loadgen ... --workers N` against the synthetic server: one burst barrier, one run folder, a worker lost."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import gevent
import pytest

from loadgen.clock_sync import clock_offset
from loadgen.scenarios import BurstPhase, Settings, Share
from loadgen.targets import parse_engine
from servescope.contracts.runfolder import RequestRecord, RunFolder
from servescope.workloads import prompts
from tests.doubles.synthetic_openai import SyntheticServer
from tests.harness import run_cli, run_python, start_cli

QUIET_SAMPLER = {**os.environ, "SAMPLE_INTERVAL_MS": "0"}  # no exporter here: the sampler's own lines are noise


@pytest.fixture
def server():
    with SyntheticServer(ttft=0.02, itl=0.002, tokens=4) as s:
        yield s


def prompt_file(tmp_path: Path, *texts: str) -> str:
    path = tmp_path / "prompts.txt"
    path.write_text("".join(f"{t}\n" for t in texts))
    return str(path)


def command(server, tmp_path: Path, scenario: str, *args: str) -> list[str]:
    """The arguments of `python -m loadgen` for a run on two workers (run_cli("loadgen", *command(...)))."""
    return [
        scenario,
        "--engine",
        f"vllm={server.url}",
        "--workers",
        "2",
        "--max-tokens",
        "4",
        "--warmup",
        "0",
        "--metrics-port",
        "0",
        "--results",
        str(tmp_path),
        "--run-id",
        "run",
        *args,
    ]


def run(server, tmp_path: Path, scenario: str, *args: str) -> RunFolder:
    proc = run_cli("loadgen", *command(server, tmp_path, scenario, *args), timeout=120, env=QUIET_SAMPLER)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    folder = RunFolder(tmp_path / "run")
    assert folder.manifest()["status"] == "complete"
    return folder


def test_a_burst_split_over_two_workers_is_released_by_one_barrier(server, tmp_path):
    # Worker 1 runs prompts 3-4 (the users after worker 0's two); prompt 3 stalls 1.5 s in round 1. A barrier per
    # worker would send worker 0's round 2 while that request is still streaming: the one barrier waits for it.
    prompts = prompt_file(tmp_path, "p1", "p2", "p3 [[fault:stall=1.5]]", "p4")
    folder = run(
        server, tmp_path, "burst", "--burst-size", "4", "--bursts", "2", "--burst-pause", "0", "--prompts", prompts
    )
    records = list(folder.requests())
    assert all(r.ok for r in records) and len(records) == 8 == server.stats.requests
    # Every request of every worker in the one folder, each prompt once per round (the matched set).
    assert sorted((r.phase, r.prompt_id, r.worker) for r in records) == [
        (f"burst-{n}", f"prompts-{i}", 0 if i <= 2 else 1) for n in (1, 2) for i in (1, 2, 3, 4)
    ]
    first = [r for r in records if r.phase == "burst-1"]
    second = [r for r in records if r.phase == "burst-2"]
    stalled = next(r for r in first if r.prompt_id == "prompts-3")
    assert min(r.started_at for r in second) >= max(r.started_at + r.e2e_s for r in first) >= stalled.ttft_s > 1.5
    assert [(p.phase, p.requests, p.concurrency) for p in folder.phases()] == [("burst-1", 4, 4), ("burst-2", 4, 4)]
    workers = folder.manifest()["workers"]
    assert [(w["index"], w["records"], w["lost"]) for w in workers] == [(0, 4, None), (1, 4, None)]
    assert all(w["clock_offset_s"] == 0 and 0 < w["clock_bound_s"] < 1 for w in workers)  # one host: one clock


def test_closed_loop_users_and_an_open_loop_schedule_are_split_across_the_workers(server, tmp_path):
    sweep = run(server, tmp_path / "sweep", "sweep", "--concurrencies", "2,3", "--requests", "2")
    counts = Counter((r.phase, r.worker) for r in sweep.requests())
    # --requests counts per user: 2 x 2 and 2 x 3, each worker sending for its own users (Locust puts the third
    # user of the level on either worker).
    assert counts[("sweep-c2", 0)] == counts[("sweep-c2", 1)] == 2
    assert sorted([counts[("sweep-c3", 0)], counts[("sweep-c3", 1)]]) == [2, 4] and sum(counts.values()) == 10
    rate = run(server, tmp_path / "rate", "rate", "--rate", "40", "--requests", "10")
    records = sorted(rate.requests(), key=lambda r: r.arrival_index)
    # One schedule: every arrival once, the workers taking every other one.
    assert [(r.arrival_index, r.worker) for r in records] == [(i, i % 2) for i in range(10)]
    assert all(r.ok for r in records)
    replay = run(server, tmp_path / "replay", "replay", "--prompts", "trace", "--speed", "20", "--requests", "6")
    records = sorted(replay.requests(), key=lambda r: r.arrival_index)
    assert [(r.arrival_index, r.worker) for r in records] == [(i, i % 2) for i in range(6)]  # a trace: the same


def test_workers_refuse_in_one_line_what_one_process_must_hold(tmp_path):
    proc = run_cli(
        *["loadgen", "burst", "--engine", "vllm=http://127.0.0.1:9", "--workers", "2"],
        *["--prompts", "conversation", "--results", str(tmp_path)],
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "held in one process" in proc.stderr
    assert not any(tmp_path.iterdir())  # refused before a run folder exists


def test_the_seeds_compare_over_two_workers_sends_each_phase_once(server, tmp_path):
    # The sequential pass runs on one worker: the other's users of the burst after it once took its prompts from the
    # sequential phase (not over on a worker that ran none of it) before the burst started.
    folder = run(server, tmp_path, "compare", "--burst-size", "3", "--no-sequential-four", "--repetitions", "1")
    records = list(folder.requests())
    assert Counter(r.phase for r in records) == {"sequential": 3, "burst-1": 3} and all(r.ok for r in records)
    assert len({r.worker for r in records if r.phase == "sequential"}) == 1
    assert server.stats.requests == 6


def test_a_worker_killed_mid_run_leaves_its_requests_recorded_as_failed_and_the_run_completes(server, tmp_path):
    prompts = prompt_file(tmp_path, "q1", "q2", "q3 [[fault:stall=30]]", "q4 [[fault:stall=30]]")
    with start_cli(
        "loadgen",
        *command(server, tmp_path, "burst", "--burst-size", "4", "--prompts", prompts),
        stderr=subprocess.STDOUT,
        env=QUIET_SAMPLER,
    ) as proc:
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
        pid, deadline, seen = None, time.monotonic() + 60, []
        while pid is None and time.monotonic() < deadline:
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                continue
            match = re.match(r"\[.*\] worker 1: pid (\d+)", seen[-1])
            pid = int(match.group(1)) if match else None
        assert pid is not None, "".join(seen)
        while server.stats.requests < 4 and time.monotonic() < deadline:  # worker 1's two requests are streaming
            time.sleep(0.05)
        assert server.stats.requests == 4
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == 0, "".join(seen)
    folder = RunFolder(tmp_path / "run")
    records = sorted(folder.requests(), key=lambda r: r.prompt_id)
    assert [(r.prompt_id, r.worker, r.ok, r.error_kind) for r in records] == [
        ("prompts-1", 0, True, None),
        ("prompts-2", 0, True, None),
        ("prompts-3", 1, False, "worker_lost"),
        ("prompts-4", 1, False, "worker_lost"),
    ]
    assert "load generator worker 1 was lost mid-run" in records[2].error
    manifest = folder.manifest()
    assert manifest["status"] == "complete"
    assert [(w["index"], w["lost"] is not None) for w in manifest["workers"]] == [(0, False), (1, True)]


def test_a_workers_clock_is_put_on_the_masters_within_half_the_shortest_round_trip():
    # Probes: (worker epoch at send, round trip, master epoch in the answer).
    same = [(100.0, 0.004, 100.0021), (200.0, 0.0006, 200.0002)]
    assert clock_offset(same) == (0.0, pytest.approx(-0.0001), pytest.approx(0.0003))  # one clock: not shifted
    behind = [(100.0, 0.002, 103.001), (200.0, 0.0004, 203.0003)]  # the worker's clock is 3 s behind
    offset, estimate, bound = clock_offset(behind)
    assert offset == estimate == pytest.approx(3.0001) and bound == pytest.approx(0.0002)
    assert clock_offset([]) is None


def test_a_burst_round_waits_for_the_last_rounds_requests_whatever_users_arrive():
    # A worker's barrier counts the users it had when the phase started; Locust may hand it a lost worker's user
    # mid-phase. That user arriving early once released round 2 while round 1 still had a request in flight.
    settings = Settings(parse_engine("vllm=http://127.0.0.1:9"), prompts.load("seed3"), 4, 0.0, 5.0)
    phase = BurstPhase(settings, size=4, rounds=2, pause_s=0)
    released = []
    phase.share = Share(users=2, hold=lambda round_no: released.append((round_no, phase.in_flight)))

    def finish(work) -> None:
        record = RequestRecord(
            "vllm", "vllm", "burst", work.phase_name, "openai", "m", "seed3", "", "p", 4, 0.0, True, 200
        )
        phase.finished(work, record, 0.1)

    first = [gevent.spawn(phase.next_work) for _ in range(2)]
    gevent.joinall(first)
    finish(first[0].value)
    back, handed_over = gevent.spawn(phase.next_work), gevent.spawn(phase.next_work)
    gevent.idle()  # both are at the barrier
    assert released == [(1, 0)]  # round 2 waits: the other request of round 1 is still in flight
    finish(first[1].value)
    last = gevent.spawn(phase.next_work)
    gevent.joinall([back, handed_over, last], timeout=5)
    assert released == [(1, 0), (2, 0)] and all(g.value is not None for g in (back, handed_over, last))


# In a process of its own: loadgen.distributed imports Locust, which would patch this whole process.
WORKER_USERS = """
import json
from loadgen.distributed import WorkerUsers
from loadgen.phase_driver import Users

calls = []


class Coordinator:
    def prepare(self, phase):
        calls.append(["coordinator.prepare", phase])

    def start(self, phase):
        calls.append(["coordinator.start", phase])

    def drain(self):
        calls.append(["coordinator.drain"])

    def finish(self):
        calls.append(["coordinator.finish"])


class Dispatch(Users):
    def admit(self, phase, previous):
        calls.append(["dispatch.admit", phase, previous])

    def start(self, phase):
        calls.append(["dispatch.start", phase])

    def release(self, phase):
        calls.append(["dispatch.release", phase])

    def halt(self):
        calls.append(["dispatch.halt"])


users = WorkerUsers(Coordinator(), Dispatch())
users.admit("b", "a")
users.start("b")
users.release("b")
users.halt()
users.end(False)
users.end(True)
print(json.dumps(calls))
"""


def test_a_phase_on_the_workers_is_prepared_dispatched_then_started_and_a_stopped_run_waits_for_their_records():
    proc = run_python("-c", WORKER_USERS, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [
        ["dispatch.admit", "b", "a"],
        # An open-loop phase's users are set to the live workers before Locust's master dispatches them; each
        # worker's part starts once they are in.
        ["coordinator.prepare", "b"],
        ["dispatch.start", "b"],
        ["coordinator.start", "b"],
        ["dispatch.release", "b"],
        ["dispatch.halt"],
        ["coordinator.drain"],  # a stopped run: the workers' interrupted records first
        ["coordinator.finish"],
        ["coordinator.finish"],  # a complete one: nothing to wait for
    ]
