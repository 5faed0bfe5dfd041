"""The run's sampler against sources that misbehave: every failure a counted gap in the gauges, the run and its records
finished, nothing raised, nothing hung, nothing unsafe echoed (issue 42 cases 1 and 14)."""

from __future__ import annotations

import json
import os
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servescope.contracts import series
from servescope.contracts.runfolder import RunFolder, read_samples
from servescope.prometheus.sampler import FROM_EXPORTER, FROM_PROMETHEUS, WANTED, Sampler, prometheus_resolution_s
from tests.doubles.hostile_http import Hostile, drip, huge, reply
from tests.doubles.synthetic_openai import SyntheticServer
from tests.harness import run_cli
from tests.servescope.prometheus.test_prometheus_api import ANSWERS

pytestmark = pytest.mark.timeout(180)

HANG_S = 30.0  # far above a bounded read here, far below the attack's "never"
QUERY, CONFIG = "/api/v1/query", "/api/v1/status/config"
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f]")
ENGINE = [("vllm", "vllm")]


@pytest.fixture
def folder(tmp_path):
    return RunFolder.create(tmp_path, "run")


def sampled(folder, url: str, kind: str, timeout_s: float = 2.0) -> tuple[Sampler, list[str]]:
    """A phase sampled from `url` for a few reads; the sampler and the lines it said."""
    said: list[str] = []
    sampler = Sampler(folder, url, 0.05, expected=ENGINE, timeout_s=timeout_s, notify=said.append, kind=kind)
    sampler.start("burst-1")
    time.sleep(0.3)
    sampler.stop()
    sampler.close()
    return sampler, said


@pytest.mark.parametrize(
    "answer",
    [
        {"status": "success", "data": {"result": 5}},  # sampler.py:348: raised out of start(), the run exited 1
        {"status": "success", "data": {"resultType": "vector", "result": [{"metric": ["a"], "value": [1, "1"]}]}},
        {
            "status": "success",
            "data": {"resultType": "vector", "result": [{"metric": {"engine": {}}, "value": [1, "1"]}]},
        },
        b"[" * 200_000,
    ],
    ids=["result-number", "metric-list", "label-dict", "deep"],
)
def test_a_prometheus_answer_of_another_shape_is_a_counted_gap(folder, answer):
    with Hostile({QUERY: reply(answer)}) as prometheus:
        sampler, said = sampled(folder, prometheus.url, FROM_PROMETHEUS)
    records = list(read_samples(folder))
    assert records and all(r.missing and r.instance == "vllm" for r in records)
    assert sampler.failed_reads == sampler.reads >= 2
    assert len(said) == 1 and said[0].startswith(f"server samples: Prometheus at {prometheus.url}: ")


@pytest.mark.parametrize(
    "script",
    [
        drip(b"HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n"),  # 1 byte/s: `loadgen burst` never ended
        huge("text/plain", chunk=b"vllm:num_requests_running 1\n" * 2000),  # a 10 GB page
    ],
    ids=["dripping", "10GB"],
)
def test_an_exporter_page_dripping_or_huge_costs_the_read_timeout(folder, script):
    with Hostile({"/metrics": script}) as exporter:
        started = time.monotonic()
        sampler, said = sampled(folder, exporter.url, FROM_EXPORTER, timeout_s=1.0)
        elapsed = time.monotonic() - started
    assert elapsed < HANG_S and sampler.failed_reads == sampler.reads >= 1
    assert all(r.missing for r in read_samples(folder)) and said


def test_the_status_line_and_the_records_say_no_password_and_no_escape(folder):
    """Issue 42 case 14: raw server bytes and escape sequences reached the terminal in the sampler's status line."""
    answer = {"status": "error", "error": "\x1b[2J\x1b[31mboom\nok: all good"}
    with Hostile({QUERY: reply(answer, 400)}) as prometheus:
        url = f"http://bob:PW@127.0.0.1:{prometheus.port}"
        sampler, said = sampled(folder, url, FROM_PROMETHEUS)
    missing = {r.missing for r in read_samples(folder)}
    for text in (*said, *missing, sampler.describe()):
        assert "PW" not in text and not UNSAFE.search(text), repr(text)
    assert said[0].endswith(
        "these reads are marked missing (SAMPLE_PROMETHEUS_URL points elsewhere, SAMPLE_INTERVAL_MS=0 turns sampling off)"
    )
    assert "[2J[31mboom ok: all good" in said[0]


@pytest.mark.parametrize(
    "config",
    [
        drip(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n"),  # held start-up 111 s
        reply({"status": "success", "data": {"yaml": "global: " + "[" * 100_000}}),  # deep YAML
        reply({"status": "success", "data": {"yaml": "global:\n  scrape_interval: 99999999999h\n"}}),
        reply({"status": "success", "data": {"yaml": ["not", "text"]}}),
        huge(),
    ],
    ids=["dripping", "deep-yaml", "absurd-interval", "yaml-a-list", "10GB"],
)
def test_prometheus_resolution_is_the_stacks_when_its_config_endpoint_misbehaves(monkeypatch, config):
    monkeypatch.delenv("SAMPLE_PROMETHEUS_INTERVAL_MS", raising=False)
    with Hostile({CONFIG: config}) as prometheus:
        started = time.monotonic()
        assert prometheus_resolution_s(prometheus.url, timeout_s=1.0) == 5.0
    assert time.monotonic() - started < HANG_S


# --- properties: whatever the source answers, one read is records, never an exception ---------------------------------------
LINES = st.sampled_from(
    [f'{name}{{engine="vllm",instance="vllm"}} ' for name in sorted(WANTED)]
    + ['servescope_engine_up{engine="vllm",instance="a\\nb"} ', "# HELP x y\n", "garbage {{{ ", "\x1b[2J"]
)
VALUES = st.sampled_from(["1", "0", "NaN", "+Inf", "-1", "1e309", "x", "", "0.5 1700000000"])
PAGES = st.lists(st.tuples(LINES, VALUES).map("".join), max_size=12).map("\n".join)


@pytest.fixture(scope="module")
def source():
    state = {"body": b""}

    def script(server, conn, request, index):
        conn.sendall(reply(state["body"]))
        return True

    with Hostile({"/metrics": script, QUERY: script}) as server:
        yield server, state


def _read_once_holds(source, tmp_path_factory, body, kind) -> None:
    server, state = source
    state["body"] = body
    folder = RunFolder.create(tmp_path_factory.mktemp("s"), "run")
    sampler = Sampler(folder, server.url, 0.1, expected=ENGINE, timeout_s=5.0, kind=kind)
    records = sampler.read_once()
    sampler.close()
    assert sampler.reads == 1
    for record in records:
        assert record.missing or all(
            isinstance(v, float) and v == v and abs(v) != float("inf") for v in record.values.values()
        )
        assert not UNSAFE.search(record.engine + record.instance)
    assert list(read_samples(folder)) == records  # what was read is what the folder holds, every line readable


@settings(derandomize=True, max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(PAGES)
def test_any_exporter_page_is_values_or_a_gap(source, tmp_path_factory, page):
    _read_once_holds(source, tmp_path_factory, page.encode(), FROM_EXPORTER)


@settings(derandomize=True, max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ANSWERS)
def test_any_prometheus_answer_is_values_or_a_gap(source, tmp_path_factory, answer):
    _read_once_holds(source, tmp_path_factory, json.dumps(answer).encode(), FROM_PROMETHEUS)


# --- the whole run ---------------------------------------------------------------------------------------------------------------
def test_a_load_run_sampling_a_hostile_prometheus_finishes_with_every_record(tmp_path):
    """Issue 42 case 1: 677 of 3,000 fuzzed answers killed a load run before any request, its manifest "running"."""
    bad = {"status": "success", "data": {"result": 5}}
    config = {"status": "success", "data": {"yaml": "global: " + "[" * 100_000}}
    with (
        SyntheticServer(ttft=0.02, itl=0.002, tokens=8) as engine,
        Hostile({QUERY: reply(bad), CONFIG: reply(config)}) as prometheus,
    ):
        env = {**os.environ, "SAMPLE_SOURCE": "prometheus", "SAMPLE_PROMETHEUS_URL": prometheus.url}
        env.pop("SAMPLE_PROMETHEUS_INTERVAL_MS", None)
        proc = run_cli(
            "loadgen", "burst", "--engine", f"vllm={engine.url}", "--burst-size", "3", "--warmup", "0",
            "--results", str(tmp_path), "--run-id", "hostile", "--metrics-port", "0", "--metrics-linger", "0",
            env=env, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    folder = RunFolder(tmp_path / "hostile")
    assert json.loads((folder.path / "manifest.json").read_text())["status"] == "complete"
    assert sum(1 for r in folder.requests() if r.ok) == 3
    samples = list(read_samples(folder))
    assert samples and all(r.missing for r in samples)  # the gap, counted in the records the report reads
    assert proc.stderr.count("server samples: Prometheus at") == 1


def test_the_report_says_the_gap_where_the_gauges_and_the_verdict_are(tmp_path):
    """The gap is said, not read as "nothing waited": the gauges section counts the missing reads with their reason,
    and the verdict says it rests on the clients' times alone."""
    bad = {"status": "success", "data": {"result": 5}}
    with (
        SyntheticServer(ttft=0.02, itl=0.01, tokens=100) as engine,
        Hostile({QUERY: reply(bad), "/api/v1/query_range": reply(bad)}) as prometheus,
    ):
        env = {**os.environ, "SAMPLE_SOURCE": "prometheus", "SAMPLE_PROMETHEUS_URL": prometheus.url}
        env["SAMPLE_PROMETHEUS_INTERVAL_MS"] = "100"
        proc = run_cli(
            "loadgen", "burst", "--engine", f"vllm={engine.url}", "--burst-size", "3", "--warmup", "0",
            "--results", str(tmp_path), "--run-id", "gap", "--metrics-port", "0", "--metrics-linger", "0",
            env=env, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        made = run_cli("report", "--run", str(tmp_path / "gap"), "--prometheus", prometheus.url, timeout=300)
    assert made.returncode == 0 and "Traceback" not in made.stderr, made.stderr[-3000:]
    md = (tmp_path / "gap" / "report.md").read_text()
    why = "answered a result of int where a vector was asked"
    row = next(line for line in md.splitlines() if line.startswith("| vLLM-CPU | burst-1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "0" and int(cells[4]) >= 1 and why in cells[5], row
    verdict = next(line for line in md.splitlines() if line.startswith("- Verdict: "))
    assert "by the clients' times alone: all" in verdict and why in verdict, verdict


def test_engine_up_alone_is_no_value_but_the_instance_is_known(folder):
    page = f'{series.ENGINE_UP}{{engine="vllm",instance="vllm"}} 1\n'
    with Hostile({"/metrics": reply(page)}) as exporter:
        (record,) = Sampler(folder, exporter.url, 0.1, expected=ENGINE).read_once()
    assert (record.engine, record.instance, record.values, record.missing) == ("vllm", "vllm", {}, None)
