"""A run folder written through servescope.contracts.runfolder in the shape the load generator writes (engines keyed by
instance with probed settings, Ollama *_ns stats, ignore_eos "unavailable", repeated bursts, an interrupted run)."""

from __future__ import annotations

import pytest

from servescope.contracts.runfolder import PhaseRecord, RequestRecord, RunFolder
from servescope.report import crosscheck, fairness, sections, table
from servescope.report.load import load

SHA = "ab" * 32
T = 1796010000.0


def write_run(tmp_path):
    folder = RunFolder.create(tmp_path, "20261130-050000-42")
    walls = {
        ("llamacpp", "sequential"): 0.9,
        ("llamacpp", "burst-1"): 0.9,
        ("llamacpp", "burst-2"): 0.6,
        ("llamacpp", "burst-3"): 0.75,
        ("ollama", "sequential"): 1.2,
        ("ollama", "burst-1"): 1.0,
    }
    t = T
    for (instance, phase), wall in walls.items():
        burst = phase.startswith("burst")
        folder.append_phase(
            PhaseRecord(
                instance,
                instance,
                "burst" if burst else "sequential",
                phase,
                t,
                t + wall,
                3,
                3 if burst else 1,
                "seed3",
                SHA,
                48,
            )
        )
        for i in range(3):
            stats = (
                {"timings": {"prompt_n": 9, "prompt_ms": 5.0, "predicted_n": 20, "predicted_ms": 150.0}}
                if instance == "llamacpp"
                else {
                    "total_duration_ns": 300_000_000,
                    "load_duration_ns": 1_200_000_000 if (phase, i) == ("sequential", 0) else 1_000_000,
                    "prompt_eval_duration_ns": 20_000_000,
                    "eval_duration_ns": 250_000_000,
                    "eval_count": 20,
                    "done_reason": "length",
                }
            )
            folder.append_request(
                RequestRecord(
                    instance,
                    instance,
                    "burst" if burst else "sequential",
                    phase,
                    "openai" if instance == "llamacpp" else "ollama",
                    "smollm2",
                    "seed3",
                    SHA,
                    f"p{i + 1}",
                    48,
                    t + (0 if burst else 0.3 * i),
                    True,
                    200,
                    ttft_s=0.05 * (i + 1),
                    e2e_s=0.31,
                    itl_s=[0.007] * 19,
                    output_tokens=20,
                    prompt_tokens=9,
                    tokens_source="usage",
                    content_chunks=20,
                    arrival_index=i if burst else None,
                    engine_stats=stats,
                )
            )
        t += 5
    folder.write_manifest(
        {
            "tool": "servescope-loadgen",
            "command": "python -m loadgen compare --bursts 3",
            "scenario": "compare",
            "status": "interrupted",
            "started_at": T,
            "ended_at": None,
            "engines": {
                "llamacpp": {
                    "kind": "llamacpp",
                    "url": "http://127.0.0.1:8081",
                    "api": "openai",
                    "model": "smollm2",
                    "ignore_eos": True,
                    "version": "b6000",
                    "models": ["smollm2"],
                    "settings": {"total_slots": 1, "n_ctx": 4096, "model_path": "/m/SmolLM2.Q4_1.gguf"},
                },
                "ollama": {
                    "kind": "ollama",
                    "url": "http://127.0.0.1:11435",
                    "api": "ollama",
                    "model": "smollm2",
                    "ignore_eos": "unavailable",
                    "version": "0.12.0",
                    "models": ["smollm2"],
                },
            },
            "prompt_sets": {"seed3": {"sha256": SHA, "prompts": [{"id": "p1", "text": "..."}]}},
            "flags": {"max_tokens": 48, "burst_size": 3, "bursts": 3, "ignore_eos": True},
            "machine": {"hostname": "h", "cores": 2, "memory_bytes": 24 << 30},
        }
    )
    return folder.path


def test_loadgen_shaped_run(tmp_path):
    run = load(write_run(tmp_path))
    assert run.warnings == []
    assert run.engines["llamacpp"].flag("parallel", "total_slots") == 1
    assert run.engines["llamacpp"].weights == "/m/SmolLM2.Q4_1.gguf"
    assert run.engines["ollama"].ignore_eos is False  # "unavailable": the engine cannot honour it
    assert run.ended_at == pytest.approx(T + 5 * 5 + 1.0)  # no end in the manifest: the last phase's end

    rows = table.build(run)
    factors = [r.scaling_factor for r in rows if r.instance == "llamacpp" and r.scaling_factor]
    assert factors == pytest.approx([1.0, 1.5, 1.2])
    assert table.repeated_bursts(rows)["llama.cpp server"].startswith("median over 3 bursts 1.20x (range 1.00x-1.50x)")

    warnings = fairness.warnings(run, rows)
    assert any("burst of 3 > LLAMACPP_PARALLEL=1: 2 requests" in w for w in warnings)
    assert any("ignore_eos is not applied alike (llamacpp=on, ollama=off)" in w for w in warnings)
    # One model name on both, a Q4_1 GGUF on one side and no precision recorded on the other.
    assert any(
        w.startswith(
            "same model (smollm2) but its precision is not recorded for every engine (llamacpp: Q4_1 "
            "(the GGUF file name SmolLM2.Q4_1.gguf); ollama: unknown (not recorded))"
        )
        for w in warnings
    )

    (oll,) = [c for c in crosscheck.build(run, None) if c.engine == "ollama"]
    assert oll.components_mean_s["transport"] == pytest.approx(0.01)  # 0.31 s client E2E - 0.30 s total_duration
    assert oll.components_mean_s["compute"] == pytest.approx(0.27)  # 20 ms prompt eval + 250 ms eval
    assert [(x["phase"], x["prompt_id"], x["load_s"]) for x in oll.cold_loads] == [("sequential", "p1", 1.2)]


def test_interrupted_status_is_said(tmp_path):
    run = load(write_run(tmp_path))
    doc, numbers = sections.build(run, "http://127.0.0.1:9", None, figures=False)
    setup = next(sec for sec in doc.sections if sec.title == "Setup")
    texts = " ".join(getattr(b, "text", "") for b in setup.blocks)
    assert "status: interrupted" in texts and "recorded this run as interrupted" in texts
    assert numbers["table"]["repeated_bursts"]
