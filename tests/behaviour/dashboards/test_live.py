"""Every dashboard query returns data from a live stack: real Prometheus scraping the real exporter and loadgen.

The engines behind them are what can run here in seconds: vLLM's /metrics served from a recorded
capture (tests/fixtures/vllm-*-metrics*.txt) whose counters and histograms advance as a live
engine's would, SGLang's the same way from the page written from its documentation (its raw
histograms feed the comparison's server-latency panels), the Ollama simulator behind the exporter's real proxy, and the synthetic
OpenAI-compatible server for the load generator's client view. The resource budget panels read a
real child process (an engine-shaped parent with a child) that the exporter watches through a pid file. Grafana cannot run here: its queries
are replayed through Prometheus' query_range with the variables substituted as Grafana does.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from dashboards import build, render
from servescope.contracts.knobs import REPO_ROOT
from servescope.prometheus import prometheus_config
from tests.conftest import PrometheusServer, free_port, serve_in_thread, stop_process, wait_http
from tests.doubles.ollama_simulator import OllamaSimulator
from tests.doubles.synthetic_openai import SyntheticServer
from tests.harness import spawn_python
from tests.paths import FIXTURES

SCRAPE = "2s"  # with a 1.6 s scrape timeout: the exporter stays scrapable on a busy 2-core machine
SERVED_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
pytestmark = pytest.mark.slow  # the live stack the module shares takes half a minute to start and load


# Bounded in time: a parent and its child each spend ~1% of a core until stopped (at most 10 minutes).
ENGINE_LOOP = """
import time
end = time.monotonic() + 600
while time.monotonic() < end:
    t = time.process_time() + 0.002
    while time.process_time() < t:
        pass
    time.sleep(0.2)
"""
ENGINE_PROCESS = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {ENGINE_LOOP!r}])\n{ENGINE_LOOP}"


def vllm_capture() -> Path:
    """The richest recorded vLLM page: 0.32.0 (this project's engine) when captured, else the newest other."""
    current = sorted(FIXTURES.glob("vllm-0.32.0-cpu-metrics*.txt"))
    candidates = (
        current or sorted(FIXTURES.glob("vllm-0.1*-metrics*.txt")) or sorted(FIXTURES.glob("vllm-*metrics*.txt"))
    )
    assert candidates, f"no vLLM metrics capture in {FIXTURES}"
    # A capture taken under load has the scheduler gauges off zero (running, waiting, KV usage).
    under_load = [p for p in candidates if "burst" in p.name or "load" in p.name]
    return (under_load or candidates)[-1]


class AdvancingPage:
    """A recorded exposition page whose counters and histogram series grow with time, as a live engine's do.

    A family with recorded counts is scaled, v * (1 + t/10) (t = seconds since start): the rate is a
    tenth of the capture per second and a histogram keeps the shape the engine recorded. A family
    the capture holds at zero (no preemption happened) grows by t instead, so its panel has data too
    (all of a zero histogram's new observations land in its lowest bucket). Gauges stay as recorded:
    they are the capture's snapshot of scheduler state.
    """

    SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{.*\})?\s+(?P<value>\S+)(?P<ts>\s+\S+)?$")

    def __init__(self, text: str, clock=time.monotonic):
        self.lines = text.splitlines()
        self.clock = clock
        self.started = clock()
        self.family: dict[str, str] = {}  # growing sample name -> its family
        for line in self.lines:
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(None, 3)
                if kind.strip() == "counter":
                    self.family.update({name: name, f"{name}_total": name})
                elif kind.strip() in ("histogram", "summary"):
                    self.family.update({f"{name}{suffix}": name for suffix in ("_bucket", "_count", "_sum")})
        recorded = set()
        for line in self.lines:
            match = self.SAMPLE.match(line) if line and not line.startswith("#") else None
            if match and match["name"] in self.family and float(match["value"]) > 0:
                recorded.add(self.family[match["name"]])
        self.idle = set(self.family.values()) - recorded

    def render(self) -> str:
        t = self.clock() - self.started
        out = []
        for line in self.lines:
            match = self.SAMPLE.match(line) if line and not line.startswith("#") else None
            if match and match["name"] in self.family:
                value = float(match["value"])
                if self.family[match["name"]] in self.idle:
                    value = t * (0.01 if match["name"].endswith("_sum") else 1.0)
                else:
                    value *= 1 + t / 10
                line = f"{match['name']}{match['labels'] or ''} {value!r}"
            out.append(line)
        return "\n".join(out) + "\n"


def serve_vllm_capture(page: AdvancingPage) -> ThreadingHTTPServer:
    """vLLM's read-only endpoints the exporter uses: /metrics (the capture), /v1/models, /version, /health."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 -- http.server's naming
            if self.path == "/metrics":
                self._send(page.render().encode(), "text/plain; version=0.0.4")
            elif self.path == "/v1/models":
                self._send(
                    b'{"object":"list","data":[{"id":"%s","object":"model","max_model_len":1024}]}'
                    % SERVED_MODEL.encode(),
                    "application/json",
                )
            elif self.path == "/version":
                self._send(b'{"version":"0.32.0"}', "application/json")
            elif self.path == "/health":
                self._send(b"", "text/plain")
            else:
                self.send_error(404)

        def _send(self, body: bytes, content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return serve_in_thread(Handler)


class Processes:
    """Child processes of this test module, each stopped (TERM, then KILL) at the end."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.procs: list[tuple[subprocess.Popen, object]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "w")
        # Own session: stop() ends the process group, children included (the engine stand-in has one).
        proc = spawn_python(*args, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, start_new_session=True)
        self.procs.append((proc, log))
        return proc

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text()[-3000:]

    def stop(self) -> None:
        for proc, log in reversed(self.procs):
            stop_process(proc, 10)
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever it left behind in its group
            except (ProcessLookupError, PermissionError):
                pass
            log.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """vLLM capture + Ollama simulator + synthetic engine -> exporter + loadgen -> Prometheus, with load run once."""
    workdir = tmp_path_factory.mktemp("live")
    procs = Processes(workdir)
    capture = vllm_capture()
    vllm = serve_vllm_capture(AdvancingPage(capture.read_text()))
    # The comparison's server TTFT and ITL panels hold every engine's own histograms: SGLang's from its docs' page.
    sglang = serve_vllm_capture(AdvancingPage((FIXTURES / "sglang-0.5-metrics-from-docs.txt").read_text()))
    synthetic = SyntheticServer(ttft=0.05, itl=0.01, tokens=24, model=SERVED_MODEL).start()
    ollama = OllamaSimulator(num_parallel=1, token_delay=0.01).__enter__()
    prometheus = PrometheusServer(workdir / "prometheus")
    prometheus.workdir.mkdir()
    try:
        exporter_port, proxy_port, loadgen_port = free_port(), free_port(), free_port()
        vllm_url = f"http://127.0.0.1:{vllm.server_address[1]}"
        # The vLLM instance's process for the resource panels: a parent (API server) and a child
        # (engine core), each using a little CPU, found through the pid file as the stack writes one.
        engine_process = procs.start("engine-process", ["-c", ENGINE_PROCESS])
        pidfile = workdir / "vllm.pid"
        pidfile.write_text(f"{engine_process.pid}\n")
        exporter = procs.start(
            "exporter",
            [
                "-m",
                "exporter",
                "--listen-address",
                "127.0.0.1",
                "--port",
                str(exporter_port),
                "--vllm-url",
                vllm_url,
                "--ollama-url",
                ollama.url,
                "--proxy-port",
                str(proxy_port),
                "--ollama-num-parallel",
                "1",
                "--process",
                f"vllm={pidfile}",
            ],
        )
        wait_http(f"http://127.0.0.1:{exporter_port}/metrics", timeout=30, proc=exporter)
        targets = [
            prometheus_config.Target("exporter", f"127.0.0.1:{exporter_port}"),
            prometheus_config.Target("loadgen", f"127.0.0.1:{loadgen_port}"),
            prometheus_config.Target("vllm", vllm_url.removeprefix("http://"), labels={"instance": "vllm"}),
            prometheus_config.Target("sglang", f"127.0.0.1:{sglang.server_address[1]}", labels={"instance": "sglang"}),
            prometheus_config.Target("prometheus", f"127.0.0.1:{prometheus.port}"),
        ]
        prometheus.start(prometheus_config.render(targets, scrape_interval=SCRAPE))
        prometheus.wait_for('up{job="exporter"} == 1 and on () up{job="vllm"} == 1', timeout=30)
        prometheus.wait_for('servescope_engine_resident_memory_bytes{engine="vllm",source="process"} > 0', timeout=30)
        started = time.time()
        # Load: the synthetic server stands in for vLLM's chat endpoint (its /metrics is the capture);
        # Ollama is reached through the exporter's proxy, as the stack does. A ramp step of 3 users
        # keeps 3 requests in flight against OLLAMA_NUM_PARALLEL=1.
        loadgen = procs.start(
            "loadgen",
            [
                "-m",
                "loadgen",
                "ramp",
                "--engine",
                f"vllm={synthetic.url}",
                "--engine",
                f"ollama=http://127.0.0.1:{proxy_port}",
                "--steps",
                "3",
                "--duration",
                "7",
                "--warmup",
                "1",
                "--max-tokens",
                "16",
                "--metrics-port",
                str(loadgen_port),
                "--metrics-linger",
                SCRAPE.removesuffix("s"),  # one scrape interval: the last client samples get scraped
                "--results",
                str(workdir / "results"),
                "--quiet",
            ],
        )
        try:
            code = loadgen.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"loadgen did not finish in 120 s:\n{procs.log('loadgen')}")
        assert code == 0, f"loadgen exited {code}:\n{procs.log('loadgen')}"
        # Two more scrapes of the exporter after the load, so rates span the whole window: one that began
        # more than a scrape interval after the load generator ended.
        after = time.time() + float(SCRAPE.removesuffix("s"))
        prometheus.wait_for(f'timestamp(up{{job="exporter"}}) > {after:.3f}', timeout=30)
        yield {
            "prometheus": prometheus,
            "start": started,
            "end": time.time(),
            "workdir": workdir,
            "capture": capture,
            "procs": procs,
        }
    finally:
        prometheus.stop()
        procs.stop()
        ollama.__exit__(None, None, None)
        synthetic.stop()
        for page in (vllm, sglang):
            page.shutdown()
            page.server_close()


def panel_cases() -> list:
    cases = []
    for name, make in build.DASHBOARDS.items():
        board = make()
        for panel in board["panels"]:
            if panel["type"] == "row":
                continue
            cases.append(pytest.param(name, panel["id"], id=f"{name}:{panel['title']}"))
    return cases


@pytest.mark.timeout(240)
@pytest.mark.parametrize("dashboard, panel_id", panel_cases())
def test_every_query_of_every_panel_returns_data(live, dashboard, panel_id):
    board = build.DASHBOARDS[dashboard]()
    panel = next(p for p in board["panels"] if p["id"] == panel_id)
    variables = render.panel_variables(board, {})
    start, end = live["start"], live["end"]
    step = 2.0
    rate_interval = "8s"  # Grafana's max(step + scrape, 4 x scrape) for a 2 s scrape
    for target in panel["targets"]:
        query = render.substitute(target["expr"], variables, step=step, rate_interval=rate_interval)
        result = render.query_range(live["prometheus"].url, query, start, end, step)
        values = [float(v) for series in result for _, v in series["values"]]
        finite = [v for v in values if not math.isnan(v)]
        assert finite, (
            f"{dashboard} / {panel['title']} / {target['refId']}: no data for {query} "
            f"(vLLM capture {live['capture'].name})"
        )


@pytest.mark.timeout(240)
def test_comparison_panels_render_to_pngs_with_data(live):
    out = live["workdir"] / "png"
    paths = render.render_dashboard(live["prometheus"].url, live["start"], live["end"], out)
    board = build.engine_comparison()
    data_panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len(paths) == len(data_panels) + 1  # one per panel + the overview page
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000, path
    panels = render.panel_data(board, live["prometheus"].url, live["start"], live["end"])
    empty = {p.title for p in panels if not p.has_data}
    assert not empty, f"rendered without data: {sorted(empty)}"


def test_alerts_and_recording_rules_evaluate_on_live_series(live):
    """The rules loaded without error and the recording rules produce series from live data."""
    prom = live["prometheus"]
    groups = requests.get(f"{prom.url}/api/v1/rules", timeout=5).json()["data"]["groups"]
    unhealthy = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r.get("health") == "err"]
    assert not unhealthy
    for record in (
        "engine_instance:servescope_generated_tokens:rate1m",
        "engine_scenario:servescope_client_ttft_seconds:p50",
        "engine_instance:servescope_server_ttft_seconds:p95",
    ):
        result = requests.get(
            f"{prom.url}/api/v1/query_range",
            timeout=5,
            params={"query": record, "start": live["start"], "end": time.time(), "step": 2},
        ).json()["data"]["result"]
        assert result, record


@pytest.mark.timeout(240)
@pytest.mark.parametrize("dashboard", sorted(build.DASHBOARDS))
def test_every_query_variable_offers_values(live, dashboard):
    """label_values(selector, label) as Grafana resolves it: Prometheus' label values API with match[]."""
    board = build.DASHBOARDS[dashboard]()
    for var in board["templating"]["list"]:
        if var["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"])
        assert match, var["query"]
        selector = render.substitute(match[1], render.panel_variables(board, {}), step=2, rate_interval="8s")
        resp = requests.get(
            f"{live['prometheus'].url}/api/v1/label/{match[2]}/values",
            params={"match[]": selector, "start": live["start"], "end": time.time()},
            timeout=5,
        )
        assert resp.json()["data"], f"{dashboard}: variable {var['name']} has no values for {selector}"


def test_every_engine_of_the_stack_shows_in_the_comparison(live):
    """Not just some series: each engine that ran (vLLM stand-in and Ollama) appears in the client and server views."""
    prom = live["prometheus"]
    for query, label in (
        ("sum by (engine) (rate(servescope_client_requests_total[8s]))", "engine"),
        ("sum by (engine) (rate(servescope_generated_tokens_total[8s]))", "engine"),
        ("max by (engine) (servescope_engine_up)", "engine"),
    ):
        result = render.query_range(prom.url, query, live["start"], live["end"], 2)
        seen = {s["metric"].get(label) for s in result if any(not math.isnan(float(v)) for _, v in s["values"])}
        assert seen >= {"vllm", "ollama"}, f"{query}: only {sorted(seen)}"
