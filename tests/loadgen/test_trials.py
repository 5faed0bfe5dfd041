"""Trials: the A B B A schedule, warm-up until stable (or a clear line), retries of noisy phases, pausing co-resident engines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import requests
from gevent.event import Event

from loadgen import trials
from loadgen.isolate import Isolation
from loadgen.scenarios import BurstPhase, SequentialPhase, Settings
from loadgen.targets import parse_engine
from servescope.contracts.runfolder import RunFolder
from servescope.contracts.settings import KnobTable
from servescope.contracts.thresholds import NoiseRule, WarmupRule
from servescope.host import pidrecords
from servescope.text import words
from servescope.workloads import prompts
from tests.conftest import free_port
from tests.doubles.synthetic_openai import SyntheticProcess
from tests.harness import run_cli


def settings_for(url: str, kind: str = "vllm") -> Settings:
    target = parse_engine(f"{kind}={url}")
    target.model = "synthetic/model"
    return Settings(target, prompts.load("seed3"), max_tokens=8, temperature=0.0, timeout_s=10)


def one_pass(target, repetition):
    """One pass of the reference experiment for `target`: a sequential pass and a burst of 3."""
    settings = Settings(target, prompts.load("seed3"), 8, 0.0, 10)
    return [
        SequentialPhase(settings, count=3, repetition=repetition),
        BurstPhase(settings, size=3, repetition=repetition),
    ]


def test_repetitions_interleave_engines_and_phases_a_b_b_a():
    targets = [parse_engine("vllm=http://127.0.0.1:1"), parse_engine("llamacpp=http://127.0.0.1:2")]

    order = [f"{p.settings.target.instance} {p.title}" for p in trials.interleave(targets, one_pass, 3)]
    assert order == [
        "vllm sequential",
        "vllm burst",
        "llamacpp sequential",
        "llamacpp burst",
        "llamacpp burst#2",
        "llamacpp sequential#2",
        "vllm burst#2",
        "vllm sequential#2",
        "vllm sequential#3",
        "vllm burst#3",
        "llamacpp sequential#3",
        "llamacpp burst#3",
    ]
    again = trials.interleave(targets, one_pass, 2)[4].again()
    assert (again.title, again.attempt, again.size) == ("burst#2.retry1", 2, 3)


def test_an_undecided_engine_gets_more_repetitions_up_to_the_cap(monkeypatch, capsys):
    """After the schedule's last phase, each engine whose factor is still undecided gets one more pass, interleaved
    with the other undecided engines, until it is decided or reaches the cap; then the run says so."""
    targets = [parse_engine("vllm=http://127.0.0.1:1"), parse_engine("llamacpp=http://127.0.0.1:2")]

    schedule = trials.interleave(targets, one_pass, 3)
    planner = trials.MoreRepetitions(targets, one_pass, 3, 5, schedule[-1])
    verdicts = iter(
        [{"llamacpp": "undecided A", "vllm": "undecided B"}, {"llamacpp": "undecided C"}, {"llamacpp": "D"}]
    )
    monkeypatch.setattr(planner, "_undecided", lambda folder: next(verdicts))
    assert [planner.after(p, None) for p in schedule[:-1]] == [None] * (len(schedule) - 1)
    ran, phase = [], schedule[-1]
    while (phase := planner.after(phase, None)) is not None:
        ran.append(f"{phase.settings.target.instance} {phase.title}")
    assert ran == [
        # repetition 4 (even): the undecided engines in reverse order, each pass reversed
        "llamacpp burst#4", "llamacpp sequential#4", "vllm burst#4", "vllm sequential#4",
        # repetition 5: only llama.cpp is still undecided
        "llamacpp sequential#5", "llamacpp burst#5",
    ]  # fmt: skip
    out = capsys.readouterr().out
    assert "loadgen: llamacpp: undecided A: adding repetition 4 (at most 5: LOADGEN_MAX_REPETITIONS)" in out
    assert planner.lines() == [
        "repetitions of llamacpp: D: still undecided after 5 repetitions (LOADGEN_MAX_REPETITIONS=5)",
        "repetitions of vllm: 4 repetitions in all (added while undecided)",
    ]


def test_no_repetition_is_added_when_every_factor_is_decided(monkeypatch):
    targets = [parse_engine("vllm=http://127.0.0.1:1")]

    def one_pass(target, repetition):
        return [SequentialPhase(Settings(target, prompts.load("seed3"), 8, 0.0, 10), count=3, repetition=repetition)]

    schedule = trials.interleave(targets, one_pass, 3)
    planner = trials.MoreRepetitions(targets, one_pass, 3, 8, schedule[-1])
    monkeypatch.setattr(planner, "_undecided", lambda folder: {})
    assert planner.after(schedule[-1], None) is None and planner.lines() == []


def test_the_host_before_the_run_counts_other_programs_and_not_the_engines():
    # Not a child of this process (a child of the load generator is the load generator's): bash starts it and leaves.
    started = subprocess.run(
        ["bash", "-c", f"setsid {sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    hog = int(started.stdout.split()[0])
    try:
        time.sleep(0.3)
        before = trials.NoiseKeeper([parse_engine("vllm=http://127.0.0.1:1")], meters=[]).baseline(1.0)
    finally:
        os.kill(hog, signal.SIGKILL)
    assert before["window_s"] >= 1.0 and before["foreign_cores"] >= 0.5  # the busy child, at least half a core
    assert before["groups"] and all(g["kind"] != "other engine" for g in before["groups"])  # largest first, ours out
    remote = trials.NoiseKeeper([parse_engine("vllm=http://192.0.2.1:8000")], meters=[])
    assert remote.baseline(0.1) is None  # an engine elsewhere: this host's programs say nothing of its


def warm(url: str, say, rule: WarmupRule, minimum: int = 1) -> dict:
    return trials.warm_up(
        settings_for(url).target,
        settings_for(url),
        minimum,
        http_client="geventhttpclient",
        timeout_s=10,
        say=say,
        interrupted=Event(),
        rule=rule,
    )


def test_warm_up_goes_on_until_the_latencies_agree():
    """The engine the warm-up rule is for: slow first requests (a starved or cold engine), then steady ones."""
    with SyntheticProcess("--ttft", "0.6", "--itl", "0.001") as engine:
        lines = []

        def say(line: str) -> None:
            lines.append(line)
            if line.startswith("warm-up vllm 2: ok"):  # the engine recovers after its second request
                requests.post(f"{engine.url}/control", json={"ttft": 0.2}, timeout=10).raise_for_status()

        result = warm(engine.url, say, WarmupRule(count=3, tolerance=0.25, max_s=60))
    assert result["stable"] is True and result["requests"] >= 5
    assert all(x > 0.55 for x in result["latencies_s"][:2])
    last = result["latencies_s"][-3:]
    assert (max(last) - min(last)) / sorted(last)[1] <= 0.25
    assert lines[-1].startswith(f"warm-up vllm: stable after {words.count(result['requests'], 'request')}")


def test_warm_up_that_never_settles_is_bounded_and_says_so():
    with SyntheticProcess("--ttft", "0.05", "--itl", "0.001") as engine:
        lines = []

        slow = [False]

        def say(line: str) -> None:  # every other request 6x slower: never three alike
            lines.append(line)
            slow[0] = not slow[0]
            requests.post(f"{engine.url}/control", json={"ttft": 0.3 if slow[0] else 0.05}, timeout=10)

        started = time.monotonic()
        result = warm(engine.url, say, WarmupRule(count=3, tolerance=0.25, max_s=1.5))
    assert result["stable"] is False and time.monotonic() - started < 10
    assert "warm-up vllm: NOT stable after" in lines[-1] and "WARMUP_MAX_S=1.5" in lines[-1]
    assert lines[-1].endswith("measuring anyway; the engine's latency was still moving, so read its numbers with care")


def test_warm_up_against_a_dead_engine_gives_up_after_a_few_failures():
    lines = []
    result = warm(f"http://127.0.0.1:{free_port()}", lines.append, WarmupRule(count=3, tolerance=0.25, max_s=60))
    assert result["requests"] == 3 and result["stable"] is False
    assert lines[-1].startswith("warm-up vllm: 3 requests failed in a row (")


def test_no_warm_up_when_asked_for_none():
    result = warm("http://127.0.0.1:1", lambda line: None, WarmupRule(3, 0.25, 60), minimum=0)
    assert result["requests"] == 0 and result["stable"] is None


HOG = (
    "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end: pass\ntime.sleep(60)"
)


def settle_behind(busy_s: float, max_s: float) -> tuple[dict | None, list[str], float]:
    """settle() for llamacpp while a stand-in for vLLM spins busy_s seconds (its tail after a burst), then idles."""
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(busy_s)])
    try:
        lines: list[str] = []
        roles = trials.hostnoise.Roles(others={"vllm": {hog.pid}})
        started = time.monotonic()
        result = trials.settle(
            roles, max_s, say=lines.append, interrupted=Event(), instance="llamacpp", rule=NoiseRule(0.25, 0.5, 0.05, 3)
        )
        return result, lines, time.monotonic() - started
    finally:
        hog.kill()
        hog.wait()


def test_after_an_engine_switch_the_phase_waits_until_the_engine_before_goes_quiet():
    result, lines, took = settle_behind(busy_s=2.0, max_s=20)
    assert result is not None and result["settled"] is True
    # The hog's 2 s, then one quiet window (waited_s is rounded to 10 ms).
    assert 2.0 <= result["waited_s"] <= took + 0.01 and took < 6
    assert result["other_engines_cores"] < 0.125  # under half the noise rule's per-program line
    assert lines == [
        f"settle: {result['waited_s']:.1f}s until the other engines went quiet before llamacpp "
        f"({result['other_engines_cores']:.2f} cores)"
    ]


def test_a_settle_wait_that_never_ends_is_bounded_and_says_so():
    result, lines, took = settle_behind(busy_s=60, max_s=2)
    assert result is not None and result["settled"] is False and took < 5
    assert result["other_engines_cores"] >= 0.125  # still over the quiet line when the wait ran out
    assert len(lines) == 1 and lines[0].startswith("settle: the other engines still use ")
    assert lines[0].endswith("(LOADGEN_SETTLE_MAX_S=2): measuring llamacpp anyway; the phase's noise says how much")


def test_no_settle_wait_without_other_engines_or_when_switched_off():
    roles = trials.hostnoise.Roles(others={"vllm": {os.getpid()}})
    say = pytest.fail  # nothing to say: nothing is waited for
    assert trials.settle(trials.hostnoise.Roles(), 30, say=say, interrupted=Event(), instance="llamacpp") is None
    assert trials.settle(roles, 0, say=say, interrupted=Event(), instance="llamacpp") is None


def test_a_noisy_phase_is_run_again_and_the_retry_supersedes_it(tmp_path):
    env = {
        "SERVESCOPE_STATE": str(tmp_path / "state"),
        "SAMPLE_INTERVAL_MS": "0",
        "NOISE_FOREIGN_CPU_CORES": "0",  # every phase is "noisy": the retry path, deterministically
    }
    with SyntheticProcess("--ttft", "0.01", "--itl", "0.001") as engine:
        proc = run_cli(
            "loadgen", "compare", "--engine", f"vllm={engine.url}", "--repetitions", "1",
            "--no-sequential-four", "--warmup", "0", "--noise-retries", "1", "--max-tokens", "4", "--results", str(tmp_path),
            "--run-id", "retry", "--metrics-port", "0",
            timeout=120, env={**os.environ, **env},
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    phases = [(p.phase, p.repetition, p.attempt) for p in RunFolder(tmp_path / "retry").phases()]
    assert phases == [
        ("sequential", 1, 1),
        ("sequential.retry1", 1, 2),
        ("burst-1", 1, 1),
        ("burst-1.retry1", 1, 2),
    ]
    assert "vllm sequential: noisy: " in proc.stdout and "running it again as sequential.retry1" in proc.stdout
    assert all(p.noise and p.noise["engine_found"] for p in RunFolder(tmp_path / "retry").phases())
    # Beside it the machine's energy: joules where this host exposes a counter, else the reason (servescope/host/energy.py).
    for p in RunFolder(tmp_path / "retry").phases():
        assert isinstance(p.energy["joules"], float) or p.energy["reason"].startswith("not measured: ")
    manifest = RunFolder(tmp_path / "retry").manifest()
    assert manifest["trials"]["repetitions"] == 1 and "sequential.retry1" in manifest["phases"]


@pytest.fixture
def native_engines(tmp_path):
    """Two "engines" in their own sessions, recorded as the native stack records them."""
    procs = {}
    for name, port in (("vllm", 8009), ("llamacpp", 8081)):
        proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
        record = {"name": name, "pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time()}
        (tmp_path / f"{name}.json").write_text(json.dumps({**record, "url": f"http://127.0.0.1:{port}"}))
        procs[name] = proc
    yield procs
    for proc in procs.values():
        proc.kill()
        proc.wait()


def state(proc) -> str:
    return psutil.Process(proc.pid).status()


def wait_state(proc, wanted: str) -> None:
    deadline = time.monotonic() + 10
    while state(proc) != wanted:
        assert time.monotonic() < deadline, f"pid {proc.pid} is {state(proc)}, not {wanted}"
        time.sleep(0.01)


def test_pause_stops_the_other_engines_while_one_is_measured(tmp_path, native_engines):
    lines = []
    isolation = Isolation("pause", lines.append, records=lambda: pidrecords.live(tmp_path))
    vllm, llama = native_engines["vllm"], native_engines["llamacpp"]
    isolation.focus(parse_engine("vllm=http://127.0.0.1:8009"))
    wait_state(llama, psutil.STATUS_STOPPED)
    assert state(vllm) != psutil.STATUS_STOPPED
    isolation.focus(parse_engine("llamacpp=http://127.0.0.1:8081"))
    wait_state(vllm, psutil.STATUS_STOPPED)
    wait_state(llama, psutil.STATUS_SLEEPING)
    isolation.release()  # however the run ends
    wait_state(vllm, psutil.STATUS_SLEEPING)
    assert isolation.paused == {}
    assert f"isolate: llamacpp (process group {llama.pid}) paused while vllm is measured" in lines


def test_pause_never_stops_a_process_group_it_does_not_own(tmp_path):
    proc = subprocess.Popen(["sleep", "60"])  # in this test's own process group
    try:
        record = {"name": "llamacpp", "pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time()}
        (tmp_path / "llamacpp.json").write_text(json.dumps(record))
        lines = []
        Isolation("pause", lines.append, records=lambda: pidrecords.live(tmp_path)).focus(
            parse_engine("vllm=http://127.0.0.1:8009")
        )
        assert state(proc) != psutil.STATUS_STOPPED
        assert lines == [f"isolate: llamacpp (pid {proc.pid}) is not in its own process group: left running"]
    finally:
        proc.kill()
        proc.wait()


def test_off_touches_nothing(tmp_path, native_engines):
    Isolation("off", print, records=lambda: pidrecords.live(tmp_path)).focus(
        parse_engine("vllm", knobs=KnobTable.from_env())
    )
    assert all(state(p) != psutil.STATUS_STOPPED for p in native_engines.values())


@pytest.mark.parametrize(
    ("knob", "value", "line"),
    [
        ("WARMUP_STABLE_COUNT", "0", "loadgen: WARMUP_STABLE_COUNT='0': expected a number from 1 to 1000"),
        ("NOISE_GROUP_CPU_CORES", "lots", "loadgen: NOISE_GROUP_CPU_CORES='lots': expected a number >= 0"),
        ("NOISE_STEAL_SHARE", "nan", "loadgen: NOISE_STEAL_SHARE='nan': expected a number from 0 to 1"),
    ],
)
def test_a_bad_trials_knob_is_one_line_before_anything_runs(tmp_path, knob, value, line):
    proc = run_cli(
        "loadgen", "compare", "--engine", "vllm=http://127.0.0.1:1", "--results", str(tmp_path),
        timeout=60, env={**os.environ, knob: value},
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip() == line
    assert list(tmp_path.iterdir()) == []  # no run folder was started
