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

from prometheus_client.core import Metric

from exporter.bounds import ModelLabels, bounded
from exporter.collector import HELP
from exporter.page import PageCollector
from exporter.upstream import MISSING
from servescope import engines
from servescope.contracts import series
from servescope.engines.base import Identity
from servescope.prometheus.exposition import Samples


class LlamacppCollector(PageCollector):
    """llama-server's page (servescope/engines/llamacpp.py), and its KV pool from GET /slots."""

    adapter = engines.LLAMACPP
    pool_families = (
        (series.KV_CAPACITY_TOKENS, "gauge"),
        (series.KV_MAX_CONCURRENCY, "gauge"),
    )

    def before(self, deadline: float) -> Occupancy | None:
        # Without --slots llama-server answers 501 on /slots, and behind --api-key 401: that costs the KV series only.
        slots = self.optional(self.upstream.get_json, "/slots", deadline, "no KV-cache usage or capacity")
        return self._occupancy(slots) if slots is not MISSING else None

    def fallback(self, name: str, occupancy: Occupancy | None) -> float | None:
        if name == series.REQUESTS_RUNNING and occupancy is not None:
            return float(occupancy.processing)  # busy slots, as /metrics counts them
        return None

    def pool(
        self, samples: Samples, identity: Identity, on_page: set[str], models: ModelLabels, occupancy: Occupancy | None
    ) -> Iterator[Metric]:
        if occupancy is None:
            return
        model = bounded(self.adapter.model_name(identity.model))
        for name, value in (
            (series.KV_CACHE_USAGE, occupancy.held / occupancy.capacity if occupancy.capacity else 0.0),
            (series.KV_CAPACITY_TOKENS, float(occupancy.capacity)),
            (series.KV_MAX_CONCURRENCY, float(occupancy.slots)),
        ):
            family = self.gauge(name, HELP[name], ["model"])
            family.add_metric(self.labels(model), value)
            yield family

    def _occupancy(self, slots: object) -> Occupancy | None:
        """slot_occupancy() with its impossible values counted; a /slots that is not a list of slots costs the
        KV series only."""
        try:
            occupancy = slot_occupancy(slots)
        except ValueError as exc:
            self.reject(slots, f"/slots ({exc})")
            return None
        for what, value in occupancy.invalid:
            self.reject(value, what)
        return occupancy


class Occupancy(NamedTuple):
    held: int  # tokens held by the slots that are processing
    capacity: int  # sum of n_ctx
    slots: int
    processing: int  # slots processing a request
    invalid: tuple[tuple[str, object], ...] = ()  # (what, value) of each impossible value left out


def slot_occupancy(slots: object) -> Occupancy:
    """Tokens held by processing slots, total n_ctx, slots and busy slots from GET /slots.

    Builds differ in what a busy slot reports: older ones `n_past` (tokens in its KV cells),
    newer ones `n_prompt_tokens`, the size of the slot's token cache, which the server extends
    with every sampled token (server-context.cpp: `prompt.tokens.push_back(sampled)`), so it
    already counts the generated tokens. An idle slot's leftover cache is reusable by the next
    request, so it counts as free. A slot without a positive integer n_ctx is left out; tokens that
    are not a count are left out, past n_ctx they count as n_ctx (a slot cannot hold more).
    """
    if not isinstance(slots, list):
        raise ValueError("expected a list of slots")
    held = capacity = counted = processing = 0
    invalid: list[tuple[str, object]] = []
    for slot in slots:
        n_ctx = slot.get("n_ctx") if isinstance(slot, dict) else None
        if not _whole(n_ctx) or n_ctx <= 0:
            invalid.append(("/slots n_ctx", n_ctx))
            continue
        counted += 1
        capacity += n_ctx
        if not slot.get("is_processing"):
            continue
        processing += 1
        tokens = slot.get("n_past", slot.get("n_prompt_tokens", 0))
        if not _whole(tokens) or tokens < 0:
            invalid.append(("/slots n_past / n_prompt_tokens", tokens))
            continue
        if tokens > n_ctx:
            invalid.append(("/slots tokens past n_ctx", tokens))
            tokens = n_ctx
        held += tokens
    return Occupancy(held, capacity, counted, processing, tuple(invalid))


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
