"""Collector for vLLM: its /metrics text (either KV-usage metric generation) mapped onto servescope's series.

Exposition produced for one instance (the reference page's image, 0.9.1, idle)::

    servescope_engine_up{engine="vllm",instance="vllm"} 1.0
    servescope_requests_running{engine="vllm",instance="vllm",model="HuggingFaceTB/SmolLM2-135M-Instruct"} 0.0
    servescope_kv_cache_usage_ratio{engine="vllm",instance="vllm",model="HuggingFaceTB/SmolLM2-135M-Instruct"} 0.0
    servescope_kv_cache_blocks{engine="vllm",instance="vllm",model="HuggingFaceTB/SmolLM2-135M-Instruct"} 1456.0
    servescope_kv_cache_capacity_tokens{engine="vllm",instance="vllm",model="HuggingFaceTB/SmolLM2-135M-Instruct"} 23296.0
    servescope_kv_cache_max_concurrency{engine="vllm",instance="vllm",model="HuggingFaceTB/SmolLM2-135M-Instruct"} 22.75
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from prometheus_client.core import Metric

from exporter.bounds import OVERFLOW_MODEL, ModelLabels, count
from exporter.collector import HELP
from exporter.page import PageCollector
from servescope import engines
from servescope.contracts import series
from servescope.engines.base import Identity
from servescope.engines.vllm import CACHE_INFO
from servescope.judgements import kv_arithmetic
from servescope.prometheus.exposition import Samples


class VllmCollector(PageCollector):
    """vLLM's page (servescope/engines/vllm.py), and its KV pool from cache_config_info."""

    adapter = engines.VLLM
    pool_families = (
        (series.KV_BLOCK_SIZE, "gauge"),
        (series.KV_BLOCKS, "gauge"),
        (series.KV_CAPACITY_TOKENS, "gauge"),
        (series.KV_MAX_CONCURRENCY, "gauge"),
    )

    def pool(
        self, samples: Samples, identity: Identity, on_page: set[str], models: ModelLabels, extra: object
    ) -> Iterator[Metric]:
        """The reference page's section-3 arithmetic from cache_config_info: blocks x block size, / max-model-len."""
        served = identity.models
        block_size: dict[str, float] = {}
        blocks: dict[str, float] = defaultdict(float)
        # cache_config_info carries no model_name in most versions: one served model owns the pool. When
        # /v1/models cannot be read (vLLM behind --api-key without the key), the page's one model does.
        owners = list(served) or sorted(on_page)
        owner = owners[0] if len(owners) == 1 else ""
        for labels, _ in samples.get(CACHE_INFO, ()):
            pool = kv_arithmetic.pool_from_cache_config(labels)
            if pool is None:
                continue  # "None" before the engine has profiled its memory
            size = self.valid(pool.block_size, count, "cache_config_info block_size")
            number = self.valid(pool.blocks, count, "cache_config_info num_gpu_blocks")
            if not size or number is None:
                continue  # a pool of no or impossible size
            model = models[labels.get("model_name") or owner]
            block_size[model] = size
            blocks[model] += number
        if not block_size:
            return
        lengths = {models[model]: length for model, length in served.items() if models[model] != OVERFLOW_MODEL}
        families = {
            name: self.gauge(name, HELP[name], ["model"])
            for name in (series.KV_BLOCK_SIZE, series.KV_BLOCKS, series.KV_CAPACITY_TOKENS, series.KV_MAX_CONCURRENCY)
        }
        for model, size in block_size.items():
            capacity = kv_arithmetic.capacity_tokens(blocks[model], size)
            families[series.KV_BLOCK_SIZE].add_metric(self.labels(model), size)
            families[series.KV_BLOCKS].add_metric(self.labels(model), blocks[model])
            families[series.KV_CAPACITY_TOKENS].add_metric(self.labels(model), capacity)
            max_model_len = lengths.get(model)
            if max_model_len:
                families[series.KV_MAX_CONCURRENCY].add_metric(
                    self.labels(model), kv_arithmetic.max_concurrency(capacity, max_model_len)
                )
        yield from families.values()
