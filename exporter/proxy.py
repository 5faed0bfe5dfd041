"""The Ollama streaming reverse proxy: forwards to ONE upstream byte-for-byte and observes generation requests on the way.

Clients and Locust talk to the proxy's port instead of Ollama's. Every request (method, path,
query, body, end-to-end headers) goes to the configured upstream only; the request target's
host, if a client sends an absolute URI, is ignored, so this is never an open proxy. Responses
are streamed chunk by chunk as they arrive. When the client goes away the upstream connection is
closed, which is how Ollama learns to stop generating.

Observed on the way (POST /api/chat, /api/generate, /v1/chat/completions):
- requests in flight per model (running/waiting come from these, see observations.py);
- time to the first response chunk;
- from the final NDJSON object (`done: true`): eval_count, eval_duration, prompt_eval_count,
  prompt_eval_duration, load_duration (nanoseconds);
- from the OpenAI `usage` chunk (stream_options.include_usage) or body: token counts only.
The response is not parsed while it streams: the last bytes are kept and only the tail is
parsed once the stream has ended, so observation adds no latency to any chunk.

Why asyncio protocols and llhttp (httptools) rather than a web framework: the proxy sits in the
path of every token, and an aiohttp handler and client session cost about a millisecond of CPU
per request and one task switch per chunk. Here a chunk from Ollama is parsed in C and written
to the client inside the same callback. Each client connection gets its own upstream connection
(opened on its first request, kept alive with it), so there is no pool to manage and closing
one side closes the other.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools
from prometheus_client import CollectorRegistry, Counter, Histogram

from exporter.observations import ProxyObservations, normalise_model
from servescope import series
from servescope.urls import redact

log = logging.getLogger("exporter")

# Hop-by-hop headers (RFC 9110 7.6.1) belong to one connection, never forwarded; Host and
# Content-Length are recomputed for the upstream connection (the body bytes are unchanged).
# Expect is answered by the proxy itself (it reads the whole body before forwarding).
HOP_BY_HOP = frozenset(
    h.lower().encode()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Trailers",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
        "Expect",
    )
)
NDJSON_PATHS = frozenset(("/api/chat", "/api/generate"))
OPENAI_PATHS = frozenset(("/v1/chat/completions",))
# Enough for the final NDJSON object or the usage chunk plus [DONE]; a longer stream keeps only
# its last lines.
TAIL_KEEP = 64 * 1024
TAIL_LIMIT = 4 * TAIL_KEEP
MAX_REQUEST_BYTES = 64 * 1024 * 1024
MAX_HEAD_BYTES = 64 * 1024
CONNECT_TIMEOUT = 10.0
KEEPALIVE_TIMEOUT = 75.0  # idle client connections are closed after this, as aiohttp and nginx do
BODYLESS_STATUS = frozenset((204, 304))

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


class ModelMetrics:
    """One model's labelled children of ProxyMetrics, looked up once: `labels()` takes a lock and formats every value."""

    __slots__ = ("first_chunk", "tokens_per_second", "prompt_eval_seconds", "load_seconds", "_requests", "_by_outcome")

    def __init__(self, metrics: ProxyMetrics, labels: tuple[str, str, str]):
        self.first_chunk = metrics.first_chunk_seconds.labels(*labels)
        self.tokens_per_second = metrics.tokens_per_second.labels(*labels)
        self.prompt_eval_seconds = metrics.prompt_eval_seconds.labels(*labels)
        self.load_seconds = metrics.load_seconds.labels(*labels)
        self._requests = (metrics.requests, labels)
        self._by_outcome: dict[str, object] = {}

    def requests(self, outcome: str):
        child = self._by_outcome.get(outcome)
        if child is None:
            counter, labels = self._requests
            child = self._by_outcome[outcome] = counter.labels(*labels, outcome)
        return child


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


class OllamaProxy:
    """One proxy in front of one Ollama instance, listening on its own port."""

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
        parts = urlsplit(self.upstream_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"ollama proxy {instance}: upstream must be an http:// or https:// URL, not {redact(upstream_url)!r}"
            )
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port or (443 if parts.scheme == "https" else 80)
        self.upstream_ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.upstream_netloc = parts.netloc.rpartition("@")[2].encode("idna")
        self.upstream_prefix = parts.path.encode()  # a path prefix in the URL goes before every request path
        self.observations = observations
        self.metrics = metrics
        self.clock = clock
        self.server: asyncio.Server | None = None
        self.connections: set[ClientConnection] = set()
        self._by_model: dict[str, ModelMetrics] = {}

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0 = any free port); returns the bound port."""
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: ClientConnection(self), host, port, reuse_address=True)
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is None:
            return
        self.server.close()
        for connection in list(self.connections):
            connection.abort()
        await self.server.wait_closed()

    # Bookkeeping runs in callbacks of its own (loop.call_soon), queued behind the I/O of the
    # loop's current turn: in a burst, every request goes upstream and every chunk goes out
    # before any of them is counted. A request is counted (begin) before anything else of it.
    def begin(self, exchange: Exchange) -> None:
        if exchange.observed and not exchange.begun:
            exchange.begun = True
            exchange.model = self.observations.model_label(_request_model(exchange.body))
            self.observations.started(exchange.model)

    def end(self, exchange: Exchange, outcome: str) -> None:
        if not exchange.observed:
            return
        self.begin(exchange)
        children = self._children(exchange.model)
        if outcome == "ok":
            outcome = self._observe(exchange.path, exchange.model, exchange.tail, children)
        self.observations.finished(exchange.model, failed=outcome != "ok")
        children.requests(outcome).inc()

    def first_chunk(self, exchange: Exchange) -> None:
        if exchange.observed:
            self.begin(exchange)
            self._children(exchange.model).first_chunk.observe(exchange.first_seen - exchange.started)

    def _children(self, model: str) -> ModelMetrics:
        children = self._by_model.get(model)
        if children is None:
            children = self._by_model[model] = ModelMetrics(self.metrics, ("ollama", self.instance, model))
        return children

    def _observe(self, path: str, model: str, tail: ResponseTail, children: ModelMetrics) -> str:
        """Record what the finished response says; returns the outcome ("error" for an error object)."""
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
                children.tokens_per_second.observe(generated / eval_ns * 1e9)
            if "prompt_eval_duration" in final:
                children.prompt_eval_seconds.observe(_count(final["prompt_eval_duration"]) / 1e9)
            if "load_duration" in final:
                children.load_seconds.observe(_count(final["load_duration"]) / 1e9)
        else:
            usage = tail.openai_usage()
            if usage:
                self.observations.tokens(
                    model, _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
                )
        return "ok"


class Refusal(Exception):
    """A request the proxy answers itself (CONNECT, a body too large, unparsable HTTP)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Exchange:
    """One request and its response on their way through the proxy."""

    __slots__ = (
        "method",
        "target",
        "path",
        "headers",
        "body",
        "close_after",
        "http10",
        "observed",
        "model",
        "tail",
        "started",
        "status",
        "chunked",
        "head_sent",
        "first_seen",
        "retried",
        "done",
        "begun",
    )

    def __init__(
        self,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        keep_alive: bool,
        http10: bool,
        started: float,
    ):
        self.method = method
        self.target = _origin_form(target)
        self.path = self.target.partition(b"?")[0].decode("latin-1")
        self.headers = headers
        self.body = body
        self.close_after = not keep_alive
        self.http10 = http10
        self.observed = method == b"POST" and (self.path in NDJSON_PATHS or self.path in OPENAI_PATHS)
        self.model = ""
        self.tail = ResponseTail() if self.observed else None
        self.started = started
        self.status = 0
        self.chunked = False  # the response to the client is framed with chunked encoding
        self.head_sent = False
        self.first_seen = 0.0  # clock() when the first response chunk went by
        self.retried = False
        self.done = False
        self.begun = False  # counted in flight (OllamaProxy.begin)

    def upstream_request(self, proxy: OllamaProxy) -> bytes:
        """The request as sent upstream: end-to-end headers as the client wrote them, Host and Content-Length recomputed."""
        target = self.target if self.target == b"*" else proxy.upstream_prefix + self.target
        parts = [self.method, b" ", target, b" HTTP/1.1\r\n"]
        for name, value in self.headers:  # end-to-end only: ClientConnection.on_headers_complete filtered them
            parts += (name, b": ", value, b"\r\n")
        parts += (b"Host: ", proxy.upstream_netloc, b"\r\n")
        if self.body or self.method in (b"POST", b"PUT", b"PATCH"):
            parts.append(b"Content-Length: %d\r\n" % len(self.body))
        parts += (b"\r\n", self.body)
        return b"".join(parts)


class ClientConnection(asyncio.Protocol):
    """The client's side: parses its requests, sends each upstream in turn and relays the response."""

    def __init__(self, proxy: OllamaProxy):
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.pending: deque[Exchange] = deque()
        self.current: Exchange | None = None
        self.upstream: UpstreamConnection | None = None
        self.connecting: asyncio.Task | None = None
        self.refusal: Refusal | None = None
        self.closed = False
        self.paused = False
        self.continue_due = False  # a pipelined request's 100 Continue, sent once the response before it is done
        self.idle_timer: asyncio.TimerHandle | None = None
        self.idle_since = 0.0  # loop time of the last sign of life while no response is going out
        self._new_request()

    # --- connection events -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        self.proxy.connections.add(self)
        self._arm_idle_timer()

    def data_received(self, data: bytes) -> None:
        if self.refusal is not None:
            return  # the request stream is broken: what follows is not parsed (it would replace the refusal)
        if self.current is None:
            self.idle_since = self.loop.time()  # sending slowly is not idle; stalling inside a request is
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            # Upgrade (e.g. a WebSocket handshake) is hop-by-hop and is not forwarded: the request
            # went upstream as a plain one; whatever follows it is parsed as the next request.
            rest = data[upgrade.args[0] :] if upgrade.args else b""
            if rest and not self.closed:
                self.data_received(rest)
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            self.refusal = cause if isinstance(cause, Refusal) else Refusal(400, f"bad request: {exc}")
            if self.current is None:
                self._next()

    def pause_writing(self) -> None:
        # The client reads slower than Ollama writes: stop reading Ollama until it catches up.
        self.paused = True
        if self.upstream is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if self.upstream is not None and not self.upstream.lost:
            self.upstream.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.proxy.connections.discard(self)
        self._cancel_idle_timer()
        self.pending.clear()
        if self.current is not None:
            self._finish(self.current, "client_disconnect")
        if self.connecting is not None and not self.connecting.done():
            self.connecting.cancel()  # an upstream connect for nobody (it can take CONNECT_TIMEOUT)
        if self.upstream is not None:
            self.upstream.transport.abort()  # how Ollama learns to stop generating for nobody

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # --- httptools request callbacks -----------------------------------------------------------
    def _new_request(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = bytearray()
        self.head_bytes = 0
        self.in_head = True

    def on_message_begin(self) -> None:
        self._new_request()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.head_bytes += len(url)
        if self.head_bytes > MAX_HEAD_BYTES:
            raise Refusal(431, "request head too large")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.in_head:  # not a chunked body's trailer: the body goes upstream with a Content-Length
            self.headers.append((name, value))
        self.head_bytes += len(name) + len(value)
        if self.head_bytes > MAX_HEAD_BYTES:
            raise Refusal(431, "request head too large")

    def on_headers_complete(self) -> None:
        self.in_head = False
        if self.parser.get_method() == b"CONNECT":
            raise Refusal(405, "CONNECT is not supported: this proxy forwards only to its Ollama")
        self.headers, hop = _split_headers(self.headers)
        for value in hop.get(b"content-length", ()):
            # Refused before the body is read, not after 64 MiB of it.
            if value.strip().isdigit() and int(value) > MAX_REQUEST_BYTES:
                raise Refusal(413, f"request body larger than {MAX_REQUEST_BYTES} bytes")
        if (
            b"expect" in hop
            and self.parser.get_http_version() != "1.0"
            and any(value.lower() == b"100-continue" for value in hop[b"expect"])
        ):
            # The whole body is read before anything goes upstream, so say yes now (as aiohttp does), unless a
            # response is still going to this client: then once it is done (_next), never inside it.
            if self.current is None and not self.pending:
                if not self.closed:
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            else:
                self.continue_due = True

    def on_body(self, body: bytes) -> None:
        if len(self.body) + len(body) > MAX_REQUEST_BYTES:
            raise Refusal(413, f"request body larger than {MAX_REQUEST_BYTES} bytes")
        self.body += body

    def on_message_complete(self) -> None:
        self.continue_due = False
        parser = self.parser
        self.pending.append(
            Exchange(
                parser.get_method(),
                self.url,
                self.headers,
                bytes(self.body),
                parser.should_keep_alive(),
                parser.get_http_version() == "1.0",
                self.proxy.clock(),
            )
        )
        self._new_request()  # the body now lives in its Exchange only
        if self.current is None:
            self._next()

    # --- one exchange at a time ----------------------------------------------------------------
    def _next(self) -> None:
        if self.current is not None or self.closed:
            return
        if self.pending:
            exchange = self.current = self.pending.popleft()
            self._send(exchange)
            if exchange.observed:
                self.loop.call_soon(self.proxy.begin, exchange)
        elif self.refusal is not None:
            refusal, self.refusal = self.refusal, None
            self._write_error(refusal.status, str(refusal), close=True)
        else:
            if self.continue_due:
                self.continue_due = False
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self._arm_idle_timer()

    def _send(self, exchange: Exchange) -> None:
        upstream = self.upstream
        if upstream is not None and not upstream.lost and not upstream.transport.is_closing():
            upstream.send(exchange)
        else:
            self.upstream = None
            self.connecting = asyncio.get_running_loop().create_task(self._connect_and_send(exchange))

    async def _connect_and_send(self, exchange: Exchange) -> None:
        proxy = self.proxy
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await asyncio.wait_for(
                loop.create_connection(
                    lambda: UpstreamConnection(self), proxy.upstream_host, proxy.upstream_port, ssl=proxy.upstream_ssl
                ),
                CONNECT_TIMEOUT,
            )
        except OSError as exc:  # TimeoutError is an OSError
            reason = str(exc) or f"no connection within {CONNECT_TIMEOUT:.0f}s"
            log.warning(
                "ollama proxy %s: upstream %s unreachable: %s", proxy.instance, redact(proxy.upstream_url), reason
            )
            if exchange is self.current and not self.closed:
                self._write_error(502, f"ollama proxy: upstream unreachable: {reason}", close=exchange.close_after)
                self._finish(exchange, "upstream_unreachable")
            return
        if self.closed or exchange is not self.current:
            upstream.transport.abort()
            return
        self.upstream = upstream
        if self.paused:
            upstream.transport.pause_reading()
        upstream.send(exchange)

    def relay(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def upstream_finished(self, exchange: Exchange) -> None:
        status = exchange.status
        self._finish(exchange, "rejected" if status == 503 else "error" if status >= 400 else "ok")

    def upstream_broke(self, upstream: UpstreamConnection, exchange: Exchange, reason: str) -> None:
        if exchange is not self.current or exchange.done:
            return
        if not exchange.head_sent and not upstream.received and upstream.reused and not exchange.retried:
            # Ollama closed an idle kept-alive connection just as this request went out: the
            # request never reached it, so it is sent once more on a new connection.
            exchange.retried = True
            self.upstream = None
            self._send(exchange)
            return
        log.warning("ollama proxy %s: upstream stream broke: %s", self.proxy.instance, reason)
        if exchange.head_sent:
            self._finish(exchange, "upstream_broken")
            self._close()  # the client sees the stream end early, as it would directly
        else:
            self._write_error(502, "ollama proxy: upstream closed the stream", close=exchange.close_after)
            self._finish(exchange, "upstream_broken")

    def _finish(self, exchange: Exchange, outcome: str) -> None:
        if exchange.done:
            return
        exchange.done = True
        self.current = None
        if exchange.observed:
            self.loop.call_soon(self.proxy.end, exchange, outcome)
        if self.closed:
            return
        if exchange.close_after:
            self._close()
        else:
            self._next()

    def _write_error(self, status: int, message: str, *, close: bool) -> None:
        if self.closed:
            return
        body = json.dumps({"error": message}).encode()
        reason = {
            400: "Bad Request",
            405: "Method Not Allowed",
            413: "Payload Too Large",
            431: "Request Header Fields Too Large",
            502: "Bad Gateway",
        }.get(status, "Error")
        self.transport.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: %d\r\n%s\r\n%s"
            % (status, reason.encode(), len(body), b"Connection: close\r\n" if close else b"", body)
        )
        if close:
            self._close()

    def _close(self) -> None:
        if not self.closed:
            self.transport.close()  # flushes what is buffered, then closes

    def _arm_idle_timer(self) -> None:
        # One timer per connection, re-armed only when it fires: creating and cancelling a timer
        # for every request costs more than the rest of the request's bookkeeping.
        self.idle_since = self.loop.time()
        if self.idle_timer is None and not self.closed:
            self.idle_timer = self.loop.call_at(self.idle_since + KEEPALIVE_TIMEOUT, self._idle_check)

    def _idle_check(self) -> None:
        self.idle_timer = None
        if self.closed:
            return
        if self.current is not None or self.pending:
            self._arm_idle_timer()  # a response is going out: not idle
            return
        due = self.idle_since + KEEPALIVE_TIMEOUT
        if self.loop.time() >= due:
            self._close()
        else:
            self.idle_timer = self.loop.call_at(due, self._idle_check)

    def _cancel_idle_timer(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None


class UpstreamConnection(asyncio.Protocol):
    """The connection to Ollama owned by one client connection: parses each response and relays it as it arrives."""

    def __init__(self, client: ClientConnection):
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.out: list[bytes] = []
        self.lost = False
        self.used = 0
        self.reused = False
        self.received = False
        self.first_due = False
        self._reset_response()

    def _reset_response(self) -> None:
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False
        self.keep_alive = False
        self.until_eof = False  # a response framed by closing the connection (neither length nor chunks)
        self.informational = False

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def send(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.parser = httptools.HttpResponseParser(self)
        self._reset_response()
        self.reused = self.used > 0
        self.used += 1
        self.received = False
        self.transport.write(exchange.upstream_request(self.client.proxy))

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None or exchange.done:
            return
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._flush()
            self.exchange = None
            self.transport.abort()
            self.client.upstream_broke(self, exchange, f"malformed response: {exc}")
            return
        self._flush()
        if self.first_due:
            self.first_due = False
            self.client.loop.call_soon(self.client.proxy.first_chunk, exchange)
        if self.complete:
            self.exchange = None
            if not self.keep_alive:
                self.transport.close()
            self.client.upstream_finished(exchange)

    def _flush(self) -> None:
        if self.out:
            self.client.relay(b"".join(self.out))
            self.out.clear()
            self.exchange.head_sent = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        exchange = self.exchange
        if exchange is None or exchange.done:
            return
        self.exchange = None
        if self.until_eof:
            if exchange.chunked:
                self.client.relay(b"0\r\n\r\n")
            self.client.upstream_finished(exchange)
        else:
            self.client.upstream_broke(self, exchange, str(exc) if exc else "connection closed by upstream")

    # --- httptools response callbacks ----------------------------------------------------------
    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        exchange = self.exchange
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            self.informational = True  # e.g. 103 Early Hints: not relayed, the real response follows
            return
        exchange.status = status
        head = [b"HTTP/1.1 %d %s\r\n" % (status, self.reason)]
        forward, hop = _split_headers(self.headers)
        for name, value in forward:
            head += (name, b": ", value, b"\r\n")
        length = hop[b"content-length"][-1] if b"content-length" in hop else None
        chunked_upstream = b"transfer-encoding" in hop
        if exchange.method == b"HEAD":
            if length is not None:
                head.append(b"Content-Length: " + length + b"\r\n")
            self.keep_alive = self.parser.should_keep_alive()
            self.complete = True  # no body follows a HEAD response, whatever its headers say
        elif status in BODYLESS_STATUS:
            pass
        elif length is not None:
            head.append(b"Content-Length: " + length + b"\r\n")
        else:
            self.until_eof = not chunked_upstream
            if exchange.http10:
                exchange.close_after = True  # HTTP/1.0 has no chunks: the body ends when the connection does
            else:
                exchange.chunked = True
                head.append(b"Transfer-Encoding: chunked\r\n")
        if exchange.close_after:
            head.append(b"Connection: close\r\n")
        elif exchange.http10:
            head.append(b"Connection: keep-alive\r\n")
        head.append(b"\r\n")
        self.out += head

    def on_body(self, body: bytes) -> None:
        exchange = self.exchange
        if not exchange.first_seen:
            exchange.first_seen = self.client.proxy.clock()
            self.first_due = True  # observed once the chunk is on its way to the client (data_received)
        if exchange.tail is not None:
            exchange.tail.feed(body)
        if exchange.chunked:
            self.out += (b"%x\r\n" % len(body), body, b"\r\n")
        else:
            self.out.append(body)

    def on_message_complete(self) -> None:
        if self.informational:
            self.headers = []
            self.reason = b""
            self.informational = False
            return
        if self.exchange.chunked:
            self.out.append(b"0\r\n\r\n")
        self.keep_alive = self.parser.should_keep_alive()  # only meaningful inside this callback
        self.complete = True


def _origin_form(target: bytes) -> bytes:
    """Path and query of a request target; the scheme and host of an absolute URI are dropped (never an open proxy)."""
    scheme, sep, rest = target.partition(b"://")
    if not sep or b"/" in scheme or b"?" in scheme:
        return target
    cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i != -1), default=len(rest))
    path = rest[cut:]
    return path if path.startswith(b"/") else b"/" + path


def _split_headers(headers: list[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]], dict[bytes, list[bytes]]]:
    """In one pass: the end-to-end headers in order, and the hop-by-hop ones by lower-cased name.

    Header names listed in Connection are hop-by-hop too (RFC 9110 7.6.1).
    """
    forward = []
    hop: dict[bytes, list[bytes]] = {}
    for name, value in headers:
        lower = name.lower()
        if lower in HOP_BY_HOP:
            hop.setdefault(lower, []).append(value)
        else:
            forward.append((name, value, lower))
    if b"connection" in hop:
        listed = {token.strip().lower() for value in hop[b"connection"] for token in value.split(b",")}
        return [(name, value) for name, value, lower in forward if lower not in listed], hop
    return [(name, value) for name, value, _ in forward], hop


def _request_model(body: bytes) -> str:
    """The `model` field of a generation request, normalised as Ollama does; "" when absent."""
    try:
        value = json.loads(body.decode())  # from str: half the time of json.loads(bytes), which sniffs the encoding
    except ValueError:  # UnicodeDecodeError included
        return ""
    return normalise_model(value.get("model")) if isinstance(value, dict) else ""


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
