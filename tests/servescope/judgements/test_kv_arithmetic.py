"""The reference page's section-3 KV arithmetic has one definition, and the exporter, the stack and the report all use it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from servescope.contracts.knobs import REPO_ROOT
from servescope.judgements import kv_arithmetic


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


@pytest.mark.parametrize("path", ["exporter/vllm.py", "servescope/stack/vllm.py", "servescope/report/verdict.py"])
def test_each_user_imports_the_one_definition(path):
    """No module multiplies blocks by a block size or divides by max-model-len itself (the formula spelled out with
    these names; test_each_user_reports_what_the_one_definition_computes catches any other spelling)."""
    tree = ast.parse(Path(REPO_ROOT / path).read_text())
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and "kv_arithmetic" in node.module
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "servescope.judgements"
        for alias in node.names
        if alias.name == "kv_arithmetic"
    }
    assert imported, f"{path} does not import servescope.judgements.kv_arithmetic"
    for node in ast.walk(tree):
        if not isinstance(node, ast.BinOp):
            continue
        left, right = ast.unparse(node.left), ast.unparse(node.right)
        if isinstance(node.op, ast.Mult):  # blocks x block size
            assert not ("block" in left and "block" in right), f"{path}: capacity written out: {ast.unparse(node)}"
        if isinstance(node.op, ast.Div | ast.FloorDiv):  # tokens / max-model-len, tokens / block size
            assert "max_model_len" not in right and "max_len" not in right, f"{path}: {ast.unparse(node)}"
            assert "block_size" not in right, f"{path}: blocks per sequence written out: {ast.unparse(node)}"


SENTINEL_TOKENS, SENTINEL_CONCURRENCY = 12_345.0, 6.5
KNOBS = {"VLLM_MAX_MODEL_LEN": "1024", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_MAX_NUM_SEQS": "8"}


@pytest.fixture
def rigged(monkeypatch):
    """kv_arithmetic answering numbers no engine page implies: a user that computes them itself shows the real ones."""
    fakes = {
        "capacity_tokens": lambda blocks, block_size: SENTINEL_TOKENS,
        "max_concurrency": lambda capacity, max_model_len: SENTINEL_CONCURRENCY,
    }
    modules = [
        importlib.import_module(m) for m in ("exporter.vllm", "servescope.stack.vllm", "servescope.report.verdict")
    ]
    for name, fake in fakes.items():
        original = getattr(kv_arithmetic, name)
        monkeypatch.setattr(kv_arithmetic, name, fake)
        for module in modules:  # `from servescope.judgements.kv_arithmetic import capacity_tokens` binds its own name
            for attr, value in list(vars(module).items()):
                if value is original:
                    monkeypatch.setattr(module, attr, fake)


def test_each_user_reports_what_the_one_definition_computes(rigged):
    from prometheus_client import CollectorRegistry

    from exporter.upstream import Upstream
    from exporter.vllm import VllmCollector
    from servescope.contracts import series
    from servescope.report.gauges import EngineGauges, GaugeReport
    from servescope.report.load import EngineInfo
    from servescope.report.verdict import kv_arithmetic as report_kv
    from servescope.stack import vllm as stack_vllm
    from tests.doubles.recorded_engine import vllm_engine

    with vllm_engine("vllm-0.9.1-cpu-metrics.txt", max_model_len=1024) as engine:
        registry = CollectorRegistry()
        registry.register(VllmCollector("vllm", Upstream(engine.url)))
        model = {"engine": "vllm", "instance": "vllm", "model": "HuggingFaceTB/SmolLM2-135M-Instruct"}
        assert registry.get_sample_value(series.KV_CAPACITY_TOKENS, model) == SENTINEL_TOKENS
        assert registry.get_sample_value(series.KV_MAX_CONCURRENCY, model) == SENTINEL_CONCURRENCY

    info = {"block_size": "16", "num_gpu_blocks": "1456"}
    text = "\n".join(stack_vllm.kv_sizing_lines(info, KNOBS, swap_used=False))
    assert "12,345 = 1,456 blocks" in text and "6.50x" in text, text

    run = SimpleNamespace(
        engines={"vllm": EngineInfo("vllm", "vllm", flags={"max-model-len": 1024})},
        phases_of=lambda instance: [],
        requests_of=lambda instance: [],
    )
    gauges = GaugeReport(True, "", "", engines={"vllm": EngineGauges("vllm", "vllm")})
    gauges.engines["vllm"].kv = {series.KV_BLOCK_SIZE: 16.0, series.KV_BLOCKS: 1456.0}
    (numbers,) = report_kv(run, gauges)
    assert numbers.capacity_from_blocks == SENTINEL_TOKENS
    assert numbers.max_concurrency_computed == SENTINEL_CONCURRENCY
