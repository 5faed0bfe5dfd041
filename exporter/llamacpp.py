"""Collector for llama.cpp's llama-server: /metrics (started with --metrics) and /slots mapped onto servescope's series.

llama.cpp dropped its KV-cache gauges in 2025, so KV usage is worked out from GET /slots:
tokens held by the slots that are processing / the sum of every slot's n_ctx. Exposition
produced for one instance (two slots, one streaming)::

    servescope_engine_up{engine="llamacpp",instance="llamacpp"} 1.0
    servescope_requests_running{engine="llamacpp",instance="llamacpp",model="SmolLM2-135M-Instruct.Q4_1.gguf"} 1.0
    servescope_kv_cache_usage_ratio{engine="llamacpp",instance="llamacpp",model="SmolLM2-135M-Instruct.Q4_1.gguf"} 0.0139
    servescope_kv_cache_capacity_tokens{engine="llamacpp",instance="llamacpp",model="SmolLM2-135M-Instruct.Q4_1.gguf"} 4096.0
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from prometheus_client.core import CounterMetricFamily, Metric

from exporter.collector import ENGINE_FAMILIES, HELP, EngineCollector
from exporter.upstream import MISSING
from exporter.vllm import parse_exposition
from servescope import series
from servescope.engine_identity import gguf_file_name

LLAMACPP_SAMPLES = frozenset(
    (
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:tokens_predicted_total",
        "llamacpp:prompt_tokens_total",
    )
)


class LlamacppCollector(EngineCollector):
    kind = "llamacpp"
    family_names = ENGINE_FAMILIES + (
        (series.KV_CAPACITY_TOKENS, "gauge"),
        (series.KV_MAX_CONCURRENCY, "gauge"),
    )

    def scrape(self, deadline: float) -> Iterator[Metric]:
        # Without --metrics llama-server answers 501 on /metrics, without slots 501 on /slots, and
        # behind --api-key 401 on both: each costs the series it feeds, never the engine.
        page = self.optional(self.upstream.get_text, "/metrics", deadline, "no queue and no token counters")
        samples = parse_exposition(page, LLAMACPP_SAMPLES) if page is not MISSING else {}
        slots = self.optional(self.upstream.get_json, "/slots", deadline, "no KV-cache usage or capacity")
        occupancy = slot_occupancy(slots) if slots is not MISSING else None
        identity = self.identity(deadline)
        model = gguf_file_name(identity.model)

        info = self.gauge(series.ENGINE_INFO, HELP[series.ENGINE_INFO], ["version"])
        info.add_metric(self.labels(identity.version or "unknown"), 1.0)
        yield info

        running = self.gauge(series.REQUESTS_RUNNING, HELP[series.REQUESTS_RUNNING], ["model"])
        if "llamacpp:requests_processing" in samples:
            running.add_metric(self.labels(model), sum(value for _, value in samples["llamacpp:requests_processing"]))
        elif occupancy is not None:
            running.add_metric(self.labels(model), float(occupancy.processing))  # busy slots, as /metrics counts them
        yield running
        waiting = self.gauge(series.REQUESTS_WAITING, HELP[series.REQUESTS_WAITING], ["model"])
        if "llamacpp:requests_deferred" in samples:
            waiting.add_metric(self.labels(model), sum(value for _, value in samples["llamacpp:requests_deferred"]))
        yield waiting

        for name, source in (
            (series.GENERATED_TOKENS, "llamacpp:tokens_predicted_total"),
            (series.PROMPT_TOKENS, "llamacpp:prompt_tokens_total"),
        ):
            family = CounterMetricFamily(name, HELP[name], labels=[*series.ENGINE_LABELS, "model"])
            if source in samples:
                family.add_metric(self.labels(model), sum(value for _, value in samples[source]))
            yield family

        if occupancy is not None:
            for name, value in (
                (series.KV_CACHE_USAGE, occupancy.held / occupancy.capacity if occupancy.capacity else 0.0),
                (series.KV_CAPACITY_TOKENS, float(occupancy.capacity)),
                (series.KV_MAX_CONCURRENCY, float(occupancy.slots)),
            ):
                family = self.gauge(name, HELP[name], ["model"])
                family.add_metric(self.labels(model), value)
                yield family


class Occupancy(NamedTuple):
    held: int  # tokens held by the slots that are processing
    capacity: int  # sum of n_ctx
    slots: int
    processing: int  # slots processing a request


def slot_occupancy(slots: object) -> Occupancy:
    """Tokens held by processing slots, total n_ctx, slots and busy slots from GET /slots.

    Builds differ in what a busy slot reports: older ones `n_past` (tokens in its KV cells),
    newer ones `n_prompt_tokens`, the size of the slot's token cache, which the server extends
    with every sampled token (server-context.cpp: `prompt.tokens.push_back(sampled)`), so it
    already counts the generated tokens. An idle slot's leftover cache is reusable by the next
    request, so it counts as free.
    """
    if not isinstance(slots, list):
        raise ValueError("/slots: expected a list of slots")
    held = capacity = processing = 0
    for slot in slots:
        if not isinstance(slot, dict) or not isinstance(slot.get("n_ctx"), int):
            raise ValueError("/slots: every slot needs an integer n_ctx")
        capacity += slot["n_ctx"]
        if not slot.get("is_processing"):
            continue
        processing += 1
        tokens = slot.get("n_past", slot.get("n_prompt_tokens", 0))
        if not isinstance(tokens, int):
            raise ValueError("/slots: n_past / n_prompt_tokens must be integers")
        held += tokens
    return Occupancy(held, capacity, len(slots), processing)
