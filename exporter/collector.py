"""The base of every engine collector: fetch on scrape, and report failure as engine_up 0 rather than raising."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.upstream import Upstream, UpstreamError
from servescope import series

log = logging.getLogger("exporter")


# What every engine with a /metrics page reports on the neutral series (vLLM, llama.cpp).
ENGINE_FAMILIES: tuple[tuple[str, str], ...] = (
    (series.REQUESTS_RUNNING, "gauge"),
    (series.REQUESTS_WAITING, "gauge"),
    (series.KV_CACHE_USAGE, "gauge"),
    (series.GENERATED_TOKENS, "counter"),
    (series.PROMPT_TOKENS, "counter"),
    (series.PROMPT_CACHED_TOKENS, "counter"),
    (series.ENGINE_INFO, "gauge"),
)


class EngineCollector:
    """A prometheus_client custom collector for ONE engine instance.

    Subclasses implement `scrape(deadline)` (fetch and yield fresh families; raise on anything
    unexpected) and list the names they may produce in `family_names` so that `describe()`
    never touches the network. `collect()` always yields `servescope_engine_up` and
    `servescope_scrape_duration_seconds` for the instance, whatever happened upstream.
    """

    kind = ""  # the `engine` label: vllm, llamacpp, ollama
    family_names: tuple[tuple[str, str], ...] = ()  # (name, type) of what scrape() may yield

    def __init__(
        self,
        name: str,
        upstream: Upstream,
        *,
        timeout: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.name = name
        self.upstream = upstream
        self.timeout = timeout
        self.clock = clock
        self._last_error: str | None = None
        # What an engine states once per start (served model, max-model-len, version): read on the
        # first good scrape, forgotten when the engine fails so a restarted engine is re-read.
        self.cache: dict = {}

    # --- what subclasses provide ---
    def scrape(self, deadline: float) -> Iterable[Metric]:
        raise NotImplementedError

    def always(self) -> Iterable[Metric]:
        """Families that do not depend on the engine answering (e.g. the Ollama proxy's view)."""
        return ()

    # --- prometheus_client's collector protocol ---
    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(series.ENGINE_UP, "")
        yield GaugeMetricFamily(series.SCRAPE_DURATION, "")
        for name, typ in self.family_names:
            yield Metric(name.removesuffix("_total") if typ == "counter" else name, "", typ)

    def collect(self) -> Iterator[Metric]:
        started = self.clock()
        try:
            # Materialised inside the try: a parser failing halfway yields nothing half-done.
            families = list(self.scrape(started + self.timeout))
            up = 1.0
            self._recovered()
        except UpstreamError as exc:
            families, up = [], 0.0
            self._failed(str(exc))
        except Exception as exc:  # noqa: BLE001 -- any surprise in a payload is "engine unreadable", never a crash
            families, up = [], 0.0
            self._failed(f"malformed response from {self.upstream.base_url}: {type(exc).__name__}: {exc}")
        labels = [self.kind, self.name]
        up_family = GaugeMetricFamily(
            series.ENGINE_UP,
            "1 when the exporter read the engine's endpoints in this scrape, else 0.",
            labels=list(series.ENGINE_LABELS),
        )
        up_family.add_metric(labels, up)
        yield up_family
        duration = GaugeMetricFamily(
            series.SCRAPE_DURATION,
            "Seconds the exporter spent reading this engine instance in this scrape.",
            labels=list(series.ENGINE_LABELS),
        )
        duration.add_metric(labels, self.clock() - started)
        yield duration
        yield from families
        yield from self.always()

    # --- one log line per failure, not one per scrape ---
    def _failed(self, reason: str) -> None:
        self.cache.clear()
        if reason != self._last_error:
            log.warning("%s %s down: %s", self.kind, self.name, reason)
        self._last_error = reason

    def _recovered(self) -> None:
        if self._last_error is not None:
            log.info("%s %s up again", self.kind, self.name)
        self._last_error = None

    # --- shared by subclasses ---
    def gauge(self, name: str, documentation: str, extra_labels: Iterable[str] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, documentation, labels=[*series.ENGINE_LABELS, *extra_labels])

    def labels(self, *extra: str) -> list[str]:
        return [self.kind, self.name, *extra]


# One HELP per engine-neutral family: families from every engine are merged under one name,
# so the text names each engine's source.
HELP = {
    series.REQUESTS_RUNNING: (
        "Requests in the running batch. vLLM: vllm:num_requests_running (summed over data-parallel engines); "
        "llama.cpp: llamacpp:requests_processing (busy slots); Ollama: min(in flight through the proxy, OLLAMA_NUM_PARALLEL)."
    ),
    series.REQUESTS_WAITING: (
        "Requests queued, not yet scheduled. vLLM: vllm:num_requests_waiting; llama.cpp: llamacpp:requests_deferred; "
        "Ollama: in flight through the proxy beyond OLLAMA_NUM_PARALLEL (Ollama queues them unseen)."
    ),
    series.KV_CACHE_USAGE: (
        "Fraction 0..1 of the KV cache in use. vLLM: vllm:kv_cache_usage_perc, else the older vllm:gpu_cache_usage_perc "
        "(never both); llama.cpp: tokens held in slots / total n_ctx of all slots, from GET /slots. Ollama exposes none."
    ),
    series.GENERATED_TOKENS: (
        "Generated (output) tokens. vLLM: vllm:generation_tokens_total; llama.cpp: llamacpp:tokens_predicted_total; "
        "Ollama: eval_count / usage.completion_tokens of responses seen by the proxy."
    ),
    series.PROMPT_TOKENS: (
        "Prompt tokens of the requests, computed or taken from a cache. vLLM: vllm:prompt_tokens_total; "
        "llama.cpp: llamacpp:prompt_tokens_total (the tokens it computed) + llamacpp:prompt_tokens_cached_total "
        "where the build has it; Ollama: prompt_eval_count / usage.prompt_tokens of responses seen by the proxy."
    ),
    series.PROMPT_CACHED_TOKENS: (
        "Prompt tokens taken from the engine's prefix / prompt cache instead of computed. vLLM: "
        "vllm:prefix_cache_hits_total (0.9.2-0.10: vllm:gpu_prefix_cache_hits_total; it stays 0 while prefix "
        "caching is off); llama.cpp: llamacpp:prompt_tokens_cached_total (builds that have it). Ollama reports none."
    ),
    series.ENGINE_INFO: "Engine version, value 1. vLLM: GET /version; llama.cpp: GET /props build_info; Ollama: GET /api/version.",
    series.KV_BLOCK_SIZE: "Tokens per KV-cache block. vLLM: block_size label of vllm:cache_config_info.",
    series.KV_BLOCKS: (
        "KV-cache blocks. vLLM: num_gpu_blocks label of vllm:cache_config_info (on CPU these live in "
        "VLLM_CPU_KVCACHE_SPACE), summed over data-parallel engines."
    ),
    series.KV_CAPACITY_TOKENS: (
        "Tokens the KV cache holds. vLLM: num_gpu_blocks x block_size from vllm:cache_config_info; "
        "llama.cpp: sum of n_ctx over the slots in GET /slots."
    ),
    series.KV_MAX_CONCURRENCY: (
        "Requests of the served max-model-len that fit in the KV cache at once. vLLM: capacity tokens / max_model_len "
        "from GET /v1/models (read once per engine start); llama.cpp: the number of slots in GET /slots."
    ),
}
