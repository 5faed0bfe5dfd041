"""The reference page's section-3 arithmetic for vLLM: predicted from the model config, read back from cache_config_info."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servescope.stack import vllm
from tests.paths import FIXTURES

GIB = 1 << 30
# SmolLM2-135M-Instruct's config as the conversion writes it (the fields the arithmetic reads).
SMOLLM2 = {
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "dtype": "float32",
}
KNOBS = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_DTYPE": "float32",
    "VLLM_MAX_MODEL_LEN": "1024",
    "VLLM_MAX_NUM_SEQS": "8",
    "VLLM_SWAP_SPACE": "1",
    "VLLM_PREFIX_CACHING": "1",
    "SERVED_MODEL_NAME": "HuggingFaceTB/SmolLM2-135M-Instruct",
}


def test_bytes_per_token_is_k_and_v_for_every_layer_and_kv_head():
    assert vllm.kv_bytes_per_token(SMOLLM2, "float32") == 2 * 30 * 3 * 64 * 4 == 46_080
    assert vllm.kv_bytes_per_token(SMOLLM2, "bfloat16") == 23_040
    # head_dim derived when the config omits it
    derived = {k: v for k, v in SMOLLM2.items() if k != "head_dim"}
    assert vllm.kv_bytes_per_token(derived, "float32") == 46_080


def write_model(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    return tmp_path


def test_one_gib_gives_the_seeds_token_count(tmp_path):
    kv = vllm.plan(write_model(tmp_path), KNOBS, weights=538_090_408, swap_used=False)
    # The reference page: 1456 blocks x 16 = 23,296 tokens; unrounded bytes/46,080 = 23,301 (blocks round it down).
    assert kv.kv_tokens == 23_301
    assert round(kv.max_concurrency, 2) == 22.75
    assert kv.swap_space_bytes == 0
    assert vllm.refusal(kv, available_bytes=20 * GIB) is None


def test_refuses_what_cannot_fit_memory_naming_the_knob(tmp_path):
    kv = vllm.plan(write_model(tmp_path), {**KNOBS, "VLLM_CPU_KVCACHE_SPACE": "8"}, weights=538_090_408, swap_used=True)
    message = vllm.refusal(kv, available_bytes=6 * GIB)
    assert message is not None and "VLLM_CPU_KVCACHE_SPACE" in message and "6.0 GiB is available" in message


def test_refuses_max_len_times_seqs_beyond_the_kv_tokens(tmp_path):
    kv = vllm.plan(write_model(tmp_path), {**KNOBS, "VLLM_MAX_NUM_SEQS": "32"}, weights=0, swap_used=False)
    message = vllm.refusal(kv, available_bytes=20 * GIB)
    assert message is not None
    assert "VLLM_MAX_NUM_SEQS=32" in message and "32,768" in message and "lower VLLM_MAX_NUM_SEQS to 22" in message


def test_refuses_a_single_sequence_longer_than_the_cache(tmp_path):
    kv = vllm.plan(
        write_model(tmp_path),
        {**KNOBS, "VLLM_MAX_MODEL_LEN": "32768", "VLLM_MAX_NUM_SEQS": "1"},
        weights=0,
        swap_used=False,
    )
    message = vllm.refusal(kv, available_bytes=20 * GIB)
    assert message is not None and "VLLM_MAX_MODEL_LEN=32768" in message


def test_section3_from_vllm_0_32_cache_config_info():
    info = vllm.cache_config_info((FIXTURES / "vllm-0.32.0-cpu-metrics-idle.txt").read_text())
    assert info is not None
    text = "\n".join(vllm.kv_sizing_lines(info, KNOBS, swap_used=False))
    blocks, block_size = int(info["num_gpu_blocks"]), int(info["block_size"])
    assert (blocks, block_size) == (182, 128)
    assert "23,296 = 182 blocks × 128 (vLLM: kv_cache_size_tokens=23296)" in text
    assert "1 GiB = 1,073,741,824 bytes" in text
    assert "22.75x sequences of VLLM_MAX_MODEL_LEN=1024" in text and "(vLLM: 22.75x)" in text
    assert "no --swap-space" in text


def test_section3_from_the_seeds_vllm_0_9_1_cache_config_info():
    info = vllm.cache_config_info((FIXTURES / "vllm-0.9.1-cpu-metrics.txt").read_text())
    text = "\n".join(vllm.kv_sizing_lines(info, KNOBS, swap_used=True))
    # The reference page: 1456 blocks of 16 tokens, 22.75x at 1024, swap space accepted and contributing no blocks.
    assert "23,296 = 1,456 blocks × 16" in text and "22.75x" in text
    assert "num_cpu_blocks=0" in text and "swap_space=1.0" in text


def test_cache_config_info_absent_is_none():
    assert vllm.cache_config_info("# HELP x y\n# TYPE x gauge\nx 1\n") is None


def test_command_passes_the_seed_knobs_and_swap_only_when_supported(tmp_path):
    cmd = vllm.command(Path("/v/bin/python"), tmp_path, KNOBS, "127.0.0.1", 8123, swap_used=False)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    for piece in (
        "--dtype float32",
        "--max-model-len 1024",
        "--max-num-seqs 8",
        "--host 127.0.0.1",
        "--port 8123",
        "--served-model-name HuggingFaceTB/SmolLM2-135M-Instruct",
    ):
        assert piece in joined
    assert "--swap-space" not in cmd
    # Each request's cached prompt tokens in its usage; prefix caching on unless VLLM_PREFIX_CACHING=0.
    assert "--enable-prompt-tokens-details" in cmd and "--enable-prefix-caching" in cmd
    off = vllm.command(Path("/v/bin/python"), tmp_path, {**KNOBS, "VLLM_PREFIX_CACHING": "0"}, "127.0.0.1", 1, False)
    assert "--no-enable-prefix-caching" in off and "--enable-prefix-caching" not in off
    with_swap = vllm.command(Path("/v/bin/python"), tmp_path, KNOBS, "127.0.0.1", 8123, swap_used=True)
    assert with_swap[-2:] == ["--swap-space", "1"]
    assert vllm.environment(KNOBS)["VLLM_CPU_KVCACHE_SPACE"] == "1"


def fake_vllm(tmp_path: Path, arg_utils: str) -> Path:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "vllm"
    (site / "engine").mkdir(parents=True)
    (site / "config").mkdir()
    (site / "engine" / "arg_utils.py").write_text(arg_utils)
    (site / "config" / "cache.py").write_text("block_size: int = 16\n")
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    return python


def test_swap_space_detection_reads_the_installed_sources(tmp_path):
    assert vllm.swap_space_supported(fake_vllm(tmp_path / "old", "swap_space: float = CacheConfig.swap_space\n"))
    assert not vllm.swap_space_supported(fake_vllm(tmp_path / "new", "kv_cache_memory: int | None = None\n"))
    assert not vllm.swap_space_supported(tmp_path / "nowhere" / "bin" / "python")


@pytest.mark.parametrize(
    ("wheels", "index", "expected"),
    [
        (["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"], "auto", []),
        ([], "auto", ["--extra-index-url", vllm.TORCH_CPU_INDEX]),
        ([], "", []),
        ([], "https://mirror/whl/cpu", ["--extra-index-url", "https://mirror/whl/cpu"]),
    ],
)
def test_torch_comes_from_a_cpu_wheel(tmp_path, wheels, index, expected):
    for name in wheels:
        (tmp_path / name).write_bytes(b"")
    assert vllm.torch_index_args([str(tmp_path), "file:///nonexistent"], index) == expected


def test_kv_overcommit_lets_more_sequences_in_than_fit_and_says_the_pool_runs_out_first(tmp_path):
    """VLLM_KV_OVERCOMMIT=1: the reference page's inequality is a note, not a refusal (the KV-capacity case is then reachable)."""
    kv = vllm.plan(write_model(tmp_path), {**KNOBS, "VLLM_MAX_NUM_SEQS": "32"}, weights=0, swap_used=False)
    assert vllm.refusal(kv, available_bytes=20 * GIB, overcommit=True) is None
    note = vllm.overcommit_note(kv)
    assert note is not None and "32,768 tokens" in note and "wait on the KV pool" in note
    ok = vllm.plan(write_model(tmp_path), KNOBS, weights=0, swap_used=False)
    assert vllm.overcommit_note(ok) is None
