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
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from exporter.collector import ENGINE_FAMILIES, HELP, EngineCollector
from servescope import kv_arithmetic, series
from servescope.exposition import Samples, parse_exposition

# vLLM renamed its KV gauge in 0.9.2 and kept both until 0.11: read the new one when present.
KV_USAGE_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
# Prefix-cache hits in tokens, the same rename (0.9.2-0.10 has both; 0.9.1's V0 engine only a block hit-rate gauge).
PREFIX_HIT_NAMES = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")

# The only sample names read from vLLM's page (about 600 lines in 0.32: parsing all of it costs
# tens of milliseconds, parsing these few lines well under one).
VLLM_SAMPLES = frozenset(
    (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        *KV_USAGE_NAMES,
        *PREFIX_HIT_NAMES,
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        "vllm:cache_config_info",
    )
)


def by_model(samples: Samples, name: str, *, mean: bool = False) -> dict[str, float]:
    """Values of one sample name per model_name, summed (or averaged) over vLLM's other labels.

    The other labels are vLLM's `engine` (data-parallel rank): counts add up across ranks,
    a usage ratio of equally sized pools averages.
    """
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for labels, value in samples.get(name, ()):
        model = labels.get("model_name", "")
        totals[model] += value
        counts[model] += 1
    if mean:
        return {model: totals[model] / counts[model] for model in totals}
    return dict(totals)


class VllmCollector(EngineCollector):
    kind = "vllm"
    family_names = ENGINE_FAMILIES + (
        (series.KV_BLOCK_SIZE, "gauge"),
        (series.KV_BLOCKS, "gauge"),
        (series.KV_CAPACITY_TOKENS, "gauge"),
        (series.KV_MAX_CONCURRENCY, "gauge"),
    )

    def scrape(self, deadline: float) -> Iterator[Metric]:
        samples = parse_exposition(self.upstream.get_text("/metrics", deadline), VLLM_SAMPLES)
        if "served" not in self.cache:
            self.cache["served"] = served_models(self.upstream.get_json("/v1/models", deadline))
            version = self.upstream.get_json("/version", deadline, missing_ok=True)
            self.cache["version"] = str(version.get("version", "unknown")) if isinstance(version, dict) else "unknown"
        served: dict[str, int | None] = self.cache["served"]

        info = self.gauge(series.ENGINE_INFO, HELP[series.ENGINE_INFO], ["version"])
        info.add_metric(self.labels(self.cache["version"]), 1.0)
        yield info

        for name, source in (
            (series.REQUESTS_RUNNING, "vllm:num_requests_running"),
            (series.REQUESTS_WAITING, "vllm:num_requests_waiting"),
        ):
            family = self.gauge(name, HELP[name], ["model"])
            for model, value in by_model(samples, source).items():
                family.add_metric(self.labels(model), value)
            yield family

        kv_source = next((name for name in KV_USAGE_NAMES if samples.get(name)), None)
        if kv_source is not None:
            family = self.gauge(series.KV_CACHE_USAGE, HELP[series.KV_CACHE_USAGE], ["model"])
            for model, value in by_model(samples, kv_source, mean=True).items():
                family.add_metric(self.labels(model), value)
            yield family

        hits_source = next((name for name in PREFIX_HIT_NAMES if samples.get(name)), PREFIX_HIT_NAMES[0])
        for name, source in (
            (series.GENERATED_TOKENS, "vllm:generation_tokens_total"),
            (series.PROMPT_TOKENS, "vllm:prompt_tokens_total"),
            (series.PROMPT_CACHED_TOKENS, hits_source),
        ):
            family = CounterMetricFamily(name, HELP[name], labels=[*series.ENGINE_LABELS, "model"])
            for model, value in by_model(samples, source).items():
                family.add_metric(self.labels(model), value)
            yield family

        yield from self._capacity(samples, served)

    def _capacity(self, samples: Samples, served: dict[str, int | None]) -> Iterator[Metric]:
        """The seed's section-3 arithmetic from vllm:cache_config_info: blocks x block size, / max-model-len."""
        block_size: dict[str, float] = {}
        blocks: dict[str, float] = defaultdict(float)
        for labels, _ in samples.get("vllm:cache_config_info", ()):
            pool = kv_arithmetic.pool_from_cache_config(labels)
            if pool is None:
                continue  # "None" before the engine has profiled its memory
            # cache_config_info carries no model_name in most versions: one served model owns the pool.
            model = labels.get("model_name") or (next(iter(served)) if len(served) == 1 else "")
            block_size[model] = pool.block_size
            blocks[model] += pool.blocks
        if not block_size:
            return
        families = {
            name: self.gauge(name, HELP[name], ["model"])
            for name in (series.KV_BLOCK_SIZE, series.KV_BLOCKS, series.KV_CAPACITY_TOKENS, series.KV_MAX_CONCURRENCY)
        }
        for model, size in block_size.items():
            capacity = kv_arithmetic.capacity_tokens(blocks[model], size)
            families[series.KV_BLOCK_SIZE].add_metric(self.labels(model), size)
            families[series.KV_BLOCKS].add_metric(self.labels(model), blocks[model])
            families[series.KV_CAPACITY_TOKENS].add_metric(self.labels(model), capacity)
            max_model_len = served.get(model)
            if max_model_len:
                families[series.KV_MAX_CONCURRENCY].add_metric(
                    self.labels(model), kv_arithmetic.max_concurrency(capacity, max_model_len)
                )
        yield from families.values()


def served_models(payload: object) -> dict[str, int | None]:
    """Model id -> max_model_len from vLLM's GET /v1/models (an OpenAI model list plus max_model_len)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        raise ValueError("/v1/models: expected an object with a 'data' list")
    served: dict[str, int | None] = {}
    for entry in payload["data"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise ValueError("/v1/models: every entry needs a string 'id'")
        length = entry.get("max_model_len")
        served[entry["id"]] = int(length) if isinstance(length, int | float) and length > 0 else None
    return served
