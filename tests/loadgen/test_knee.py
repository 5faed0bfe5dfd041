"""`python -m loadgen knee` on the synthetic engine behind the real exporter: the knee, and the resource that ran out above it.

Three engines that run out of three different things, which the knee must tell apart: 2 batch slots (vLLM
--max-num-seqs 2), a KV pool of 4 blocks, and one that admits everything but slows every step with
the batch. The search must find each one's knee and name the binding resource from the run's own
server samples, with the engine's knob.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from servescope.contracts import thresholds
from servescope.judgements import binding
from servescope.report import cli as report_cli
from tests.conftest import free_port, unavailable
from tests.doubles import cpu_hog
from tests.doubles.synthetic_openai import SyntheticProcess, SyntheticServer
from tests.harness import run_cli, spawn_cli, start_cli
from tests.paths import REPO
from tests.servescope.prometheus.test_sampler import EngineExporter

SLO = "ttft_p95<=0.1,itl_p95<=0.05"


def knee(tmp_path: Path, engine_url: str, exporter_url: str, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    env = {**os.environ, "SAMPLE_EXPORTER_URL": exporter_url, "SAMPLE_INTERVAL_MS": "50", "LOADGEN_FAULT_WAIT_S": "1"}
    options = (
        f"--max-tokens 10 --prompts synthetic:16 --warmup 0 --results {tmp_path} --run-id knee --metrics-port 0 --quiet "
        f"--duration 1 --max-load 16 --slo {SLO}"
    )
    proc = run_cli("loadgen", "knee", "--engine", f"vllm={engine_url}", *options.split(), *extra, env=env, timeout=300)
    return proc, tmp_path / "knee"


def search(tmp_path: Path, **engine) -> dict:
    with (
        SyntheticServer(ttft=0.02, itl=0.01, tokens=10, **engine) as server,
        EngineExporter({"vllm": server.url}) as exporter,
    ):
        proc, run = knee(tmp_path, server.url, exporter.url)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run / "knee.json").read_text())
    assert "knee: " in proc.stdout and f"binding at {result['binding_level']:g} users" in proc.stdout
    result["run"] = run
    return result


@pytest.mark.slow
@pytest.mark.serial  # an SLO on real latencies finds the knee: a CPU shared with another worker moves it
def test_two_batch_slots_are_the_binding_resource(tmp_path):
    result = search(tmp_path, max_running=2)
    # 2 users run at once; a third waits a whole request (~0.12 s) for its first token: TTFT p95 breaks.
    assert (result["knee"], result["first_failing"], result["status"]) == (2, 3, "found")
    assert result["binding"]["resource"] == binding.BATCH_SLOTS
    assert result["knob"]["env"] == "VLLM_MAX_NUM_SEQS" and "--max-num-seqs" in result["binding"]["advice"]
    assert result["binding"]["peak_running"] == 2 and result["binding"]["kv_max_while_waiting"] < 0.8
    by_level = {row["level"]: row for row in result["levels"]}
    assert by_level[2]["measurements"] >= 2 and by_level[3]["measurements"] >= 2  # confirmed by repeats
    assert by_level[3]["result"]["failed_most"] == "ttft_p95<=0.1"
    assert not result["non_monotonic"]
    # The run's report, its goodput section: goodput per measurement under the run's own SLOs, and the knee.
    assert report_cli.main(["--run", str(result["run"]), "--prometheus", f"http://127.0.0.1:{free_port()}"]) == 0
    numbers = json.loads((result["run"] / "report.json").read_text())
    assert numbers["goodput"]["spec"] == SLO and numbers["goodput"]["knee"]["knee"] == 2
    assert {row["phase"] for row in numbers["goodput"]["phases"]} == {p["phase"] for p in result["probes"]}
    text = (result["run"] / "report.md").read_text()
    # A knee run's answer, goodput with the knee, follows the summary (servescope/report/sections.py's order).
    assert "## 2. Goodput under the SLOs" in text and "the knee is 2 users (fails at 3 users)" in text
    assert "Knee: 2 users (fails at 3 users); above it: batch slots" in text  # the summary's line


@pytest.mark.serial  # an SLO on real latencies finds the knee: a CPU shared with another worker moves it
def test_a_tiny_kv_pool_is_the_binding_resource(tmp_path):
    result = search(tmp_path, kv_blocks=4)
    assert result["status"] == "found" and result["binding"]["resource"] == binding.KV_CAPACITY
    assert result["binding"]["kv_mean_while_waiting"] >= 0.9
    assert result["knob"]["env"] == "VLLM_CPU_KVCACHE_SPACE" and "--max-model-len" in result["binding"]["advice"]


@pytest.mark.slow
@pytest.mark.serial  # an SLO on real latencies finds the knee: a CPU shared with another worker moves it
def test_an_engine_that_slows_with_load_on_its_own_busy_core_is_compute_bound(tmp_path, engine_core):
    """Compute from evidence: nothing queued, ITL grew with the running batch, and the engine used the one core it
    may (the double spins to each deadline, pinned to core 0)."""
    result = search_process(tmp_path, "--slowdown", "1.0", "--burn", "--cpus", str(engine_core))
    # ITL = 0.01 x (1 + (users - 1)): 0.05 at 5 users, past the 0.05 limit from 6 on (and TTFT with it).
    assert result["status"] == "found" and 3 <= result["knee"] <= 5 and result["first_failing"] == result["knee"] + 1
    b = result["binding"]
    assert b["resource"] == binding.COMPUTE and b["peak_waiting"] == 0, b["evidence"]
    # Near all of the core it could have: other programs may take part of it (two CPU hogs here: 0.73 of 1 used).
    assert b["growth"] >= 1.25 and b["engine_allowed_cores"] == 1
    assert b["engine_cores"] >= thresholds.ENGINE_CPU_NEAR * b["engine_available_cores"], b["evidence"]
    assert result["knob"] is None and "no serving knob" in b["advice"]


@pytest.mark.serial  # an SLO on real latencies finds the knee: a CPU shared with another worker moves it
def test_an_engine_that_slows_with_load_while_its_cpu_idles_is_undecided(tmp_path):
    """The old rule named compute whenever nothing queued; the same slowdown from a sleeping double is not."""
    result = search(tmp_path, slowdown=1.0)
    b = result["binding"]
    assert result["status"] == "found" and b["resource"] == binding.UNDECIDED and b["peak_waiting"] == 0
    assert "compute not claimed" in b["evidence"] and result["knob"] is None


def test_an_slo_a_request_alone_misses_is_below_the_floor(tmp_path):  # 50 ms against 20: no host noise closes that
    with (
        SyntheticServer(ttft=0.05, itl=0.01, tokens=10) as server,
        EngineExporter({"vllm": server.url}) as exporter,
    ):
        proc, run = knee(tmp_path, server.url, exporter.url, "--slo", "ttft_p95<=0.02", "--knee-repeats", "1")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run / "knee.json").read_text())
    assert result["status"] == "fails at the lowest load" and result["binding"]["resource"] == binding.SLO_FLOOR
    assert "a request alone misses it" in result["binding"]["evidence"] and "at 1 user" in proc.stdout


@pytest.mark.serial  # an SLO on real latencies finds the knee: a CPU shared with another worker moves it
def test_the_knee_over_rate_finds_the_highest_rate_and_what_ran_out(tmp_path):
    """Open loop: 2 slots serve at most 2 / 0.12 s ~ 16 req/s; past it arrivals queue and TTFT breaks."""
    with (
        SyntheticServer(ttft=0.02, itl=0.01, tokens=10, max_running=2) as server,
        EngineExporter({"vllm": server.url}) as exporter,
    ):
        proc, run = knee(
            tmp_path,
            server.url,
            exporter.url,
            "--over",
            "rate",
            "--min-load",
            "2",
            "--max-load",
            "64",
            "--knee-precision",
            "0.25",
            "--knee-repeats",
            "1",
            "--duration",
            "2",
        )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run / "knee.json").read_text())
    assert result["over"] == "rate" and result["status"] == "found", proc.stdout
    assert 4 <= result["knee"] <= 16 and result["first_failing"] <= result["knee"] * 1.25 + 1e-9
    assert result["binding"]["resource"] == binding.BATCH_SLOTS, result["binding"]["evidence"]
    assert "req/s" in proc.stdout


def test_an_engine_down_from_the_start_is_an_engine_fault_in_few_requests(tmp_path):
    port = free_port()
    with EngineExporter({"vllm": f"http://127.0.0.1:{port}"}) as exporter:
        proc, run = knee(tmp_path, f"http://127.0.0.1:{port}", exporter.url, "--duration", "2")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run / "knee.json").read_text())
    assert result["status"] == "engine fault" and result["binding"]["resource"] == binding.ENGINE_FAULT
    assert result["knee"] is None and "nothing above is a capacity" in result["note"]
    requests = sum(1 for _ in open(run / "requests.jsonl"))
    assert requests < 200, f"{requests} refused requests: closed-loop users must back off"
    assert "knee: none - engine fault" in proc.stdout


def search_process(tmp_path: Path, *args: str) -> dict:
    """`search` with the double in a process of its own (its own GIL and CPU, located by its port)."""
    with (
        SyntheticProcess("--ttft", "0.02", "--itl", "0.01", "--tokens", "10", *args) as server,
        EngineExporter({"vllm": server.url}) as exporter,
    ):
        proc, run = knee(tmp_path, server.url, exporter.url)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run / "knee.json").read_text())
    result["run"] = run
    return result


@pytest.mark.serial  # an SLO on real latencies finds the knee: a CPU shared with another worker moves it
def test_an_slo_that_holds_up_to_the_highest_load_says_so(tmp_path):
    with (
        SyntheticServer(ttft=0.02, itl=0.01, tokens=10) as server,
        EngineExporter({"vllm": server.url}) as exporter,
    ):
        proc, run = knee(tmp_path, server.url, exporter.url, "--max-load", "2", "--knee-repeats", "1")
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run / "knee.json").read_text())
    assert (result["knee"], result["first_failing"]) == (2, None)
    assert result["status"] == "meets the SLOs up to the highest load"
    assert "the SLOs hold up to --max-load 2" in proc.stdout


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--slo", "ttft<0.5"], "expected terms METRIC[_pQ]<=SECONDS"),
        (["--slo-attainment", "2"], "SLO attainment '2'"),
        (["--min-load", "4", "--max-load", "2"], "expected --min-load <= --start-load <= --max-load"),
        (["--min-load", "1.5"], "a concurrency is a whole number"),
        (["--engine", "llamacpp=http://127.0.0.1:9"], "knee searches one engine at a time"),
    ],
)
def test_bad_knee_input_is_one_line_and_exit_2(tmp_path, flags, says):
    proc = run_cli(
        "loadgen",
        "knee",
        "--engine",
        "vllm=http://127.0.0.1:9",
        "--results",
        str(tmp_path),
        "--metrics-port",
        "0",
        *flags,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], proc.stderr


@pytest.mark.slow
@pytest.mark.serial  # an SLO on real latencies finds the knee: a CPU shared with another worker moves it
def test_the_knee_runs_through_locusts_own_entry_point_with_samples(tmp_path):
    """`locust -f loadgen/locustfile.py --scenario knee` (the web UI's path, headless here): the same search, the
    phases picked one by one by the conductor, and the sampler running there too so the binding resource is named."""
    with (
        SyntheticServer(ttft=0.02, itl=0.01, tokens=10, max_running=2) as server,
        EngineExporter({"vllm": server.url}) as exporter,
    ):
        proc = run_cli(
            "locust",
            "-f",
            str(REPO / "loadgen" / "locustfile.py"),
            "--headless",
            "--host",
            server.url,
            *"--engine vllm --scenario knee --max-tokens 10 --duration 1 --max-load 4 --knee-repeats 1".split(),
            *f"--slo {SLO} --metrics-port 0 --results {tmp_path}".split(),
            env={**os.environ, "SAMPLE_EXPORTER_URL": exporter.url, "SAMPLE_INTERVAL_MS": "50"},
            timeout=180,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p for p in tmp_path.iterdir() if (p / "knee.json").exists()]
    result = json.loads((run / "knee.json").read_text())
    assert (result["knee"], result["first_failing"]) == (2, 3)
    assert result["binding"]["resource"] == binding.BATCH_SLOTS
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"


def knee_search(settings, options, duration_s, requests):
    """The search as a run's plan builds it from these options: typed, under their SLOs, the knobs' fault wait."""
    from loadgen.knee import KneeOptions, KneeSearch
    from loadgen.runplan import spec_of
    from servescope.contracts.settings import LoadSettings

    typed = KneeOptions.from_options(options)
    wait_s = LoadSettings.from_env().fault_wait_s
    return KneeSearch(settings, typed, spec_of(options), duration_s, requests, fault_wait_s=wait_s)


def test_a_quiet_measurement_outweighs_a_noisy_one_of_the_same_level(tmp_path, monkeypatch):
    """The host noise rule says whether the host disturbed a phase; a quiet measurement of its level outweighs it."""
    from argparse import Namespace

    from loadgen import knee as knee_module
    from loadgen.scenarios import Settings
    from loadgen.targets import Target
    from servescope.contracts.runfolder import RunFolder
    from servescope.workloads.prompts import load as load_prompts
    from tests.servescope.judgements.test_slo import rec

    target = Target("vllm", "vllm", "http://127.0.0.1:9", "openai", "/v1/chat/completions")
    settings = Settings(target, load_prompts("seed3"), max_tokens=4, temperature=0.0, timeout_s=10.0)
    options = Namespace(
        over="concurrency",
        slo="ttft_p95<=0.5",
        slo_attainment=None,
        min_load=1,
        start_load=None,
        max_load=8,
        knee_repeats=1,
        knee_precision=0.1,
        knee_probes=10,
        arrivals="constant",
        max_in_flight=8,
    )
    search = knee_search(settings, options, 1.0, None)
    folder = RunFolder.create(tmp_path, "run")
    monkeypatch.setattr(
        knee_module,
        "noise_of",
        lambda folder, phase, instance: (("noisy: 1.9 cores used by hog",) * (phase == "knee-c1-1"), None),
    )

    def measured(phase, ttft):
        for i in range(10):
            r = rec(ttft=ttft, started=100.0 + i)
            r.phase = phase.name
            folder.append_request(r)
        return search.after(phase, folder)

    first = search.first()
    again = measured(first, ttft=2.0)  # fails the SLO on a busy host: a boundary, measured once more before it stands
    assert again.level == 1 and again.name == "knee-c1-2"
    assert json.loads((folder.path / "knee.json").read_text())["levels"][0]["meets"] is False
    nxt = measured(again, ttft=0.1)
    assert nxt.level == 2  # a quiet measurement of the same level outweighs the noisy one: 1 user meets the SLO
    result = json.loads((folder.path / "knee.json").read_text())
    assert result["probes"][0]["noisy"] == ["noisy: 1.9 cores used by hog"] and not result["probes"][1]["noisy"]
    assert [p["trusted"] for p in result["probes"]] == [False, True]
    assert result["levels"] == [result["levels"][0]] and result["levels"][0]["measurements"] == 1
    assert result["levels"][0]["meets"]
    assert "note: 1 measurement on a busy host outweighed by a quiet one of the same level" in search.lines()


def searched(
    tmp_path, monkeypatch, noisy: tuple[str, ...], e2e=lambda phase: 1.0, **changes
) -> tuple[list[float], dict, list[str]]:
    """A whole knee search over a stand-in engine that meets `ttft_p95<=0.5` up to 2 users and misses it above,
    every measurement's host noise `noisy`, each request's E2E `e2e(phase name)` (4 tokens: its time per token a
    third of E2E - TTFT): the levels measured, knee.json, the search's lines."""
    from argparse import Namespace

    from loadgen import knee as knee_module
    from loadgen.scenarios import Settings
    from loadgen.targets import Target
    from servescope.contracts.runfolder import RunFolder
    from servescope.workloads.prompts import load as load_prompts
    from tests.servescope.judgements.test_slo import rec

    target = Target("vllm", "vllm", "http://127.0.0.1:9", "openai", "/v1/chat/completions")
    settings = Settings(target, load_prompts("seed3"), max_tokens=4, temperature=0.0, timeout_s=10.0)
    options = Namespace(
        **{
            "over": "concurrency", "slo": "ttft_p95<=0.5", "slo_attainment": None, "min_load": 1, "start_load": None,
            "max_load": 8, "knee_repeats": 1, "knee_precision": 0.1, "knee_probes": 10, "arrivals": "constant",
            "max_in_flight": 8, **changes,
        }
    )  # fmt: skip
    search = knee_search(settings, options, 1.0, None)
    folder = RunFolder.create(tmp_path, "run")
    monkeypatch.setattr(knee_module, "noise_of", lambda folder, phase, instance: (noisy, None))
    phase, levels = search.first(), []
    while phase is not None:
        levels.append(phase.level)
        for i in range(10):
            r = rec(ttft=0.1 if phase.level <= 2 else 2.0, e2e=e2e(phase.name), started=100.0 + i)
            r.phase = phase.name
            folder.append_request(r)
        phase = search.after(phase, folder)
    return levels, json.loads((folder.path / "knee.json").read_text()), search.lines()


def test_a_search_on_a_host_busy_throughout_concludes_from_its_noisy_measurements(tmp_path, monkeypatch):
    """A host busy for the whole search costs it no measurement: each level is measured once, as it was."""
    levels, result, lines = searched(tmp_path, monkeypatch, ("noisy: 1.0 cores used by hog",))
    assert levels == [1, 2, 4, 3, 3]  # the first failing level once more (a transient's?), then concluded from
    assert (result["status"], result["knee"], result["first_failing"]) == ("found", 2, 3)
    assert any(line.startswith("note: 5 measurements taken on a busy host and concluded from") for line in lines)


def test_a_boundary_level_whose_measurements_disagree_in_pace_is_measured_once_more(tmp_path, monkeypatch):
    # The knee's (2 users) second measurement runs 20% slower a token: a third says which of the two was the transient.
    levels, result, lines = searched(
        tmp_path, monkeypatch, (), knee_repeats=2, e2e=lambda phase: 1.18 if phase == "knee-c2-2" else 1.0
    )
    assert levels.count(2) == 3 and levels[-1] == 2
    paces = {p["phase"]: p["pace_s"] for p in result["probes"]}
    assert paces["knee-c2-1"] == pytest.approx(0.3) and paces["knee-c2-2"] == pytest.approx(0.36)
    assert paces["knee-c2-3"] == pytest.approx(0.3)
    assert (result["knee"], result["first_failing"]) == (2, 3)


def test_measurements_within_a_twentieth_in_pace_are_not_measured_again(tmp_path, monkeypatch):
    levels, _, _ = searched(tmp_path, monkeypatch, (), knee_repeats=2, e2e=lambda p: 1.036 if p == "knee-c2-2" else 1.0)
    assert levels.count(2) == 2  # 4% slower a token: within pace.AGREE


def test_a_level_whose_pace_keeps_moving_is_measured_once_more_only(tmp_path, monkeypatch):
    # Each measurement of 2 users 10% slower a token than the one before: no two agree, and the search still ends.
    levels, result, _ = searched(
        tmp_path, monkeypatch, (), knee_repeats=2, e2e=lambda phase: 0.1 + 0.9 * 1.1 ** int(phase.rsplit("-", 1)[1])
    )
    assert levels.count(2) == 3
    assert result["status"] == "found"


def test_a_search_stopped_by_its_budget_says_how_many_measurements_would_settle_it(tmp_path, monkeypatch):
    # 1 and 2 hold, 4 fails; the budget of 3 ends the search there
    _, result, lines = searched(tmp_path, monkeypatch, (), max_load=16, knee_repeats=2, knee_probes=3)
    assert (result["knee"], result["first_failing"]) == (2, 4)
    assert result["unsettled"] == 4  # derived: 3 bisected, the new boundary confirmed once, 2 and 4 measured again
    # 2 held once and 4 failed once, each owed a repeat: 2 may yet fail and 4 may yet hold, so only 1 user is sure.
    assert result["capacity_range"] == [1, None]
    (answer,) = [line for line in lines if line.startswith("knee: ")]
    assert answer.startswith("knee: at least 1 user; failed at 4 users (not settled: about 4 more measurements (about ")
    assert any(line.startswith("note: not settled: about 4 more measurements") for line in lines)


def knee_process(
    tmp_path: Path, engine_url: str, exporter_url: str, *extra: str
) -> AbstractContextManager[subprocess.Popen]:
    env = {**os.environ, "SAMPLE_EXPORTER_URL": exporter_url, "SAMPLE_INTERVAL_MS": "50", "LOADGEN_FAULT_WAIT_S": "15"}
    options = (
        f"--max-tokens 10 --prompts synthetic:16 --warmup 0 --results {tmp_path} --run-id knee --metrics-port 0 "
        f"--quiet --duration 2 --max-load 4 --knee-repeats 1 --slo {SLO}"
    )
    return start_cli("loadgen", "knee", "--engine", f"vllm={engine_url}", *options.split(), *extra, env=env)


def faults_during_a_search(tmp_path: Path, fault) -> tuple[dict, str]:
    """A knee over 2 slots with `fault(engine)` done to the engine once the search has begun; knee.json, stdout."""
    port = free_port()
    args = ("--port", str(port), "--ttft", "0.02", "--itl", "0.01", "--tokens", "10", "--max-running", "2")
    engine = [SyntheticProcess(*args)]
    try:
        with (
            EngineExporter({"vllm": engine[0].url}) as exporter,
            knee_process(tmp_path, engine[0].url, exporter.url) as proc,
        ):
            deadline = time.monotonic() + 60
            while not (tmp_path / "knee" / "knee.json").exists():  # the first measurement is in
                assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
                time.sleep(0.2)
            fault(engine, args)
            out, err = proc.communicate(timeout=300)
    finally:
        for e in engine:
            e.stop()
    assert proc.returncode == 0, err
    return json.loads((tmp_path / "knee" / "knee.json").read_text()), out


@pytest.mark.slow
@pytest.mark.serial  # an SLO on real latencies finds the knee: a CPU shared with another worker moves it
def test_an_engine_killed_mid_search_and_back_is_measured_again_not_read_as_capacity(tmp_path):
    """BUG: an engine SIGKILLed mid-search and back 3 s later gave thousands of refused requests and a knee of
    1 with binding "compute". The level it was absent for is an engine fault, left out and measured again."""

    def kill_and_restart(engine, args):
        engine[0].proc.kill()
        engine[0].proc.wait()
        time.sleep(3)
        engine.append(SyntheticProcess(*args))

    result, out = faults_during_a_search(tmp_path, kill_and_restart)
    faulted = [p for p in result["probes"] if p["fault"]]
    assert faulted and all(p["binding"] == binding.ENGINE_FAULT for p in faulted), result["probes"]
    assert (result["knee"], result["first_failing"]) == (2, 3), out
    assert result["binding"]["resource"] == binding.BATCH_SLOTS
    assert all(level["measurements"] >= 1 for level in result["levels"])
    assert "engine fault" in out or "engine fault" in json.dumps(result["probes"])


@pytest.mark.slow
@pytest.mark.serial  # an SLO on real latencies finds the knee: a CPU shared with another worker moves it
def test_an_engine_frozen_mid_search_is_a_fault_not_batch_slots(tmp_path):
    """BUG: an engine frozen 8 s (SIGSTOP) was read as "batch slots: raise --max-num-seqs"."""

    def freeze(engine, args):
        engine[0].proc.send_signal(signal.SIGSTOP)
        time.sleep(8)
        engine[0].proc.send_signal(signal.SIGCONT)

    result, out = faults_during_a_search(tmp_path, freeze)
    faulted = [p for p in result["probes"] if p["fault"]]
    assert faulted and "could not read the engine" in faulted[0]["fault"], result["probes"]
    assert result["status"] == "found" and result["binding"]["resource"] == binding.BATCH_SLOTS, out


@pytest.mark.slow
@pytest.mark.serial  # a real-time CPU hog on one core: it would starve a parallel worker's tests
def test_a_load_generator_starved_of_its_core_is_named_the_client(tmp_path):
    """Once the search measures, the load generator's one core is mostly taken by a real-time hog: it cannot send and
    read on time, so what failed is the client, not a resource of the engine (its run-queue wait is the evidence)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: the client cannot be starved apart from the engine")
    if not cpu_hog.realtime_allowed():
        unavailable("real-time scheduling (SCHED_FIFO) is not permitted here: the hog cannot starve the client's core")
    client_core = {cores[-1]}
    hog = None
    with (
        SyntheticProcess("--ttft", "0.02", "--itl", "0.005", "--tokens", "40", "--cpus", str(cores[0])) as server,
        EngineExporter({"vllm": server.url}) as exporter,
    ):
        env = {**os.environ, "SAMPLE_EXPORTER_URL": exporter.url, "SAMPLE_INTERVAL_MS": "50"}
        options = (
            f"--max-tokens 40 --prompts synthetic:16 --warmup 0 --results {tmp_path} --run-id knee --metrics-port 0 "
            f"--quiet --duration 2 --max-load 8 --knee-repeats 1 --slo ttft_p95<=0.05,itl_p95<=0.02"
        )
        proc = spawn_cli(
            *["loadgen", "knee", "--engine", f"vllm={server.url}", *options.split()],
            env=env,
            preexec_fn=lambda: os.sched_setaffinity(0, client_core),
        )
        try:
            deadline = time.monotonic() + 60
            while not (tmp_path / "knee" / "samples.jsonl").exists():  # the first measurement has begun
                assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
                time.sleep(0.05)
            # A nice value is not enough (a client that mostly sleeps on the network is woken ahead of a spinning
            # task, and autogroups weigh sessions): a real-time hog holds the client's core 80% of every 0.25 s,
            # whatever its group, so each measurement ends on time but the client waits for its core in all of them.
            hog = subprocess.Popen(
                [sys.executable, "-m", "tests.doubles.cpu_hog", "--seconds", "60", "--realtime", "--duty", "0.8"],
                cwd=REPO,
                stdout=subprocess.PIPE,
                text=True,
                preexec_fn=lambda: os.sched_setaffinity(0, client_core),
                start_new_session=True,
            )
            out, err = proc.communicate(timeout=300)
        finally:
            if hog is not None:
                hog.terminate()
                hog.wait(10)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err
    result = json.loads((tmp_path / "knee" / "knee.json").read_text())
    b = result["binding"]
    assert b["resource"] == binding.CLIENT, (b["resource"], b["evidence"])
    assert "the load generator was busy" in b["evidence"] and "waiting for a core" in b["evidence"]
    # Its latencies can look fine (kernel stamps), but the load was not offered: no capacity comes of it.
    assert result["status"] == binding.STOPPED[binding.CLIENT] and result["knee"] is None, result["status"]
    assert "client bound at 1 users in 2 measurements in a row" in result["note"], result["note"]
