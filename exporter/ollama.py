"""Collector for Ollama, which has no /metrics: /api/version, /api/ps and /api/tags on scrape, plus the proxy's counts.

Exposition produced for one instance with one model loaded (running/waiting and tokens only
when the exporter's proxy is in front of this Ollama)::

    servescope_engine_info{engine="ollama",instance="ollama",version="0.12.6"} 1.0
    servescope_ollama_model_size_bytes{engine="ollama",instance="ollama",model="smollm2-135m:latest"} 1.3e+08
    servescope_ollama_model_expires_in_seconds{engine="ollama",instance="ollama",model="smollm2-135m:latest"} 287.4
    servescope_ollama_installed_model_info{engine="ollama",family="llama",instance="ollama",model="smollm2-135m:latest",parameter_size="134.52M",quantization_level="Q4_1"} 1.0
    servescope_requests_running{engine="ollama",instance="ollama",model="smollm2-135m:latest"} 1.0
    servescope_requests_waiting{engine="ollama",instance="ollama",model="smollm2-135m:latest"} 2.0
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.collector import HELP, EngineCollector
from exporter.observations import ProxyObservations, normalise_model
from exporter.upstream import Upstream
from servescope import series


class OllamaCollector(EngineCollector):
    kind = "ollama"
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
        self._loaded_names = []

    def scrape(self, deadline: float) -> Iterator[Metric]:
        self._loaded_names: list[str] = []
        version = self.upstream.get_json("/api/version", deadline)
        loaded = _models(self.upstream.get_json("/api/ps", deadline), "/api/ps")
        installed = _models(self.upstream.get_json("/api/tags", deadline), "/api/tags")

        info = self.gauge(series.ENGINE_INFO, HELP[series.ENGINE_INFO], ["version"])
        if not isinstance(version, dict) or not isinstance(version.get("version"), str):
            raise ValueError('/api/version: expected {"version": "x.y.z"}')
        info.add_metric(self.labels(version["version"]), 1.0)
        yield info

        size = self.gauge(series.OLLAMA_MODEL_SIZE, "Bytes a loaded model occupies, from GET /api/ps size.", ["model"])
        vram = self.gauge(
            series.OLLAMA_MODEL_VRAM, "Bytes of a loaded model in GPU memory, from GET /api/ps size_vram.", ["model"]
        )
        context = self.gauge(
            series.OLLAMA_MODEL_CONTEXT,
            "Context length a loaded model was loaded with, from GET /api/ps context_length.",
            ["model"],
        )
        expires = self.gauge(
            series.OLLAMA_MODEL_EXPIRES,
            "Seconds until Ollama unloads the model (GET /api/ps expires_at minus now); negative when overdue.",
            ["model"],
        )
        now = self.wall_clock()
        for model in loaded:
            name = normalise_model(model.get("name") or model.get("model"))
            labels = self.labels(name)
            size.add_metric(labels, _number(model, "size"))
            if "size_vram" in model:
                vram.add_metric(labels, _number(model, "size_vram"))
            if "context_length" in model:  # Ollama 0.9.7+
                context.add_metric(labels, _number(model, "context_length"))
            if model.get("expires_at"):
                expires.add_metric(labels, _timestamp(model["expires_at"]) - now)
        yield from (size, vram, context, expires)

        tags = self.gauge(
            series.OLLAMA_MODEL_INFO,
            "An installed model (GET /api/tags), value 1, with its details as labels.",
            ["model", "family", "parameter_size", "quantization_level"],
        )
        for model in installed:
            details = model.get("details") if isinstance(model.get("details"), dict) else {}
            tags.add_metric(
                self.labels(
                    normalise_model(model.get("name") or model.get("model")),
                    str(details.get("family", "")),
                    str(details.get("parameter_size", "")),
                    str(details.get("quantization_level", "")),
                ),
                1.0,
            )
        yield tags

        if self.observations is not None:
            # Loaded models report zero before any request has gone through the proxy.
            self._loaded_names = [normalise_model(m.get("name") or m.get("model")) for m in loaded]

    def always(self) -> Iterator[Metric]:
        """The proxy's view: reported even while Ollama's API is down (in-flight requests still exist)."""
        if self.observations is None:
            return
        snapshot = self.observations.snapshot()
        for model in self._loaded_names:
            snapshot.setdefault(model, (0, 0, 0, 0))
        families = [
            self.gauge(series.REQUESTS_RUNNING, HELP[series.REQUESTS_RUNNING], ["model"]),
            self.gauge(series.REQUESTS_WAITING, HELP[series.REQUESTS_WAITING], ["model"]),
            CounterMetricFamily(
                series.PROMPT_TOKENS, HELP[series.PROMPT_TOKENS], labels=[*series.ENGINE_LABELS, "model"]
            ),
            CounterMetricFamily(
                series.GENERATED_TOKENS, HELP[series.GENERATED_TOKENS], labels=[*series.ENGINE_LABELS, "model"]
            ),
        ]
        for model, values in sorted(snapshot.items()):
            for family, value in zip(families, values, strict=True):
                family.add_metric(self.labels(model), float(value))
        yield from families
        in_flight = GaugeMetricFamily(
            series.PROXY_IN_FLIGHT,
            "Requests inside the exporter's Ollama proxy right now (running + waiting).",
            labels=list(series.ENGINE_LABELS),
        )
        in_flight.add_metric(self.labels(), float(self.observations.in_flight()))
        yield in_flight
        parallel = GaugeMetricFamily(
            series.PROXY_NUM_PARALLEL,
            "OLLAMA_NUM_PARALLEL as configured for the proxy: requests Ollama runs at once per model.",
            labels=list(series.ENGINE_LABELS),
        )
        parallel.add_metric(self.labels(), float(self.observations.num_parallel))
        yield parallel


def _models(payload: object, path: str) -> list[dict]:
    if not isinstance(payload, dict) or not isinstance(payload.get("models"), list):
        raise ValueError(f"{path}: expected an object with a 'models' list")
    if not all(isinstance(model, dict) for model in payload["models"]):
        raise ValueError(f"{path}: every model must be an object")
    return payload["models"]


def _number(model: dict, key: str) -> float:
    value = model.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key}: expected a number, got {value!r}")
    return float(value)


def _timestamp(text: object) -> float:
    """Unix seconds of Ollama's RFC 3339 time (Go prints up to 9 fractional digits; 3.11's fromisoformat takes them)."""
    if not isinstance(text, str):
        raise ValueError(f"expires_at: expected a string, got {text!r}")
    return datetime.fromisoformat(text).timestamp()
