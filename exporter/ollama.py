"""Collector for Ollama, which has no /metrics: /api/version, /api/ps and /api/tags on scrape, plus the proxy's counts.

Exposition produced for one instance with one model loaded (running/waiting and tokens only when the
exporter's proxy is in front of this Ollama, and only once it has relayed a request for the model:
they are the proxy's observation, labelled source="proxy", and before that nothing was observed)::

    servescope_engine_info{engine="ollama",instance="ollama",version="0.12.6"} 1.0
    servescope_ollama_model_size_bytes{engine="ollama",instance="ollama",model="smollm2-135m:latest"} 1.3e+08
    servescope_ollama_model_expires_in_seconds{engine="ollama",instance="ollama",model="smollm2-135m:latest"} 287.4
    servescope_ollama_installed_model_info{engine="ollama",family="llama",instance="ollama",model="smollm2-135m:latest",parameter_size="134.52M",quantization_level="Q4_1"} 1.0
    servescope_requests_running{engine="ollama",instance="ollama",model="smollm2-135m:latest",source="proxy"} 1.0
    servescope_requests_waiting{engine="ollama",instance="ollama",model="smollm2-135m:latest",source="proxy"} 2.0
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.bounds import MAX_MODELS, OVERFLOW_MODEL, bounded, count, finite
from exporter.collector import HELP, EngineCollector
from exporter.observations import ProxyObservations, normalise_model
from exporter.upstream import Upstream
from servescope import engines
from servescope.contracts import series
from servescope.host.engine_identity import ollama_models, version_of

OVERFLOW_NOTE = f' Loaded models past the first {MAX_MODELS} by name add up under model="other".'


class OllamaCollector(EngineCollector):
    kind = engines.OLLAMA.name
    family_names = (
        (series.ENGINE_INFO, "gauge"),
        (series.OLLAMA_MODEL_SIZE, "gauge"),
        (series.OLLAMA_MODEL_VRAM, "gauge"),
        (series.OLLAMA_MODEL_CONTEXT, "gauge"),
        (series.OLLAMA_MODEL_EXPIRES, "gauge"),
        (series.OLLAMA_MODEL_INFO, "gauge"),
        (series.REQUESTS_RUNNING, "gauge"),
        (series.REQUESTS_WAITING, "gauge"),
        (series.GENERATED_TOKENS, "counter"),
        (series.PROMPT_TOKENS, "counter"),
        (series.PROXY_IN_FLIGHT, "gauge"),
        (series.PROXY_NUM_PARALLEL, "gauge"),
    )

    def __init__(
        self,
        name: str,
        upstream: Upstream,
        *,
        observations: ProxyObservations | None = None,
        wall_clock: Callable[[], float] = time.time,
        **kwargs,
    ):
        super().__init__(name, upstream, **kwargs)
        self.observations = observations
        self.wall_clock = wall_clock

    def scrape(self, deadline: float) -> Iterator[Metric]:
        version = version_of(self.upstream.get_json("/api/version", deadline), "/api/version")
        loaded = self._entries(self.upstream.get_json("/api/ps", deadline), "/api/ps")
        installed = self._entries(self.upstream.get_json("/api/tags", deadline), "/api/tags")

        info = self.gauge(series.ENGINE_INFO, HELP[series.ENGINE_INFO], ["version"])
        info.add_metric(self.labels(bounded(version)), 1.0)
        yield info

        # Per model label: a name listed twice, or beyond MAX_MODELS, must not give Prometheus one
        # series twice (it would refuse the whole page). Sizes of the models past the cap add up
        # under "other"; their context and expiry, which do not add up, are left out.
        # One set of labels for both lists: a model loaded and installed is one label, and an instance
        # has at most MAX_MODELS model labels from what Ollama lists.
        models = self.model_labels(name for name, _ in (*loaded, *installed))
        per_model: dict[str, dict[str, float]] = {}
        now = self.wall_clock()
        for name, entry in loaded:
            label = models[name]
            values = per_model.setdefault(label, {})
            for key in ("size", "size_vram"):
                if key in entry or key == "size":
                    number = self.valid(entry.get(key), count, f"/api/ps {key}")
                    if number is not None and (label == OVERFLOW_MODEL or key not in values):
                        values[key] = values.get(key, 0.0) + number
            if label == OVERFLOW_MODEL:
                continue
            if "context_length" in entry and "context_length" not in values:  # Ollama 0.9.7+
                number = self.valid(entry["context_length"], count, "/api/ps context_length")
                if number is not None:
                    values["context_length"] = number
            if entry.get("expires_at") and "expires_at" not in values:
                at = self.valid(_timestamp(entry["expires_at"]), finite, "/api/ps expires_at")
                if at is not None:
                    values["expires_at"] = at - now
        for name, key, documentation in (
            (series.OLLAMA_MODEL_SIZE, "size", "Bytes a loaded model occupies, from GET /api/ps size." + OVERFLOW_NOTE),
            (
                series.OLLAMA_MODEL_VRAM,
                "size_vram",
                "Bytes of a loaded model in GPU memory, from GET /api/ps size_vram." + OVERFLOW_NOTE,
            ),
            (
                series.OLLAMA_MODEL_CONTEXT,
                "context_length",
                "Context length a loaded model was loaded with, from GET /api/ps context_length.",
            ),
            (
                series.OLLAMA_MODEL_EXPIRES,
                "expires_at",
                "Seconds until Ollama unloads the model (GET /api/ps expires_at minus now); negative when overdue.",
            ),
        ):
            family = self.gauge(name, documentation, ["model"])
            for label, values in per_model.items():
                if key in values:
                    family.add_metric(self.labels(label), values[key])
            yield family

        tags = self.gauge(
            series.OLLAMA_MODEL_INFO,
            'An installed model (GET /api/tags), value 1, with its details as labels; model="other" counts the '
            f"installed models past the first {MAX_MODELS} by name.",
            ["model", "family", "parameter_size", "quantization_level"],
        )
        seen: set[str] = set()
        overflow = 0
        for name, entry in installed:
            label = models[name]
            if label == OVERFLOW_MODEL:
                overflow += 1
                continue
            if label in seen:
                continue
            seen.add(label)
            details = entry.get("details") if isinstance(entry.get("details"), dict) else {}
            fields = (bounded(details.get(key, "")) for key in ("family", "parameter_size", "quantization_level"))
            tags.add_metric(self.labels(label, *fields), 1.0)
        if overflow:
            tags.add_metric(self.labels(OVERFLOW_MODEL, "", "", ""), float(overflow))
        yield tags

        if self.observations is not None:
            # Requests for a model Ollama lists count under its name even before one has succeeded.
            self.observations.listed(frozenset(models.labels.values()))

    def _entries(self, payload: object, path: str) -> list[tuple[str, dict]]:
        """(normalised name, entry) of each model an Ollama list gives; an entry that is not a named model is
        left out and counted, the rest of the list still counts."""
        entries = ollama_models(payload, path)  # ValueError when the page itself is not a model list
        if isinstance(payload, dict) and len(entries) != len(payload["models"]):
            for _ in range(len(payload["models"]) - len(entries)):
                self.reject("not an object", f"{path} model entry")
        named = []
        for entry in entries:
            name = normalise_model(entry.get("name") or entry.get("model"))
            if name:
                named.append((name, entry))
            else:
                self.reject(entry.get("name"), f"{path} model name")
        return named

    def always(self) -> Iterator[Metric]:
        """The proxy's view: reported even while Ollama's API is down (in-flight requests still exist).

        Running and waiting are what the proxy saw of the requests it relayed (source="proxy"), per model it
        relayed a request for; a model nothing was relayed for has no series: not observed, which is not 0.
        """
        if self.observations is None:
            return
        snapshot = self.observations.snapshot()
        observed = [series.SOURCE]
        families = [
            self.gauge(series.REQUESTS_RUNNING, HELP[series.REQUESTS_RUNNING], ["model", *observed]),
            self.gauge(series.REQUESTS_WAITING, HELP[series.REQUESTS_WAITING], ["model", *observed]),
            CounterMetricFamily(
                series.PROMPT_TOKENS, HELP[series.PROMPT_TOKENS], labels=[*series.ENGINE_LABELS, "model"]
            ),
            CounterMetricFamily(
                series.GENERATED_TOKENS, HELP[series.GENERATED_TOKENS], labels=[*series.ENGINE_LABELS, "model"]
            ),
        ]
        gauges, counters = families[:2], families[2:]
        for model, values in sorted(snapshot.items()):
            for family, value in zip(gauges, values[:2], strict=True):
                family.add_metric(self.labels(model, series.PROXY_SOURCE), float(value))
            for family, value in zip(counters, values[2:], strict=True):
                family.add_metric(self.labels(model), float(value))
        yield from families
        in_flight = GaugeMetricFamily(
            series.PROXY_IN_FLIGHT,
            "Generation requests inside the exporter's Ollama proxy right now (its running + waiting, every model).",
            labels=list(series.ENGINE_LABELS),
        )
        in_flight.add_metric(self.labels(), float(self.observations.in_flight()))
        yield in_flight
        parallel = GaugeMetricFamily(
            series.PROXY_NUM_PARALLEL,
            "OLLAMA_NUM_PARALLEL as configured for the exporter (--ollama-num-parallel): requests Ollama is said to "
            "run at once per model. Configured, not observed: Ollama reports no such value, and running / waiting "
            "are never derived from it.",
            labels=list(series.ENGINE_LABELS),
        )
        parallel.add_metric(self.labels(), float(self.observations.num_parallel))
        yield parallel


def _timestamp(text: object) -> float | None:
    """Unix seconds of Ollama's RFC 3339 time (Go prints up to 9 fractional digits; 3.11's fromisoformat takes
    them); None when it is not one."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):
        return None
