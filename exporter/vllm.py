"""Collector for vLLM: its /metrics text (either KV-usage metric generation) mapped onto servescope's series.

Exposition produced for one instance (the seed's image, 0.9.1, idle)::

    servescope_engine_up{engine="vllm",instance="vllm"} 1.0
    servescope_requests_running{engine="vllm",instance="vllm",model="HuggingFaceTB/SmolLM2-135M-Instruct"} 0.0
    servescope_kv_cache_usage_ratio{engine="vllm",instance="vllm",model="HuggingFaceTB/SmolLM2-135M-Instruct"} 0.0
    servescope_kv_cache_blocks{engine="vllm",instance="vllm",model="HuggingFaceTB/SmolLM2-135M-Instruct"} 1456.0
    servescope_kv_cache_capacity_tokens{engine="vllm",instance="vllm",model="HuggingFaceTB/SmolLM2-135M-Instruct"} 23296.0
    servescope_kv_cache_max_concurrency{engine="vllm",instance="vllm",model="HuggingFaceTB/SmolLM2-135M-Instruct"} 22.75
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from exporter.bounds import OVERFLOW_MODEL, ModelLabels, bounded, count, ratio
from exporter.collector import ENGINE_FAMILIES, HELP, EngineCollector
from servescope import kv_arithmetic, series
from servescope.exposition import Samples, parse_exposition

# vLLM renamed its KV gauge in 0.9.2 and kept both until 0.11: read the new one when present.
KV_USAGE_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
# Prefix-cache hits in tokens, the same rename (0.9.2-0.10 has both; 0.9.1's V0 engine only a block hit-rate gauge).
PREFIX_HIT_NAMES = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")

# The only sample names read from vLLM's page.
CACHE_INFO = "vllm:cache_config_info"
VLLM_SAMPLES = frozenset(
    (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        *KV_USAGE_NAMES,
        *PREFIX_HIT_NAMES,
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        "vllm:num_preemptions_total",
        CACHE_INFO,
    )
)


class VllmCollector(EngineCollector):
    kind = "vllm"
    family_names = ENGINE_FAMILIES + (
        (series.PREEMPTIONS, "counter"),
        (series.KV_BLOCK_SIZE, "gauge"),
        (series.KV_BLOCKS, "gauge"),
        (series.KV_CAPACITY_TOKENS, "gauge"),
        (series.KV_MAX_CONCURRENCY, "gauge"),
    )

    def scrape(self, deadline: float) -> Iterator[Metric]:
        # vLLM's --api-key guards /v1/* only: its /metrics page is read without a key.
        samples = parse_exposition(self.upstream.get_text("/metrics", deadline), VLLM_SAMPLES)
        identity = self.identity(deadline)
        on_page = {
            labels.get("model_name", "") for name in VLLM_SAMPLES - {CACHE_INFO} for labels, _ in samples.get(name, ())
        }
        models = self.model_labels([*identity.models, *on_page])
        info = self.gauge(series.ENGINE_INFO, HELP[series.ENGINE_INFO], ["version"])
        info.add_metric(self.labels(bounded(identity.version or "unknown")), 1.0)
        yield info

        for name, source, check, mean in (
            (series.REQUESTS_RUNNING, "vllm:num_requests_running", count, False),
            (series.REQUESTS_WAITING, "vllm:num_requests_waiting", count, False),
            # a usage ratio of data-parallel ranks' equally sized pools averages; the counts add up
            (series.KV_CACHE_USAGE, next((n for n in KV_USAGE_NAMES if samples.get(n)), None), ratio, True),
        ):
            if source is None:
                continue  # a page without either KV gauge
            family = self.gauge(name, HELP[name], ["model"])
            for model, value in self.by_model(samples, source, check, models, mean=mean).items():
                family.add_metric(self.labels(model), value)
            yield family

        hits_source = next((name for name in PREFIX_HIT_NAMES if samples.get(name)), PREFIX_HIT_NAMES[0])
        for name, source in (
            (series.GENERATED_TOKENS, "vllm:generation_tokens_total"),
            (series.PROMPT_TOKENS, "vllm:prompt_tokens_total"),
            (series.PROMPT_CACHED_TOKENS, hits_source),
            (series.PREEMPTIONS, "vllm:num_preemptions_total"),
        ):
            if name == series.PREEMPTIONS and not samples.get(source):
                continue  # a build without the counter: no series rather than a made-up 0
            family = CounterMetricFamily(name, HELP[name], labels=[*series.ENGINE_LABELS, "model"])
            for model, value in self.by_model(samples, source, count, models).items():
                family.add_metric(self.labels(model), value)
            yield family

        yield from self._capacity(samples, identity.models, on_page, models)

    def by_model(
        self, samples: Samples, name: str, check: Callable, models: ModelLabels, *, mean: bool = False
    ) -> dict[str, float]:
        """Values of one sample name per model label, summed (or averaged) over vLLM's other labels (its
        data-parallel `engine` rank); impossible values are dropped and counted."""
        totals: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        for labels, value in samples.get(name, ()):
            number = self.valid(value, check, name)
            if number is not None:
                model = models[labels.get("model_name", "")]
                totals[model] += number
                counts[model] += 1
        if mean:
            return {model: totals[model] / counts[model] for model in totals}
        return dict(totals)

    def _capacity(
        self, samples: Samples, served: dict[str, int | None], on_page: set[str], models: ModelLabels
    ) -> Iterator[Metric]:
        """The seed's section-3 arithmetic from vllm:cache_config_info: blocks x block size, / max-model-len."""
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
