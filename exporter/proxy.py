"""The Ollama streaming reverse proxy: forwards to ONE upstream byte-for-byte and observes generation requests on the way.

Clients and Locust talk to the proxy's port instead of Ollama's. Every request (method, path,
query, body, end-to-end headers) goes to the configured upstream only; the request target's
host, if a client sends an absolute URI, is ignored, so this is never an open proxy. Responses
are streamed chunk by chunk as they arrive. When the client goes away the upstream request is
closed, which is how Ollama learns to stop generating.

Observed on the way (POST /api/chat, /api/generate, /v1/chat/completions):
- requests in flight per model (running/waiting come from these, see observations.py);
- time to the first response chunk;
- from the final NDJSON object (`done: true`): eval_count, eval_duration, prompt_eval_count,
  prompt_eval_duration, load_duration (nanoseconds);
- from the OpenAI `usage` chunk (stream_options.include_usage) or body: token counts only.
The response is not parsed while it streams: the last bytes are kept and only the tail is
parsed once the stream has ended, so observation adds no latency to any chunk.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram
from yarl import URL

from exporter.observations import ProxyObservations, normalise_model
from servescope import series

log = logging.getLogger("exporter")

# Hop-by-hop headers (RFC 9110 7.6.1) belong to one connection, never forwarded; Host and
# Content-Length are recomputed for the upstream connection (the body bytes are unchanged).
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
        "TE", "Trailer", "Trailers", "Transfer-Encoding", "Upgrade", "Host", "Content-Length",
    )
)
NDJSON_PATHS = frozenset(("/api/chat", "/api/generate"))
OPENAI_PATHS = frozenset(("/v1/chat/completions",))
# Enough for the final NDJSON object or the usage chunk plus [DONE]; a longer stream keeps only
# its last lines.
TAIL_KEEP = 64 * 1024
TAIL_LIMIT = 4 * TAIL_KEEP
MAX_REQUEST_BYTES = 64 * 1024 * 1024

OUTCOMES = ("ok", "error", "rejected", "client_disconnect", "upstream_broken", "upstream_unreachable")


class ProxyMetrics:
    """Direct instrumentation of what passes through every proxy of this exporter (labels engine, instance, model)."""

    def __init__(self, registry: CollectorRegistry):
        labels = [*series.MODEL_LABELS]
        self.requests = Counter(
            series.PROXY_REQUESTS,
            "Generation requests through the Ollama proxy by outcome: ok, error (HTTP >= 400 or an error object), "
            "rejected (503: Ollama's queue is full), client_disconnect, upstream_broken (stream cut), upstream_unreachable.",
            [*labels, "outcome"],
            registry=registry,
        )
        self.tokens_per_second = Histogram(
            series.PROXY_GEN_TOKENS_PER_SECOND,
            "Generation speed of one request: eval_count / eval_duration (ns) x 1e9 from Ollama's final NDJSON object.",
            labels,
            buckets=(1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000),
            registry=registry,
        )
        self.prompt_eval_seconds = Histogram(
            series.PROXY_PROMPT_EVAL_SECONDS,
            "Prompt evaluation time of one request: prompt_eval_duration (ns) / 1e9 from Ollama's final NDJSON object.",
            labels,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.load_seconds = Histogram(
            series.PROXY_LOAD_SECONDS,
            "Model load time of one request: load_duration (ns) / 1e9 from Ollama's final NDJSON object; cold loads show here.",
            labels,
            buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
            registry=registry,
        )
        self.first_chunk_seconds = Histogram(
            series.PROXY_FIRST_CHUNK_SECONDS,
            "Seconds from the request reaching the proxy to the first response chunk from Ollama (includes queueing).",
            labels,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=registry,
        )


class ResponseTail:
    """The last bytes of a response, kept without parsing so the stream is not slowed."""

    __slots__ = ("buffer", "truncated")

    def __init__(self):
        self.buffer = bytearray()
        self.truncated = False

    def feed(self, chunk: bytes) -> None:
        buffer = self.buffer
        buffer += chunk
        if len(buffer) > TAIL_LIMIT:
            # Cut at a line boundary: the final NDJSON object / SSE usage event are whole lines.
            cut = buffer.find(b"\n", len(buffer) - TAIL_KEEP)
            if cut == -1:
                cut = len(buffer) - TAIL_KEEP
            del buffer[: cut + 1]
            self.truncated = True

    def final_ndjson(self) -> dict | None:
        """The last JSON object of the stream (the `done: true` one, or an `error` object)."""
        for line in reversed(bytes(self.buffer).split(b"\n")):
            if line.strip():
                try:
                    value = json.loads(line)
                except ValueError:
                    return None
                return value if isinstance(value, dict) else None
        return None

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


class OllamaProxy:
    """One proxy in front of one Ollama instance, served by aiohttp on its own port."""

    def __init__(
        self,
        instance: str,
        upstream_url: str,
        observations: ProxyObservations,
        metrics: ProxyMetrics,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.instance = instance
        self.upstream_url = upstream_url.rstrip("/")
        self.observations = observations
        self.metrics = metrics
        self.clock = clock
        self.session: aiohttp.ClientSession | None = None
        self.runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._open_session)
        app.on_cleanup.append(self._close_session)
        return app

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0 = any free port); returns the bound port."""
        # handler_cancellation: a client hanging up cancels its handler, which closes the
        # upstream request instead of letting Ollama generate for nobody.
        self.runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await self.runner.cleanup()
            raise
        return site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _open_session(self, _app) -> None:
        self.session = aiohttp.ClientSession(
            auto_decompress=False,  # bytes pass through exactly as Ollama sent them
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            connector=aiohttp.TCPConnector(limit=1024, force_close=False),
        )

    async def _close_session(self, _app) -> None:
        if self.session is not None:
            await self.session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "CONNECT":
            return web.Response(status=405, text="CONNECT is not supported: this proxy forwards only to its Ollama\n")
        started = self.clock()
        path = request.rel_url.path
        observed = request.method == "POST" and (path in NDJSON_PATHS or path in OPENAI_PATHS)
        body = await request.read()
        if not observed:
            _, response = await self._forward(request, body, started, "", None)
            return response
        model = self.observations.model_label(_request_model(body))
        self.observations.started(model)
        tail = ResponseTail()
        outcome = "client_disconnect"  # unless _forward returns: cancellation means the client left
        try:
            outcome, response = await self._forward(request, body, started, model, tail)
            return response
        finally:
            if outcome == "ok":
                outcome = self._observe(path, model, tail)
            self.observations.finished(model, failed=outcome != "ok")
            self.metrics.requests.labels("ollama", self.instance, model, outcome).inc()

    async def _forward(
        self, request: web.Request, body: bytes, started: float, model: str, tail: ResponseTail | None
    ) -> tuple[str, web.StreamResponse]:
        # A list, not a dict: a header sent twice is forwarded twice.
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        skip = {h for h in ("User-Agent", "Accept", "Accept-Encoding", "Content-Type") if h not in request.headers}
        # rel_url drops the scheme and host of an absolute-form request target: only the path
        # and query go upstream, and always to the one configured upstream.
        # encoded=True: percent-escapes go upstream as the client wrote them, not re-quoted.
        target = URL(self.upstream_url + request.rel_url.raw_path_qs, encoded=True)
        try:
            upstream = await self.session.request(
                request.method, target, data=body if body else None, headers=headers,
                skip_auto_headers=skip, allow_redirects=False,
            )
        except (aiohttp.ClientError, OSError) as exc:
            log.warning("ollama proxy %s: upstream %s unreachable: %s", self.instance, self.upstream_url, exc)
            return "upstream_unreachable", web.json_response(
                {"error": f"ollama proxy: upstream unreachable: {exc}"}, status=502
            )
        try:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in HOP_BY_HOP:
                    response.headers.add(key, value)
            if upstream.content_length is not None and request.method != "HEAD":
                response.content_length = upstream.content_length
            first = True
            try:
                async for chunk in upstream.content.iter_any():
                    if first:
                        first = False
                        if tail is not None:
                            self.metrics.first_chunk_seconds.labels("ollama", self.instance, model).observe(
                                self.clock() - started
                            )
                        await response.prepare(request)
                    if tail is not None:
                        tail.feed(chunk)
                    await response.write(chunk)
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                # Ollama died mid-stream: the client sees the connection end early, as it would directly.
                log.warning("ollama proxy %s: upstream stream broke: %s", self.instance, exc)
                if response.prepared:
                    if request.transport is not None:
                        request.transport.close()
                    return "upstream_broken", response
                return "upstream_broken", web.json_response({"error": "ollama proxy: upstream closed the stream"}, status=502)
            except ConnectionResetError:
                return "client_disconnect", response
            if not response.prepared:
                await response.prepare(request)
            await response.write_eof()
            if upstream.status == 503:
                return "rejected", response
            if upstream.status >= 400:
                return "error", response
            return "ok", response
        finally:
            # Closing (not releasing) drops the upstream connection when the stream did not finish,
            # which is what stops Ollama generating for a client that has gone.
            if upstream.content.is_eof():
                upstream.release()
            else:
                upstream.close()

    def _observe(self, path: str, model: str, tail: ResponseTail) -> str:
        """Record what the finished response says; returns the outcome ("error" for an error object)."""
        labels = ("ollama", self.instance, model)
        if path in NDJSON_PATHS:
            final = tail.final_ndjson()
            if not final:
                return "ok"
            if "error" in final:
                return "error"
            if not final.get("done"):
                return "ok"
            prompt = _count(final.get("prompt_eval_count"))
            generated = _count(final.get("eval_count"))
            self.observations.tokens(model, prompt, generated)
            eval_ns = _count(final.get("eval_duration"))
            if eval_ns > 0:
                self.metrics.tokens_per_second.labels(*labels).observe(generated / eval_ns * 1e9)
            if "prompt_eval_duration" in final:
                self.metrics.prompt_eval_seconds.labels(*labels).observe(_count(final["prompt_eval_duration"]) / 1e9)
            if "load_duration" in final:
                self.metrics.load_seconds.labels(*labels).observe(_count(final["load_duration"]) / 1e9)
        else:
            usage = tail.openai_usage()
            if usage:
                self.observations.tokens(model, _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")))
        return "ok"


def _request_model(body: bytes) -> str:
    """The `model` field of a generation request, normalised as Ollama does; "" when absent."""
    try:
        value = json.loads(body)
    except ValueError:
        return ""
    return normalise_model(value.get("model")) if isinstance(value, dict) else ""


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
