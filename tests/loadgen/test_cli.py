"""`python -m loadgen` end to end against the synthetic server: run folders, the reference experiment (compare), failures, Ctrl-C, metrics, scenarios."""

from __future__ import annotations

import base64
import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

from servescope.contracts.runfolder import RunFolder
from tests.conftest import free_port, unavailable
from tests.doubles.ollama_simulator import OllamaSimulator
from tests.doubles.synthetic_openai import SyntheticProcess, SyntheticServer
from tests.harness import run_cli, run_python, start_cli

# For tests that read stderr line by line: the server sampler (servescope/prometheus/sampler.py) says its own lines, e.g. that
# no exporter answers; it is not what they are about.
WITHOUT_SAMPLER = {**os.environ, "SAMPLE_INTERVAL_MS": "0"}


def loadgen(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return run_cli("loadgen", *args, timeout=timeout)


def run_folder_from(stdout: str) -> RunFolder:
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("run folder: "), stdout[-2000:]
    return RunFolder(Path(last.removeprefix("run folder: ")))


@pytest.fixture
def server():
    with SyntheticServer(ttft=0.03, itl=0.004, tokens=64, version="0.32.0-synthetic") as s:
        yield s


def test_compare_writes_the_seeds_experiment_for_every_engine(server, tmp_path):
    proc = loadgen(
        "compare",
        "--engine",
        f"vllm={server.url}",
        "--engine",
        f"llamacpp:second={server.url}",
        "--results",
        str(tmp_path),
        "--run-id",
        "cmp",
        "--metrics-port",
        "0",
        "--burst-pause",
        "0.05",
        "--repetitions",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    folder = run_folder_from(proc.stdout)
    assert folder.path == tmp_path / "cmp"
    manifest = folder.manifest()
    assert manifest["status"] == "complete" and manifest["ended_at"] >= manifest["started_at"]
    assert set(manifest["engines"]) == {"vllm", "llamacpp:second"}
    assert manifest["engines"]["vllm"]["version"] == "0.32.0-synthetic"  # read from the engine's /version
    assert manifest["engines"]["vllm"]["model"] == "synthetic/model"
    from servescope.workloads import prompts

    assert manifest["prompt_set_sha256"] == prompts.load("burst3").sha256
    assert manifest["machine"]["cores"] >= 1 and manifest["machine"]["memory_bytes"] > 0

    records = list(folder.requests())
    for instance in ("vllm", "llamacpp:second"):
        mine = [r for r in records if r.instance == instance]
        by_phase = {p: [r for r in mine if r.phase == p] for p in ("sequential", "burst-1", "sequential-four")}
        assert [len(v) for v in by_phase.values()] == [3, 3, 4]
        assert all(r.ok and r.output_tokens == 48 and r.tokens_source == "usage" for r in mine)
        # Matched set: the burst sends exactly the sequential pass's prompts.
        assert sorted(r.prompt_id for r in by_phase["burst-1"]) == sorted(r.prompt_id for r in by_phase["sequential"])
        burst = by_phase["burst-1"]
        assert sorted(r.arrival_index for r in burst) == [0, 1, 2]
        # Released together: every request of the burst was sent before any of them ended, so all were in flight at
        # once. Held against the requests' own length (the server paces them, about 0.2 s), not a fixed 0.05 s spread
        # that a busy host can break; users let go one after another (0.15 s apart, tried) break it.
        assert max(r.started_at for r in burst) < min(r.started_at + r.e2e_s for r in burst)
        seq = sorted(by_phase["sequential"], key=lambda r: r.started_at)
        assert all(b.started_at >= a.started_at + a.e2e_s for a, b in zip(seq, seq[1:], strict=False))  # back to back
    # Warm-up requests (until stable: at least WARMUP_STABLE_COUNT each) reached the server but not the records.
    warmups = manifest["trials"]["warmup"]
    assert set(warmups) == {"vllm", "llamacpp:second"} and all(w["requests"] >= 3 for w in warmups.values())
    assert server.stats.requests == len(records) + sum(w["requests"] for w in warmups.values())
    phases = {(p.instance, p.phase): p for p in folder.phases()}
    assert set(phases) == {
        (i, p) for i in ("vllm", "llamacpp:second") for p in ("sequential", "burst-1", "sequential-four")
    }
    assert phases[("vllm", "burst-1")].concurrency == 3
    # The scaling the report reads from the phases' walls, held against the requests' own lengths rather than a ratio
    # a busy host can break (sequential > 2 x burst left 0.1 s of margin, one stall): the burst's requests
    # overlapped, so its wall is shorter than their sum; the sequential ones ran back to back, so its wall holds them.
    for instance in ("vllm", "llamacpp:second"):
        mine = [r for r in records if r.instance == instance]
        e2e = {p: sum(r.e2e_s for r in mine if r.phase == p) for p in ("sequential", "burst-1")}
        assert phases[(instance, "burst-1")].wall_s < e2e["burst-1"]
        assert phases[(instance, "sequential")].wall_s > 0.99 * e2e["sequential"]
    # The reference page's table as the report reads it; on a busy machine the factor may be refused (host noise),
    # never silent.
    assert "servescope: the sequential-vs-burst table (run cmp)" in proc.stdout
    assert "Scaling factor (matched-set sequential -> burst):\n  vLLM-CPU: " in proc.stdout

    with open(folder.path / "locust_stats.csv") as fh:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(fh)}
    assert int(rows[("chat", "vllm sequential")]["Request Count"]) == 7  # the sequential4 pass is sequential too
    assert int(rows[("TTFT", "vllm burst")]["Request Count"]) == 3
    assert (folder.path / "locust.html").stat().st_size > 1000


def test_the_first_names_still_run_the_reference_experiment(server, tmp_path):
    """LOADGEN_PROMPTS=seed3 (an old .env) and --no-seed4 (an old script): the same run, recorded under the new names."""
    proc = run_cli(
        "loadgen",
        *["compare", "--engine", f"vllm={server.url}", "--no-seed4", "--repetitions", "1", "--warmup", "0"],
        *["--burst-pause", "0.05", "--results", str(tmp_path), "--run-id", "old", "--metrics-port", "0"],
        env={**os.environ, "LOADGEN_PROMPTS": "seed3"},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    folder = run_folder_from(proc.stdout)
    assert {(p.phase, p.prompt_set) for p in folder.phases()} == {("sequential", "burst3"), ("burst-1", "burst3")}
    assert folder.manifest()["prompt_set"] == "burst3" and set(folder.manifest()["prompt_sets"]) == {"burst3"}
    shown = loadgen("compare", "--help").stdout
    assert "--no-sequential-four" in shown and "--no-seed4" not in shown  # accepted, no longer offered


def test_a_held_client_metrics_port_takes_a_free_one_and_says_which(server, tmp_path):
    """`make up`'s web UI holds LOADGEN_METRICS_PORT: a run beside it serves its client metrics elsewhere, said once."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        proc = run_cli(
            "loadgen", "burst", "--engine", f"vllm={server.url}", "--burst-size", "2", "--warmup", "0",
            "--results", str(tmp_path), "--run-id", "held", "--metrics-port", str(port), "--metrics-linger", "0",
            timeout=60,
        )  # fmt: skip
    finally:
        held.close()
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    said = next(line for line in proc.stdout.splitlines() if f"client metrics port {port} is in use" in line)
    other = int(said.split("serving them on port ")[1].split()[0])
    assert other != port and f"client metrics on http://127.0.0.1:{other}/metrics" in proc.stdout
    assert "not exposed" not in proc.stderr


def test_compare_matched_set_follows_a_burst_larger_than_the_prompt_set(server, tmp_path):
    """A burst of 5 over the 3 burst3 prompts: the sequential pass sends the same 5 prompts, not 3."""
    proc = loadgen(
        "compare",
        "--engine",
        f"vllm={server.url}",
        "--burst-size",
        "5",
        "--no-sequential-four",
        "--repetitions",
        "1",
        "--warmup",
        "0",
        "--results",
        str(tmp_path),
        "--run-id",
        "big",
        "--metrics-port",
        "0",
    )
    assert proc.returncode == 0, proc.stderr
    records = list(run_folder_from(proc.stdout).requests())
    sequential = sorted(r.prompt_id for r in records if r.phase == "sequential")
    burst = sorted(r.prompt_id for r in records if r.phase == "burst-1")
    assert len(sequential) == 5 and sequential == burst


def test_failures_are_counted_with_reasons_and_the_run_goes_on(server, tmp_path):
    prompt_file = tmp_path / "faults.jsonl"
    prompt_file.write_text(
        "\n".join(
            json.dumps({"id": i, "prompt": p})
            for i, p in [
                ("ok-1", "Say OK."),
                ("503", "busy [[fault:status=503]]"),
                ("cut", "cut [[fault:cut=2]]"),
                ("bad", "bad [[fault:malformed=1]]"),
                ("ok-2", "Say OK again."),
            ]
        )
        + "\n"
    )
    dead = f"http://127.0.0.1:{free_port()}"
    proc = loadgen(
        "sequential",
        "--engine",
        f"vllm={server.url}",
        "--engine",
        f"llamacpp={dead}",
        "--prompts",
        str(prompt_file),
        "--results",
        str(tmp_path),
        "--metrics-port",
        "0",
        "--warmup",
        "0",
        "--max-tokens",
        "8",
    )
    assert proc.returncode == 0, proc.stderr
    folder = run_folder_from(proc.stdout)
    records = {(r.instance, r.prompt_id): r for r in folder.requests()}
    assert len(records) == 10
    assert records[("vllm", "ok-1")].ok and records[("vllm", "ok-2")].ok
    assert records[("vllm", "503")].error.startswith("HTTP 503") and records[("vllm", "503")].status == 503
    cut = records[("vllm", "cut")]
    assert cut.error.startswith("stream cut after 2 content chunks") and cut.content_chunks == 2 and len(cut.itl_s) == 1
    assert records[("vllm", "bad")].error.startswith("malformed chunk after 1 content chunks")
    assert all(r.error == "connection refused" for (inst, _), r in records.items() if inst == "llamacpp")
    kinds = {key: r.error_kind for key, r in records.items() if key[0] == "vllm"}
    assert kinds == {
        ("vllm", "ok-1"): None,
        ("vllm", "503"): "http_5xx",
        ("vllm", "cut"): "stream_cut",
        ("vllm", "bad"): "malformed_chunk",
        ("vllm", "ok-2"): None,
    }
    assert {r.error_kind for (inst, _), r in records.items() if inst == "llamacpp"} == {"connection_refused"}
    assert folder.manifest()["engines"]["llamacpp"]["probe_errors"]
    with open(folder.path / "locust_failures.csv") as fh:
        failures = list(csv.DictReader(fh))
    errors = " | ".join(f["Error"] for f in failures)
    for reason in ("HTTP 503", "stream cut", "malformed chunk", "connection refused"):
        assert reason in errors


def test_sigterm_keeps_a_complete_run_folder_and_metrics_are_scraped_while_running(tmp_path):
    port = free_port()
    with SyntheticServer(ttft=0.05, itl=0.05, tokens=64) as slow:
        with start_cli(
            "loadgen",
            "sequential",
            "--engine",
            f"vllm={slow.url}",
            "--repeat",
            "10",
            "--max-tokens",
            "20",
            "--warmup",
            "0",
            "--results",
            str(tmp_path),
            "--run-id",
            "int",
            "--metrics-port",
            str(port),
        ) as proc:
            requests_file = tmp_path / "int" / "requests.jsonl"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (
                requests_file.exists() and requests_file.read_text().count("\n") >= 2
            ):
                time.sleep(0.1)
            assert requests_file.exists(), "no request finished within 30 s"
            exposition = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            # Mid-stream in the third request: the server has written ten of its 20 chunks (polled, not slept on;
            # half a second of stream, so a client slowed down by a busy machine has read some of them too). The
            # scheduler counts chunks as they are written (stats.tokens_sent only when a stream ends).
            while slow.httpd.scheduler.generation_tokens_total < 2 * 20 + 10:
                assert time.monotonic() < deadline, "the third request did not start streaming within 30 s"
                time.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            stdout, stderr = proc.communicate(timeout=120)
    assert 'servescope_client_ttft_seconds_bucket{engine="vllm",le="0.1",scenario="sequential"}' in exposition
    assert 'servescope_client_requests_total{engine="vllm",outcome="ok",scenario="sequential"}' in exposition
    assert 'servescope_client_users{engine="vllm",scenario="sequential"} 1.0' in exposition
    assert proc.returncode == 130, stderr
    assert "SIGTERM" in stderr and "Traceback" not in stderr
    folder = run_folder_from(stdout)
    assert folder.manifest()["status"] == "interrupted"
    records = list(folder.requests())
    assert sum(r.ok for r in records) >= 2
    interrupted = [r for r in records if not r.ok]
    assert len(interrupted) == 1 and interrupted[0].error.startswith("interrupted after")
    assert interrupted[0].content_chunks > 0 and interrupted[0].ttft_s is not None  # partial timings kept
    assert [p.phase for p in folder.phases()] == ["sequential"]
    assert (folder.path / "locust_stats.csv").exists() and (folder.path / "locust.html").exists()


def test_sweep_ramp_and_rate_phases(server, tmp_path):
    sweep = loadgen(
        "sweep",
        "--engine",
        f"vllm={server.url}",
        "--concurrencies",
        "1,3",
        "--requests",
        "2",
        "--warmup",
        "0",
        "--results",
        str(tmp_path),
        "--metrics-port",
        "0",
        "--max-tokens",
        "4",
        "--quiet",
    )
    assert sweep.returncode == 0, sweep.stderr
    folder = run_folder_from(sweep.stdout)
    phases = {p.phase: p for p in folder.phases()}
    assert {k: (v.concurrency, v.requests) for k, v in phases.items()} == {"sweep-c1": (1, 2), "sweep-c3": (3, 6)}

    rate = loadgen(
        "rate",
        "--engine",
        f"vllm={server.url}",
        "--rate",
        "40",
        "--requests",
        "8",
        "--arrivals",
        "poisson",
        "--warmup",
        "0",
        "--results",
        str(tmp_path),
        "--metrics-port",
        "0",
        "--max-tokens",
        "64",
        "--quiet",
    )
    assert rate.returncode == 0, rate.stderr
    # In the schedule's order (two Poisson arrivals a few ms apart may start in either order on a busy host).
    records = sorted(run_folder_from(rate.stdout).requests(), key=lambda r: r.scheduled_at)
    assert [r.arrival_index for r in records] == list(range(8)) and all(r.ok for r in records)
    # Open loop: at 40/s arrivals come faster than a 0.28 s request finishes, so requests overlap.
    assert any(b.started_at < a.started_at + a.e2e_s for a, b in zip(records, records[1:], strict=False))

    ramp = loadgen(
        "ramp",
        "--engine",
        f"vllm={server.url}",
        "--steps",
        "1,2",
        "--duration",
        "0.4",
        "--warmup",
        "0",
        "--results",
        str(tmp_path),
        "--metrics-port",
        "0",
        "--max-tokens",
        "4",
        "--quiet",
    )
    assert ramp.returncode == 0, ramp.stderr
    ramp_phases = {p.phase: p.concurrency for p in run_folder_from(ramp.stdout).phases()}
    assert ramp_phases == {"ramp-1users": 1, "ramp-2users": 2}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["burst", "--engine", "triton=http://127.0.0.1:1"], "unknown engine kind 'triton'"),
        (["burst", "--engine", "vllm=ftp://x"], "expected http://HOST:PORT"),
        (["burst", "--engine", "vllm=http://127.0.0.1:1", "--prompts", "/no/such/file.txt"], "prompt set"),
        (["burst"], "give at least one --engine"),
        # Once an endless loop of tracebacks at 100% CPU (without warm-up, each user failed on every request):
        (
            ["burst", "--warmup", "0", "--engine", "vllm=http://127.0.0.1:99999"],
            "port must be a number from 1 to 65535",
        ),
        (["burst", "--warmup", "0", "--engine", "vllm=http://127.0.0.1:abc"], "got 'abc'"),
        (["burst", "--warmup", "0", "--engine", "vllm=http://::1:8009"], "IPv6 address needs brackets"),
        (
            ["burst", "--warmup", "0", "--engine", "vllm=http://127.0.0.1:9", "--request-timeout", "-1"],
            "argument --request-timeout: expected a number of seconds > 0, at most 604800 (a week), got '-1'",
        ),
    ],
)
def test_bad_input_is_one_line_without_traceback(tmp_path, args, message):
    proc = loadgen(*args, "--results", str(tmp_path), "--metrics-port", "0", timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())  # nothing half-created


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["ramp", "--duration", "nan"],
            "argument --duration: expected a number of seconds > 0, at most 604800 (a week), got 'nan'",
        ),  # never ended
        (
            ["ramp", "--duration", "-5"],
            "argument --duration: expected a number of seconds > 0, at most 604800 (a week), got '-5'",
        ),  # exit 0
        (["ramp", "--requests", "-3"], "argument --requests: expected a whole number >= 1, got '-3'"),  # exit 0
        (["rate", "--rate", "inf"], "argument --rate: expected a number of arrivals per second > 0, got 'inf'"),
        (["sweep", "--concurrencies", "1,0"], "argument --concurrencies: expected user counts from 1 to 10000"),
        (["sequential", "--repeat", "0"], "argument --repeat: expected a whole number of passes from 1 to 100000"),
        (["burst", "--bursts", "0"], "argument --bursts: expected a whole number >= 1, got '0'"),
        (
            ["burst", "--burst-pause", "-1"],
            "argument --burst-pause: expected a number of seconds from 0 to 604800 (a week), got '-1'",
        ),
        (["burst", "--metrics-port", "70000"], "argument --metrics-port: expected a port from 0 (off) to 65535"),
        (["burst", "--max-tokens", "0"], "argument --max-tokens: expected a whole number >= 1, got '0'"),
        (["burst", "--prompts", "synthetic:99999999999x1"], "TOKENS from 1 to 131072"),  # grew memory without bound
        (["burst", "--prompts", "synthetic:100000x100"], "at most 4000000 words in all"),
        (["burst", "--prompts", "synthetic:1x" + "9" * 5000], "expected synthetic:TOKENS[xCOUNT]"),
    ],
)
def test_out_of_range_numbers_are_one_line_and_exit_2(tmp_path, args, message):
    proc = loadgen(*args, "--engine", "vllm=http://127.0.0.1:9", "--results", str(tmp_path), "--warmup", "0")
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-1000:]
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and not any(tmp_path.iterdir())


@pytest.mark.parametrize("run_id", ["../../x", "../escaped", "a/b", "..", ".", "/abs/olute", "-flag", "x" * 129])
def test_a_run_id_never_writes_outside_the_results_folder(tmp_path, run_id):
    results = tmp_path / "deep" / "results"
    results.mkdir(parents=True)
    if run_id.startswith("/abs"):
        run_id = str(tmp_path / "absolute")  # an absolute path this test may look at
    proc = loadgen(
        "burst", "--engine", "vllm=http://127.0.0.1:9", "--results", str(results), f"--run-id={run_id}", timeout=120
    )
    assert proc.returncode == 2 and "argument --run-id:" in proc.stderr and "not a path" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["deep", "deep/results"]


def test_the_run_folder_contract_refuses_a_path_for_a_run_id(tmp_path):
    for run_id in ("../x", "/tmp/x", "a/../../b"):
        with pytest.raises(ValueError, match="not a path"):
            RunFolder.create(tmp_path / "results", run_id)
    assert not any(tmp_path.iterdir())


def test_ollama_native_api_through_the_simulator(tmp_path):
    with OllamaSimulator(token_delay=0.002, num_parallel=1) as sim:
        proc = loadgen(
            "burst",
            "--engine",
            f"ollama={sim.url}",
            "--model",
            sim.models[0],
            "--results",
            str(tmp_path),
            "--metrics-port",
            "0",
            "--max-tokens",
            "6",
        )
    assert proc.returncode == 0, proc.stderr
    folder = run_folder_from(proc.stdout)
    records = list(folder.requests())
    assert len(records) == 3 and all(r.ok and r.api == "ollama" and r.tokens_source == "eval_count" for r in records)
    assert all(
        r.engine_stats["eval_count"] == r.output_tokens == 6 and "eval_duration_ns" in r.engine_stats for r in records
    )
    engine = folder.manifest()["engines"]["ollama"]
    assert engine["ignore_eos"] == "unavailable" and engine["version"] == sim.version


def test_a_user_that_fails_unexpectedly_stops_the_run_with_one_line_not_a_loop(server, tmp_path):
    """Whatever input validation misses: the first unexpected exception in a user ends the run, said once."""
    script = (
        "import sys\n"
        "from loadgen import cli, client\n"
        "class Broken:\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        raise RuntimeError('no transport today')\n"
        "client.TRANSPORTS['broken'] = Broken\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    proc = run_python(
        *["-c", script, "burst", "--engine", f"vllm={server.url}", "--http-client", "broken"],
        *["--warmup", "0", "--results", str(tmp_path), "--run-id", "broken", "--metrics-port", "0"],
        timeout=120,
        env=WITHOUT_SAMPLER,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    # (No exporter runs here: the sampler's one line says its reads are marked missing.)
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("server samples: ")]
    assert lines == [
        "loadgen: a load generator user failed: RuntimeError: no transport today; the run stopped, "
        "the run folder keeps what finished"
    ]
    assert RunFolder(tmp_path / "broken").manifest()["status"] == "failed"


def _set_writable(folder: Path, writable: bool) -> None:
    """Make a run folder and its files (un)writable even for root: chattr's immutable flag, else the mode bits."""
    paths = [folder, *folder.iterdir()]
    if os.geteuid() == 0:
        if shutil.which("chattr") is None:
            unavailable("chattr (e2fsprogs) is needed to make a folder unwritable for root")
        proc = subprocess.run(["chattr", "-i" if writable else "+i", *map(str, paths)], capture_output=True, text=True)
        if proc.returncode != 0:
            unavailable(f"chattr cannot make {folder} unwritable here: {proc.stderr.strip()}")
    else:
        for path in paths:
            path.chmod(path.stat().st_mode | 0o200 if writable else path.stat().st_mode & ~0o222)


def test_a_run_folder_that_becomes_unwritable_stops_the_run_fast_and_keeps_what_was_written(tmp_path):
    folder = tmp_path / "frozen"
    with SyntheticServer(ttft=0.02, itl=0.005, tokens=16) as engine:
        frozen = False
        try:
            with start_cli(
                *["loadgen", "sequential", "--engine", f"vllm={engine.url}", "--repeat", "10"],
                *["--max-tokens", "16", "--warmup", "0", "--results", str(tmp_path), "--run-id", "frozen"],
                *["--metrics-port", "0", "--quiet"],
                env=WITHOUT_SAMPLER,
            ) as proc:
                records = folder / "requests.jsonl"
                deadline = time.monotonic() + 30
                while not (records.exists() and records.read_text().count("\n") >= 3):
                    assert time.monotonic() < deadline and proc.poll() is None, "no 3 records within 30 s"
                    time.sleep(0.05)
                _set_writable(folder, False)
                frozen = True
                kept = records.read_text()
                _stdout, stderr = proc.communicate(timeout=60)  # never hangs
        finally:
            if frozen:
                _set_writable(folder, True)
    assert proc.returncode == 1, stderr[-2000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert lines[0].startswith(f"loadgen: run folder {folder}: cannot write requests.jsonl (") and "stopped" in lines[0]
    # What was written before stays, whole; the run did not go on to its 30 requests.
    assert records.read_text() == kept and 3 <= len(list(RunFolder(folder).requests())) < 30
    assert RunFolder(folder).manifest()["status"] == "running"  # the last manifest it could write


@pytest.mark.parametrize("knob", ["VLLM_PORT", "VLLM_URL"])
def test_an_engine_without_a_url_says_which_url_it_chose(server, tmp_path, knob):
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_URL", "VLLM_PORT")}
    env[knob] = str(server.port) if knob == "VLLM_PORT" else server.url
    proc = run_cli(
        *["loadgen", "burst", "--engine", "vllm", "--results", str(tmp_path), "--run-id", "r"],
        *["--metrics-port", "0", "--warmup", "0", "--max-tokens", "4", "--quiet"],
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    why = "VLLM_PORT on 127.0.0.1; VLLM_URL is not set" if knob == "VLLM_PORT" else "from VLLM_URL"
    assert f"loadgen: vllm: no engine URL given, using {server.url} ({why})" in proc.stdout.splitlines()
    engine = RunFolder(tmp_path / "r").manifest()["engines"]["vllm"]
    assert engine["url"] == server.url and engine["url_from"] == knob
    assert server.stats.requests == 3


def test_credentials_in_urls_are_sent_but_never_shown_or_stored(server, tmp_path):
    engine = server.url.replace("http://", "http://zqx-user:s3cr%40t@")  # the password is s3cr@t
    proc = loadgen(
        "compare",
        "--engine",
        f"vllm={engine}",
        "--no-sequential-four",
        "--burst-pause",
        "0.05",
        "--grafana-url",
        "http://admin:gr4fana@127.0.0.1:9",
        "--results",
        str(tmp_path),
        "--run-id",
        "cred",
        "--metrics-port",
        "0",
    )
    assert proc.returncode == 0, proc.stderr
    # Sent: every chat request (warm-ups until stable, then each repetition's 3 sequential and 3 in the burst)
    # carried the engine URL's credentials.
    basic = "Basic " + base64.b64encode(b"zqx-user:s3cr@t").decode()
    assert server.stats.authorizations == {basic: server.stats.requests} and server.stats.requests >= 7
    folder = tmp_path / "cred"
    stored = {path.name: path.read_text(errors="replace") for path in folder.iterdir()}
    assert {"manifest.json", "requests.jsonl", "locust.html", "locust_stats.csv"} <= set(stored)
    for where, text in {"stdout": proc.stdout, "stderr": proc.stderr, **stored}.items():
        assert "s3cr" not in text and "zqx-user" not in text and "gr4fana" not in text, where
    manifest = RunFolder(folder).manifest()
    assert manifest["engines"]["vllm"]["url"] == server.url.replace("http://", "http://***@")
    assert "vllm=http://***@127.0.0.1:" in manifest["command"]
    assert manifest["flags"]["grafana_url"] == "http://***@127.0.0.1:9"
    assert "GRAFANA_URL=http://***@127.0.0.1:9" in proc.stderr


def test_a_bad_engine_url_with_credentials_is_refused_without_showing_them(tmp_path):
    proc = loadgen("burst", "--engine", "vllm=http://alice:s3cret@127.0.0.1:99999", "--results", str(tmp_path))
    assert proc.returncode == 2 and "s3cret" not in proc.stderr and "alice" not in proc.stderr
    assert "'vllm=http://***@127.0.0.1:99999'" in proc.stderr


def test_the_cpu_priority_is_said_at_the_start_and_recorded_in_the_manifest(tmp_path):
    with SyntheticProcess() as engine:
        proc = run_cli(
            "loadgen", "sequential", "--engine", f"llamacpp={engine.url}", "--max-tokens", "4",
            "--results", str(tmp_path), "--run-id", "r", "--metrics-port", "0", "--warmup", "0",
            env={**os.environ, "CPU_PRIORITY": "off", "SAMPLE_INTERVAL_MS": "0"},
            timeout=120,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "CPU priority: off (CPU_PRIORITY=off): other programs compete for the CPU as equals" in proc.stdout
    trials = json.loads((tmp_path / "r" / "manifest.json").read_text())["trials"]
    assert trials["cpu_priority"] == {
        "mode": "off", "applied": False, "reason": "CPU_PRIORITY=off", "controller": None, "weight": None,
        "multiple": None, "path": None, "pids": [], "gone": [], "kept": {}, "who": {},
    }  # fmt: skip


def test_cpu_priority_on_where_it_is_not_allowed_stops_the_run_before_its_folder(tmp_path):
    script = (
        "import os, sys; os.geteuid = lambda: 1000\n"  # as a user that is not root
        "from loadgen.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = run_python(
        "-c", script, "sequential", "--engine", "llamacpp=http://127.0.0.1:9", "--results", str(tmp_path),
        "--run-id", "r", "--metrics-port", "0",
        env={**os.environ, "CPU_PRIORITY": "on"}, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "loadgen: CPU priority: not applied (not root); CPU_PRIORITY=on asks for it, so nothing runs "
        "(CPU_PRIORITY=auto measures without it)"
    ]
    assert not (tmp_path / "r").exists()


def test_a_short_runs_whole_process_leaves_numpy_and_zeromq_unloaded(server, tmp_path):
    """A 4-request run is made by the dozen (quick, the knee, tune): its summary's few values are sorted as Python
    floats (servescope.judgements.stats.SORTED_IN_PYTHON), so numpy is never imported; nor is Locust's ZeroMQ
    messaging, which only a master or a worker uses (loadgen/startup.py)."""
    proc = run_python(
        "-X", "importtime", "-m", "loadgen", "burst", "--engine", f"vllm={server.url}", "--burst-size", "4",
        "--warmup", "0", "--results", str(tmp_path), "--run-id", "short", "--metrics-port", "0", "--quiet",
        env=WITHOUT_SAMPLER, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "sequential-vs-burst table" in proc.stdout  # the summary ran, so what it imports is counted
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "_duckdb" in imported  # the lines were read: the summary's engine is there
    # A lazy module's import is listed (locust.rpc.zmqrpc, msgpack); what its body would import is not.
    assert not {"numpy", "zmq", "msgpack.ext"} & imported
