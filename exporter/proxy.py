"""The Ollama streaming reverse proxy: forwards to ONE upstream byte-for-byte and observes generation requests on the way.

Clients and Locust talk to the proxy's port instead of Ollama's. The relaying itself (every
request to the configured upstream only, responses streamed as they arrive, the upstream request
closed when its client leaves) is exporter/relay.py; this module is what the proxy observes
through the relay's hooks.

Observed on the way (POST /api/chat, /api/generate, /v1/chat/completions):
- per model, requests waiting (relayed, no byte of their answer yet) and running (their answer has
  begun to stream), as the proxy sees them (observations.py); nothing is inferred from
  OLLAMA_NUM_PARALLEL;
- time to the first response chunk;
- from the final NDJSON object (`done: true`): eval_count, eval_duration, prompt_eval_count,
  prompt_eval_duration, load_duration (nanoseconds), and from these with total_duration the time
  Ollama held the request outside loading, prompt evaluation and generation (its queue);
- from the OpenAI `usage` chunk (stream_options.include_usage) or body: token counts only.
Every response carries `Via: 1.1 servescope-ollama-proxy` (servescope.engines.PROXY_VIA), so a client
can tell that it went through the proxy.
The response is not parsed while it streams: the last bytes are kept and only the tail is
parsed once the stream has ended, so observation adds no latency to any chunk.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, Summary

from exporter.observations import ProxyObservations, normalise_model
from exporter.relay import Exchange, Relay, ResponseTail
from servescope import engines
from servescope.contracts import series
from servescope.engines import ollama_durations

log = logging.getLogger("exporter")

NDJSON_PATHS = frozenset(("/api/chat", "/api/generate"))
DURATIONS = ollama_durations.DURATIONS  # the whole and the parts in the model: the rest is its queue
OPENAI_PATHS = frozenset(("/v1/chat/completions",))


class ProxyMetrics:
    """Direct instrumentation of what passes through every proxy of this exporter (labels engine, instance, model)."""

    def __init__(self, registry: CollectorRegistry):
        labels = [*series.MODEL_LABELS]

        def histogram(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, documentation, labels, buckets=buckets, registry=registry)

        self.requests = Counter(
            series.PROXY_REQUESTS,
            "Generation requests through the Ollama proxy by outcome: ok, error (HTTP >= 400 or an error object), "
            "rejected (503: Ollama's queue is full), client_disconnect, upstream_broken (stream cut), upstream_unreachable.",
            [*labels, "outcome"],
            registry=registry,
        )
        self.tokens_per_second = histogram(
            series.PROXY_GEN_TOKENS_PER_SECOND,
            "Generation speed of one request: eval_count / eval_duration (ns) x 1e9 from Ollama's final NDJSON object.",
            (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000),
        )
        self.prompt_eval_seconds = histogram(
            series.PROXY_PROMPT_EVAL_SECONDS,
            "Prompt evaluation time of one request: prompt_eval_duration (ns) / 1e9 from Ollama's final NDJSON object.",
            (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.load_seconds = histogram(
            series.PROXY_LOAD_SECONDS,
            "Model load time of one request: load_duration (ns) / 1e9 from Ollama's final NDJSON object; cold loads show here.",
            (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
        )
        # A summary (sum and count only): the mean is what the alert and the dashboard read, and 14 bucket lines
        # per model label would cost the page's bound (exporter/bounds.py) for no reader.
        self.queue_seconds = Summary(
            series.PROXY_QUEUE_SECONDS,
            "Derived per request from Ollama's own durations in its final NDJSON object: (total_duration - "
            "load_duration - prompt_eval_duration - eval_duration) / 1e9, the time Ollama held the request outside "
            "loading the model, evaluating the prompt and generating: waiting for one of its OLLAMA_NUM_PARALLEL "
            "slots. /api/chat and /api/generate only (the OpenAI API reports no durations).",
            labels,
            registry=registry,
        )
        self.first_chunk_seconds = histogram(
            series.PROXY_FIRST_CHUNK_SECONDS,
            "Seconds from the request reaching the proxy to the first response chunk from Ollama (includes queueing).",
            (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )


class ModelMetrics:
    """One model's labelled children of ProxyMetrics, looked up once: `labels()` takes a lock and formats every value."""

    __slots__ = (
        "first_chunk",
        "tokens_per_second",
        "prompt_eval_seconds",
        "load_seconds",
        "queue_seconds",
        "_requests",
        "_by_outcome",
    )

    def __init__(self, metrics: ProxyMetrics, labels: tuple[str, str, str]):
        self.first_chunk = metrics.first_chunk_seconds.labels(*labels)
        self.tokens_per_second = metrics.tokens_per_second.labels(*labels)
        self.prompt_eval_seconds = metrics.prompt_eval_seconds.labels(*labels)
        self.load_seconds = metrics.load_seconds.labels(*labels)
        self.queue_seconds = metrics.queue_seconds.labels(*labels)
        self._requests = (metrics.requests, labels)
        self._by_outcome: dict[str, object] = {}

    def requests(self, outcome: str):
        child = self._by_outcome.get(outcome)
        if child is None:
            counter, labels = self._requests
            child = self._by_outcome[outcome] = counter.labels(*labels, outcome)
        return child


class OllamaTail(ResponseTail):
    """The end of an Ollama response: its final NDJSON object, or the OpenAI-style usage."""

    def final_ndjson(self) -> dict | None:
        """The last JSON object of the stream (the `done: true` one, or an `error` object)."""
        data = self.buffer
        end = len(data.rstrip())
        if not end:
            return None
        try:
            value = json.loads(data[data.rfind(b"\n", 0, end) + 1 : end].decode())
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def openai_usage(self) -> dict | None:
        """`usage` from the last SSE data event that has one, or from a plain JSON body."""
        data = bytes(self.buffer)
        if not self.truncated and data.lstrip()[:1] == b"{":
            try:
                body = json.loads(data)
            except ValueError:
                return None
            return body.get("usage") if isinstance(body, dict) and isinstance(body.get("usage"), dict) else None
        for line in reversed(data.split(b"\n")):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]" or b'"usage"' not in payload:
                continue
            try:
                event = json.loads(payload)
            except ValueError:
                return None
            if isinstance(event, dict) and isinstance(event.get("usage"), dict):
                return event["usage"]
        return None


class OllamaProxy(Relay):
    """The relay in front of one Ollama instance, observing its generation requests through the relay's hooks."""

    title = "ollama proxy"
    via = f"1.1 {engines.PROXY_VIA}".encode()

    def __init__(
        self,
        instance: str,
        upstream_url: str,
        observations: ProxyObservations,
        metrics: ProxyMetrics,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ):
        super().__init__(instance, upstream_url, clock=clock)
        self.observations = observations
        self.metrics = metrics
        self._by_model: dict[str, ModelMetrics] = {}

    def observes(self, method: bytes, path: str) -> bool:
        return method == b"POST" and (path in NDJSON_PATHS or path in OPENAI_PATHS)

    def new_tail(self) -> OllamaTail:
        return OllamaTail()

    # Bookkeeping runs in callbacks of its own (loop.call_soon), queued behind the I/O of the
    # loop's current turn: in a burst, every request goes upstream and every chunk goes out
    # before any of them is counted. A request is counted (begin) before anything else of it.
    def begin(self, exchange: Exchange) -> None:
        if exchange.observed and not exchange.begun:
            exchange.begun = True
            exchange.label = self.observations.admit(_request_model(exchange.body))
            self.observations.started(exchange.label)

    def first_chunk(self, exchange: Exchange) -> None:
        if exchange.observed:
            self.begin(exchange)
            exchange.first_observed = True
            self.observations.answering(exchange.label)
            # Series exist only for models Ollama has answered for: a name not yet confirmed waits for its end.
            if self.observations.confirmed(exchange.label):
                exchange.first_noted = True
                self._children(exchange.label).first_chunk.observe(exchange.first_seen - exchange.started)

    def end(self, exchange: Exchange, outcome: str) -> None:
        if not exchange.observed:
            return
        self.begin(exchange)
        final = self._final(exchange) if outcome == "ok" else None
        if final is not None and "error" in final:
            outcome = "error"  # an error object in a 200 stream
        label = self.observations.finished(exchange.label, ok=outcome == "ok", answered=exchange.first_observed)
        children = self._children(label)
        if exchange.first_seen and not exchange.first_noted:
            children.first_chunk.observe(exchange.first_seen - exchange.started)
        if outcome == "ok" and final:
            self._record(exchange.path, label, final, children)
        children.requests(outcome).inc()

    def _children(self, label: str) -> ModelMetrics:
        children = self._by_model.get(label)
        if children is None:
            children = self._by_model[label] = ModelMetrics(self.metrics, (engines.OLLAMA.name, self.instance, label))
        return children

    def _final(self, exchange: Exchange) -> dict | None:
        """What the finished response says: Ollama's final NDJSON object, or the OpenAI usage (as {"usage": ...})."""
        if exchange.path in NDJSON_PATHS:
            return exchange.tail.final_ndjson()
        usage = exchange.tail.openai_usage()
        return {"usage": usage} if usage else None

    def _record(self, path: str, label: str, final: dict, children: ModelMetrics) -> None:
        if path not in NDJSON_PATHS:
            usage = final["usage"]
            self.observations.tokens(label, _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")))
            return
        if not final.get("done"):
            return
        prompt = _count(final.get("prompt_eval_count"))
        generated = _count(final.get("eval_count"))
        self.observations.tokens(label, prompt, generated)
        eval_ns = _count(final.get("eval_duration"))
        if eval_ns > 0:
            children.tokens_per_second.observe(generated / eval_ns * 1e9)
        if "prompt_eval_duration" in final:
            children.prompt_eval_seconds.observe(_count(final["prompt_eval_duration"]) / 1e9)
        if "load_duration" in final:
            children.load_seconds.observe(_count(final["load_duration"]) / 1e9)
        held = ollama_durations.held_s({key: _count(final[key]) for key in DURATIONS if key in final})
        if held is not None:
            children.queue_seconds.observe(held)


def _request_model(body: bytes) -> str:
    """The `model` field of a generation request, normalised as Ollama does; "" when absent."""
    try:
        value = json.loads(body.decode())  # from str: faster than json.loads(bytes), which sniffs the encoding
    except ValueError:  # UnicodeDecodeError included
        return ""
    return normalise_model(value.get("model")) if isinstance(value, dict) else ""


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
