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

from prometheus_client.core import CounterMetricFamily, Metric

from exporter.collector import ENGINE_FAMILIES, HELP, EngineCollector
from exporter.upstream import MISSING
from servescope import series
from servescope.exposition import parse_exposition

LLAMACPP_SAMPLES = frozenset(
    (
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:tokens_predicted_total",
        "llamacpp:prompt_tokens_total",
        "llamacpp:prompt_tokens_cached_total",
    )
)


class LlamacppCollector(EngineCollector):
    kind = "llamacpp"
    family_names = ENGINE_FAMILIES + (
        (series.KV_CAPACITY_TOKENS, "gauge"),
        (series.KV_MAX_CONCURRENCY, "gauge"),
    )

    def scrape(self, deadline: float) -> Iterator[Metric]:
        samples = parse_exposition(self.upstream.get_text("/metrics", deadline), LLAMACPP_SAMPLES)
        if "model" not in self.cache:
            self.cache["model"], self.cache["version"] = self._identity(deadline)
        model = self.cache["model"]
        # /slots answers 501 when started with --no-slots (404 on builds without it): KV series are
        # then omitted, the engine is still up.
        slots = self.upstream.get_json("/slots", deadline, missing_ok=True)

        info = self.gauge(series.ENGINE_INFO, HELP[series.ENGINE_INFO], ["version"])
        info.add_metric(self.labels(self.cache["version"]), 1.0)
        yield info

        for name, source in (
            (series.REQUESTS_RUNNING, "llamacpp:requests_processing"),
            (series.REQUESTS_WAITING, "llamacpp:requests_deferred"),
        ):
            family = self.gauge(name, HELP[name], ["model"])
            if source in samples:
                family.add_metric(self.labels(model), sum(value for _, value in samples[source]))
            yield family

        # Its prompt_tokens_total counts only the tokens it computed: the cached ones (builds that count them)
        # are added, so prompt tokens mean the whole prompt here as they do on vLLM.
        totals = {name: sum(value for _, value in samples[name]) for name in LLAMACPP_SAMPLES if name in samples}
        cached = totals.get("llamacpp:prompt_tokens_cached_total")
        prompt = totals.get("llamacpp:prompt_tokens_total")
        for name, value in (
            (series.GENERATED_TOKENS, totals.get("llamacpp:tokens_predicted_total")),
            (series.PROMPT_TOKENS, None if prompt is None else prompt + (cached or 0.0)),
            (series.PROMPT_CACHED_TOKENS, cached),
        ):
            family = CounterMetricFamily(name, HELP[name], labels=[*series.ENGINE_LABELS, "model"])
            if value is not None:
                family.add_metric(self.labels(model), value)
            yield family

        if slots is not MISSING:
            held, capacity, count = slot_occupancy(slots)
            for name, value in (
                (series.KV_CACHE_USAGE, held / capacity if capacity else 0.0),
                (series.KV_CAPACITY_TOKENS, float(capacity)),
                (series.KV_MAX_CONCURRENCY, float(count)),
            ):
                family = self.gauge(name, HELP[name], ["model"])
                family.add_metric(self.labels(model), value)
                yield family

    def _identity(self, deadline: float) -> tuple[str, str]:
        """(model, version): the served model id from /v1/models, else /props' alias or path; build from /props.

        Without --alias llama-server names the model by its file path; the label keeps the file
        name only, so it does not change with where the cache lives.
        """
        props = self.upstream.get_json("/props", deadline, missing_ok=True)
        props = props if isinstance(props, dict) else {}
        version = str(props.get("build_info") or "unknown")
        model = ""
        models = self.upstream.get_json("/v1/models", deadline, missing_ok=True)
        if isinstance(models, dict) and isinstance(models.get("data"), list) and models["data"]:
            first = models["data"][0]
            if isinstance(first, dict) and isinstance(first.get("id"), str):
                model = first["id"]
        model = model or str(props.get("model_alias") or props.get("model_path") or "")
        if model.lower().endswith(".gguf"):
            model = model.replace("\\", "/").rsplit("/", 1)[-1]
        return model, version


def slot_occupancy(slots: object) -> tuple[int, int, int]:
    """(tokens held by processing slots, sum of n_ctx, number of slots) from GET /slots.

    Builds differ in what a busy slot reports: older ones `n_past` (tokens in its KV cells),
    newer ones `n_prompt_tokens`, the size of the slot's token cache, which the server extends
    with every sampled token (server-context.cpp: `prompt.tokens.push_back(sampled)`), so it
    already counts the generated tokens. An idle slot's leftover cache is reusable by the next
    request, so it counts as free.
    """
    if not isinstance(slots, list):
        raise ValueError("/slots: expected a list of slots")
    held = capacity = 0
    for slot in slots:
        if not isinstance(slot, dict) or not isinstance(slot.get("n_ctx"), int):
            raise ValueError("/slots: every slot needs an integer n_ctx")
        capacity += slot["n_ctx"]
        if not slot.get("is_processing"):
            continue
        tokens = slot.get("n_past", slot.get("n_prompt_tokens", 0))
        if not isinstance(tokens, int):
            raise ValueError("/slots: n_past / n_prompt_tokens must be integers")
        held += tokens
    return held, capacity, len(slots)
