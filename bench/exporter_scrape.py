"""Benchmark: exporter scrape time with three engines configured (vLLM, llama.cpp, Ollama) and its resident memory."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil
import requests

from bench.processes import REPO, python_module
from bench.proxy_overhead import free_port, percentile, wait_ready
from servescope.host.children import stop

GOAL_P99_MS = 50.0
GOAL_RSS_MB = 80.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.exporter_scrape", description=__doc__)
    parser.add_argument("--scrapes", type=int, default=300)
    args = parser.parse_args(argv)
    # The recorded-page server and the simulator are the test doubles: real HTTP, recorded engine pages.
    sys.path.insert(0, str(REPO))
    from tests.doubles.recorded_engine import FIXTURES, RecordedEngine, vllm_engine

    vllm_page = next(
        name
        for name in ("vllm-0.32.0-cpu-metrics-burst.txt", "vllm-0.9.1-cpu-metrics.txt")
        if (FIXTURES / name).exists()
    )
    llamacpp_pages = sorted(FIXTURES.glob("llamacpp-*-metrics-busy.txt"))
    llamacpp_slots = sorted(FIXTURES.glob("llamacpp-*-slots-busy.json"))
    vllm = vllm_engine(vllm_page).start()
    llamacpp = RecordedEngine().start()
    if llamacpp_pages and llamacpp_slots:
        llamacpp.set_text("/metrics", llamacpp_pages[-1].read_text())
        llamacpp.pages["/slots"] = (200, llamacpp_slots[-1].read_text(), "application/json")
    else:
        llamacpp.set_text("/metrics", "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n")
        llamacpp.set_json("/slots", [{"id": 0, "n_ctx": 4096, "is_processing": False}])
    models = sorted(FIXTURES.glob("llamacpp-*-v1-models.json"))
    if models:
        llamacpp.pages["/v1/models"] = (200, models[-1].read_text(), "application/json")
    else:
        llamacpp.set_json("/v1/models", {"object": "list", "data": [{"id": "SmolLM2-135M-Instruct.Q4_1.gguf"}]})

    sim_port, port, proxy_port = free_port(), free_port(), free_port()
    sim = python_module("tests.doubles.ollama_simulator", "--port", sim_port, "--token-delay", 0.001, "--load-delay", 0)
    workdir = Path(tempfile.mkdtemp(prefix="servescope-bench-"))
    config = workdir / "exporter.yml"
    config.write_text(
        f"port: {port}\nengines:\n"
        f"  - {{kind: vllm, name: vllm, url: '{vllm.url}'}}\n"
        f"  - {{kind: llamacpp, name: llamacpp, url: '{llamacpp.url}'}}\n"
        f"  - {{kind: ollama, name: ollama, url: 'http://127.0.0.1:{sim_port}', proxy_port: {proxy_port}}}\n"
    )
    exporter = python_module("exporter", "--config", config)
    try:
        wait_ready(f"http://127.0.0.1:{sim_port}/api/version", sim)
        wait_ready(f"http://127.0.0.1:{port}/metrics", exporter)
        # Some traffic through the proxy, so the page carries its histograms too.
        for _ in range(20):
            requests.post(
                f"http://127.0.0.1:{proxy_port}/api/chat",
                timeout=10,
                json={
                    "model": "smollm2-135m",
                    "messages": [{"role": "user", "content": "hi"}],
                    "options": {"num_predict": 4},
                },
            )
        print(
            f"  {args.scrapes} scrapes of /metrics, engines: vLLM ({vllm_page}), llama.cpp "
            f"({llamacpp_pages[-1].name if llamacpp_pages else 'synthetic page'}), Ollama simulator + proxy ...",
            flush=True,
        )
        session = requests.Session()
        process = psutil.Process(exporter.pid)
        cpu_before = sum(process.cpu_times()[:2])
        durations: list[float] = []
        size = 0
        for _ in range(args.scrapes):
            started = time.perf_counter()
            resp = session.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
            durations.append(time.perf_counter() - started)
            size = len(resp.content)
            if "servescope_engine_up{" not in resp.text or " 0.0\n" in "".join(
                line + "\n" for line in resp.text.splitlines() if line.startswith("servescope_engine_up{")
            ):
                print("  an engine reported up 0 during the benchmark", flush=True)
                return 1
        cpu_ms = (sum(process.cpu_times()[:2]) - cpu_before) / args.scrapes * 1e3
        rss_mb = process.memory_info().rss / 2**20
        p50, p99, worst = (percentile(durations, q) * 1e3 for q in (50, 99, 100))
        print(f"  goal: p99 <= {GOAL_P99_MS:.0f} ms, resident memory <= {GOAL_RSS_MB:.0f} MB")
        print(f"  load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(
            "  "
            + " | ".join(
                f"{h:>10}" for h in ("scrapes", "page bytes", "p50", "p99", "max", "CPU/scrape", "RSS", "goal met")
            )
        )
        met = p99 <= GOAL_P99_MS and rss_mb <= GOAL_RSS_MB
        print(
            "  "
            + " | ".join(
                [
                    f"{args.scrapes:>10}",
                    f"{size:>10}",
                    f"{p50:>7.2f} ms",
                    f"{p99:>7.2f} ms",
                    f"{worst:>7.2f} ms",
                    f"{cpu_ms:>7.2f} ms",
                    f"{rss_mb:>7.1f} MB",
                    f"{'yes' if met else 'NO':>10}",
                ]
            )
        )
        return 0
    finally:
        stop(exporter, sim)
        vllm.stop()
        llamacpp.stop()


if __name__ == "__main__":
    sys.exit(main())
