"""Load aimed at an Ollama the stack proxies goes through the exporter's proxy by default, and says which way it went."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest

from loadgen import targets
from servescope import engines
from servescope.contracts import series
from servescope.contracts.runfolder import RunFolder, read_samples
from servescope.contracts.settings import KnobTable
from tests.conftest import free_port, wait_until
from tests.doubles.ollama_simulator import OllamaSimulator
from tests.exporter.test_proxy import MODEL, ExporterThread
from tests.harness import run_cli


@pytest.fixture
def knobs(monkeypatch, tmp_path):
    """No .env URL, no native stack's pid records (another stack on this host must not be found): only what a test
    sets. Returns a setter for the ports."""
    monkeypatch.delenv("OLLAMA_URL", raising=False)
    monkeypatch.setenv("SERVESCOPE_STATE", str(tmp_path / "state"))

    def ports(ollama: int, proxy: int) -> None:
        monkeypatch.setenv("OLLAMA_PORT", str(ollama))
        monkeypatch.setenv("OLLAMA_PROXY_PORT", str(proxy))

    return ports


def table() -> KnobTable:
    """The knobs as the load generator's entry reads them, after the test set its own."""
    return KnobTable.from_env()


@pytest.fixture
def stack():
    """Ollama (the simulator) with the real exporter and its proxy in front, as `make up` runs them."""
    with OllamaSimulator(token_delay=0.002, load_delay=0.0) as sim, ExporterThread(sim.url) as exporter:
        yield sim, exporter


def test_without_a_url_the_load_goes_through_the_stacks_proxy_and_says_so(stack, knobs):
    """BUG at 7b2f789: `--engine ollama` went to Ollama's own port, around the proxy, so Ollama's
    gauges read 0 while the verdict said "raise OLLAMA_NUM_PARALLEL"."""
    sim, exporter = stack
    knobs(sim.port, exporter.proxy_port)
    assert targets.default_url("ollama", table()) == exporter.proxy_url
    assert targets.default_url_source("ollama", table()) == "OLLAMA_PROXY_PORT"
    target = targets.parse_engine("ollama", knobs=table())
    assert (target.url, target.url_from) == (exporter.proxy_url, "OLLAMA_PROXY_PORT")
    line = targets.chosen_url_line("ollama", target.url, table())
    assert line == (
        f"ollama: no engine URL given, using {exporter.proxy_url} (OLLAMA_PROXY_PORT: the stack's proxy), through "
        "servescope's Ollama proxy: Ollama's running/waiting gauges (source=\"proxy\") are what the proxy observes of "
        "this load"
    )
    assert targets.probe(target, table()).info["route"] == "proxy"


def test_an_ollama_on_the_proxy_port_is_not_taken_for_the_proxy(knobs):
    """Whatever answers on OLLAMA_PROXY_PORT is the proxy only when it names itself so (its Via header)."""
    with OllamaSimulator() as sim, OllamaSimulator() as impostor:
        knobs(sim.port, impostor.port)
        url = targets.default_url("ollama", table())
        assert url == sim.url and targets.default_url_source("ollama", table()) == "OLLAMA_PORT"
        line = targets.chosen_url_line("ollama", url, table())
        assert line.startswith(f"ollama: no engine URL given, using {sim.url} (OLLAMA_PORT on 127.0.0.1;")
        assert f"to Ollama directly (no servescope proxy answers at {impostor.url})" in line
        assert line.endswith("Ollama's running/waiting gauges are not observed for it")


def test_no_proxy_at_all_means_ollamas_own_port_and_not_observed(knobs):
    with OllamaSimulator() as sim:
        knobs(sim.port, free_port())
        target = targets.probe(targets.parse_engine("ollama", knobs=table()), table())
        assert target.url == sim.url and target.url_from == "OLLAMA_PORT" and target.info["route"] == "direct"


def test_an_explicit_url_is_honoured_and_says_it_goes_around_the_proxy(stack, knobs):
    sim, exporter = stack
    knobs(sim.port, exporter.proxy_port)
    direct = targets.probe(targets.parse_engine(f"ollama={sim.url}"), table())
    assert direct.url == sim.url and direct.info["route"] == "direct"
    assert targets.route_line(direct, table()) == (
        f"ollama: {sim.url} goes to Ollama directly (servescope's proxy answers at {exporter.proxy_url}: give that "
        "URL to go through it): the exporter sees none of this load, so Ollama's running/waiting gauges are not "
        "observed for it"
    )
    relayed = targets.probe(targets.parse_engine(f"ollama:mine={exporter.proxy_url}"), table())
    now = table()
    assert relayed.info["route"] == "proxy" and "goes through servescope's Ollama proxy" in targets.route_line(
        relayed, now
    )
    assert (
        targets.route_line(targets.parse_engine(f"vllm={sim.url}"), table()) == ""
    )  # its gauges come from vLLM itself


def _exporter_record(tmp_path: Path, argv: list[str]) -> None:
    """The native stack's pid record of its exporter, naming a live process (this one) as `up` would."""
    pids = tmp_path / "state" / "native" / "pids"
    pids.mkdir(parents=True)
    me = psutil.Process()
    record = {"name": "exporter", "pid": me.pid, "create_time": me.create_time(), "cmdline": argv, "url": ""}
    (pids / "exporter.json").write_text(json.dumps(record))


def test_the_native_stacks_exporter_record_says_where_its_proxy_is_and_what_it_relays(
    stack, knobs, monkeypatch, tmp_path
):
    """`make up` started the exporter with --proxy-port and --ollama-url: the load finds that proxy even when the
    knobs have changed since, and an OLLAMA_URL naming the Ollama it relays still goes through it."""
    sim, exporter = stack
    knobs(sim.port, free_port())  # the knob moved since `make up`; the running exporter's record did not
    argv = ["python", "-m", "exporter", "--listen-address", "0.0.0.0", "--ollama-url", sim.url]
    _exporter_record(tmp_path, [*argv, f"--proxy-port={exporter.proxy_port}"])
    assert targets.stack_proxy(engines.OLLAMA, table()) == (exporter.proxy_url, sim.url)
    assert targets.default_url("ollama", table()) == exporter.proxy_url
    monkeypatch.setenv("OLLAMA_URL", sim.url.replace("127.0.0.1", "localhost"))  # the same Ollama
    assert targets.default_url("ollama", table()) == exporter.proxy_url
    with OllamaSimulator() as other:
        monkeypatch.setenv("OLLAMA_URL", other.url)  # another Ollama: honoured as given
        now = table()
        assert (
            targets.default_url("ollama", now) == other.url
            and targets.default_url_source("ollama", now) == "OLLAMA_URL"
        )


def test_a_run_without_a_url_is_observed_by_the_proxy_end_to_end(stack, knobs, tmp_path):
    """The whole path: `python -m loadgen burst --engine ollama` through the proxy; the manifest records the route,
    the exporter counted every request, the run's own samples hold the proxy's running/waiting, and the report's
    verdict rests on Ollama's own durations with the proxy's observation beside them."""
    sim, exporter = stack
    env = {
        **os.environ,
        "OLLAMA_PORT": str(sim.port),
        "OLLAMA_PROXY_PORT": str(exporter.proxy_port),
        "SERVESCOPE_STATE": str(tmp_path / "state"),
        "SAMPLE_EXPORTER_URL": f"http://127.0.0.1:{exporter.port}",
    }
    env.pop("OLLAMA_URL", None)
    proc = run_cli(
        *["loadgen", "burst", "--engine", "ollama", "--model", MODEL, "--max-tokens", "60"],
        *["--results", str(tmp_path), "--run-id", "r", "--metrics-port", "0", "--warmup", "0", "--quiet"],
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    chosen = [line for line in proc.stdout.splitlines() if line.startswith("loadgen: ollama: ")]
    assert len(chosen) == 1 and f"using {exporter.proxy_url} (OLLAMA_PROXY_PORT" in chosen[0], proc.stdout
    folder = RunFolder(tmp_path / "r")
    engine = folder.manifest()["engines"]["ollama"]
    assert (engine["url"], engine["url_from"], engine["route"]) == (exporter.proxy_url, "OLLAMA_PROXY_PORT", "proxy")
    assert wait_until(lambda: exporter.value(series.PROXY_REQUESTS, model=MODEL, outcome="ok") == 3.0)
    assert sim.stats["completed"] == 3
    # Observed: the proxy's series exist (0 now that the burst is over), and the run's samples carry them.
    assert exporter.value(series.REQUESTS_WAITING, model=MODEL, source=series.PROXY_SOURCE) == 0.0
    observed = [s.values for s in read_samples(folder) if s.engine == "ollama" and not s.missing and s.values]
    assert any(series.REQUESTS_WAITING in v and series.REQUESTS_RUNNING in v for v in observed), observed[:3]

    from servescope.report import cli as report

    assert report.main(["--run", str(folder.path), "--prometheus", f"http://127.0.0.1:{free_port()}"]) == 0
    numbers = json.loads((folder.path / "report.json").read_text())
    (verdict,) = [v for v in numbers["verdict"]["verdicts"] if v["instance"] == "ollama"]
    # OLLAMA_NUM_PARALLEL=1 behind a burst of 3: Ollama's durations show the two later requests held for the slot.
    assert verdict["lever"] == "ollama_num_parallel", verdict
    assert "Ollama's own durations say requests waited for a slot: 2 of 3" in verdict["text"], verdict
    assert "proxy (source=proxy, samples every 100 ms)" in verdict["evidence"], verdict
    markdown = (folder.path / "report.md").read_text()
    assert "running and waiting are what the exporter's proxy observed of the requests it relayed" in markdown
