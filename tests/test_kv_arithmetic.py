"""The seed's section-3 KV arithmetic has one definition, and the exporter, the stack and the report all use it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from servescope import kv_arithmetic
from servescope.knobs import REPO_ROOT


def test_the_seeds_numbers():
    pool = kv_arithmetic.KvPool(block_size=16, blocks=1456)
    assert pool.capacity_tokens == 23_296
    assert pool.max_concurrency(1024) == pytest.approx(22.75)
    assert kv_arithmetic.blocks_for(68, 16) == 5 and kv_arithmetic.blocks_for(64, 16) == 4


def test_cache_config_info_labels_before_and_after_profiling():
    assert kv_arithmetic.pool_from_cache_config({"block_size": "128", "num_gpu_blocks": "182"}) == kv_arithmetic.KvPool(
        128, 182
    )
    assert kv_arithmetic.pool_from_cache_config({"block_size": "16", "num_gpu_blocks": "None"}) is None
    assert kv_arithmetic.pool_from_cache_config({"block_size": "16"}) is None


@pytest.mark.parametrize("path", ["exporter/vllm.py", "stack/vllm.py", "report/verdict.py"])
def test_each_user_imports_the_one_definition(path):
    """No module multiplies blocks by a block size or divides by max-model-len itself."""
    tree = ast.parse(Path(REPO_ROOT / path).read_text())
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and "kv_arithmetic" in node.module
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "servescope"
        for alias in node.names
        if alias.name == "kv_arithmetic"
    }
    assert imported, f"{path} does not import servescope.kv_arithmetic"
    for node in ast.walk(tree):
        if not isinstance(node, ast.BinOp):
            continue
        left, right = ast.unparse(node.left), ast.unparse(node.right)
        if isinstance(node.op, ast.Mult):  # blocks x block size
            assert not ("block" in left and "block" in right), f"{path}: capacity written out: {ast.unparse(node)}"
        if isinstance(node.op, ast.Div | ast.FloorDiv):  # tokens / max-model-len, tokens / block size
            assert "max_model_len" not in right and "max_len" not in right, f"{path}: {ast.unparse(node)}"
            assert "block_size" not in right, f"{path}: blocks per sequence written out: {ast.unparse(node)}"
