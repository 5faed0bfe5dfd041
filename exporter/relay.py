"""A generic HTTP/1.1 relay to ONE upstream: keep-alive, pipelining, Expect, HEAD, HTTP/1.0, back-pressure, retries.

Every request (method, path, query, body, end-to-end headers) goes to the configured upstream
only; the request target's host, if a client sends an absolute URI, is ignored, so this is never
an open proxy. Responses are streamed chunk by chunk as they arrive. When the client goes away the
upstream connection is closed, which is how the upstream learns to stop working for nobody.

Why asyncio protocols and llhttp (httptools) rather than a web framework: the relay sits in the
path of every token, and an aiohttp handler and client session cost about a millisecond of CPU
per request and one task switch per chunk. Here a chunk from the upstream is parsed in C and
written to the client inside the same callback. Each client connection gets its own upstream
connection (opened on its first request, kept alive with it), so there is no pool to manage and
closing one side closes the other. What passes through is observed by a subclass through the
hooks of Relay (exporter/proxy.py observes Ollama's generation requests).
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import ssl
import time
from collections import deque
from collections.abc import Callable
from http import HTTPStatus
from urllib.parse import urlsplit

import httptools

from exporter.heap import LARGE_BODY_BYTES, give_back_memory
from servescope.contracts.urls import redact

log = logging.getLogger("exporter")

# Hop-by-hop headers (RFC 9110 7.6.1) belong to one connection, never forwarded; Host and
# Content-Length are recomputed for the upstream connection (the body bytes are unchanged).
# Expect is answered by the relay itself (it reads the whole body before forwarding).
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
MAX_REQUEST_BYTES = 64 * 1024 * 1024
MAX_HEAD_BYTES = 64 * 1024
# Request bodies held at once by one relay (being received, queued, or kept for a retry until their
# response is over): past this a request is refused with 503 instead of growing memory.
MAX_BUFFERED_BYTES = 128 * 1024 * 1024
CONNECT_TIMEOUT = 10.0
KEEPALIVE_TIMEOUT = 75.0  # idle client connections are closed after this, as aiohttp and nginx do
# A request (head and body) must have arrived whole this long after its first byte, however it is
# paced (slowloris: a byte every few seconds); then it gets 408 and the connection is closed.
REQUEST_TIMEOUT = 30.0
# Client connections per relay. Each takes two file descriptors (its upstream connection too), and
# past the process's limit every accept fails, the exporter's /metrics included: the cap stays below
# what RLIMIT_NOFILE leaves after FD_RESERVE for /metrics, engine scrapes and the rest.
MAX_CONNECTIONS = 1024
FD_RESERVE = 128
CAP_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\n"
    b"Content-Length: 52\r\nConnection: close\r\n\r\n"
    b'{"error": "too many connections open: retry later"}\n'
)
BODYLESS_STATUS = frozenset((204, 304))
# Enough for the final NDJSON object or the usage chunk plus [DONE]; a longer stream keeps only
# its last lines.
TAIL_KEEP = 64 * 1024
TAIL_LIMIT = 4 * TAIL_KEEP


def raise_fd_limit() -> None:
    """Lift this process's soft RLIMIT_NOFILE to its hard limit (capped at 65,536), as Go's runtime does: the
    soft default of 1,024 is what a slowloris reaches first."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 65_536 if hard == resource.RLIM_INFINITY else min(hard, 65_536)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            pass  # not allowed here: the cap below follows whatever limit there is


def connection_cap() -> int:
    """MAX_CONNECTIONS, or fewer when the file-descriptor limit could not hold them (two each) plus FD_RESERVE."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, (soft - FD_RESERVE) // 2))


class Relay:
    """An HTTP/1.1 relay listening on its own port in front of ONE upstream.

    Subclasses observe what passes through the hooks below (the callback seam); the relay itself
    knows nothing of what the bodies mean.
    """

    title = "relay"  # how log lines and the relay's own error bodies name it
    # The Via header value added to every response (RFC 9110 7.6.3: a proxy names itself in what it forwards),
    # its own error responses included; empty: none added.
    via = b""

    def __init__(self, instance: str, upstream_url: str, *, clock: Callable[[], float] = time.perf_counter):
        self.instance = instance
        self.upstream_url = upstream_url.rstrip("/")
        parts = urlsplit(self.upstream_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"{self.title} {instance}: upstream must be an http:// or https:// URL, not {redact(upstream_url)!r}"
            )
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port or (443 if parts.scheme == "https" else 80)
        self.upstream_ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.upstream_netloc = parts.netloc.rpartition("@")[2].encode("idna")
        self.upstream_prefix = parts.path.encode()  # a path prefix in the URL goes before every request path
        self.clock = clock
        self.server: asyncio.Server | None = None
        self.connections: set[ClientConnection] = set()
        self.max_connections = connection_cap()
        self.buffered = 0  # request body bytes held by all connections (MAX_BUFFERED_BYTES)
        self.turned_away = 0  # connections refused at the cap since the last log line about it
        self.let_go_large = False  # a large body was let go since the last sweep: give the memory back
        self._sweeper: asyncio.Task | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0 = any free port); returns the bound port."""
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: ClientConnection(self), host, port, reuse_address=True)
        self._sweeper = loop.create_task(self._sweep())
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is None:
            return
        self.server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for connection in list(self.connections):
            connection.abort()
        await self.server.wait_closed()

    async def _sweep(self) -> None:
        """Every connection's deadlines (keep-alive, request), checked by one task: a timer per connection,
        created and cancelled per request, would cost more than the rest of the request's bookkeeping."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(1.0, KEEPALIVE_TIMEOUT / 3, REQUEST_TIMEOUT / 3))
            now = loop.time()
            for connection in list(self.connections):
                connection.sweep(now)
            if self.let_go_large:
                self.let_go_large = False
                give_back_memory()
            if self.turned_away:
                log.warning(
                    "%s %s: %d connections turned away at the cap of %d open ones",
                    self.title,
                    self.instance,
                    self.turned_away,
                    self.max_connections,
                )
                self.turned_away = 0

    # --- the hooks: what a subclass observes. Each runs in a callback of its own (loop.call_soon),
    # queued behind the I/O of the loop's current turn, so observing never delays a chunk. ---
    def observes(self, method: bytes, path: str) -> bool:
        """Whether begin/first_chunk/end are called for this request (and its response's tail kept)."""
        return False

    def new_tail(self) -> ResponseTail:
        return ResponseTail()

    def begin(self, exchange: Exchange) -> None:
        """The request goes upstream (called before first_chunk and end of it)."""

    def first_chunk(self, exchange: Exchange) -> None:
        """The first chunk of the response went to the client (exchange.first_seen says when)."""

    def end(self, exchange: Exchange, outcome: str) -> None:
        """The exchange is over: ok, error (HTTP >= 400), rejected (503), client_disconnect, upstream_broken,
        upstream_unreachable."""


class ResponseTail:
    """The last bytes of a response, kept without parsing so the stream is not slowed; read once it has ended."""

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


class Refusal(Exception):
    """A request the relay answers itself (CONNECT, a body too large, unparsable HTTP)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Exchange:
    """One request and its response on their way through the relay."""

    __slots__ = (
        "method",
        "target",
        "path",
        "headers",
        "body",
        "close_after",
        "http10",
        "observed",
        "label",
        "tail",
        "started",
        "status",
        "chunked",
        "head_sent",
        "first_seen",
        "first_noted",
        "first_observed",
        "retried",
        "done",
        "begun",
    )

    def __init__(
        self,
        relay: Relay,
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
        self.observed = relay.observes(method, self.path)
        self.label = ""  # what the relay's observer calls this request (the Ollama proxy: its model)
        self.tail = relay.new_tail() if self.observed else None
        self.started = started
        self.status = 0
        self.chunked = False  # the response to the client is framed with chunked encoding
        self.head_sent = False
        self.first_seen = 0.0  # clock() when the first response chunk went by
        self.first_noted = False  # the observer has recorded first_seen
        self.first_observed = False  # the observer's first_chunk hook has run for it
        self.retried = False
        self.done = False
        self.begun = False  # counted in flight (Relay.begin has run)

    def upstream_request(self, relay: Relay) -> list[bytes]:
        """The request as sent upstream, in writes: end-to-end headers as the client wrote them, Host and
        Content-Length recomputed. One write for a small body; a large one goes after the head, uncopied."""
        target = self.target if self.target == b"*" else relay.upstream_prefix + self.target
        parts = [self.method, b" ", target, b" HTTP/1.1\r\n"]
        for name, value in self.headers:  # end-to-end only: ClientConnection.on_headers_complete filtered them
            parts += (name, b": ", value, b"\r\n")
        parts += (b"Host: ", relay.upstream_netloc, b"\r\n")
        if self.body or self.method in (b"POST", b"PUT", b"PATCH"):
            parts.append(b"Content-Length: %d\r\n" % len(self.body))
        parts.append(b"\r\n")
        if len(self.body) > 64 * 1024:
            return [b"".join(parts), self.body]
        parts.append(self.body)
        return [b"".join(parts)]


class ClientConnection(asyncio.Protocol):
    """The client's side: parses its requests, sends each upstream in turn and relays the response."""

    def __init__(self, relay: Relay):
        self.relay = relay
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
        self.idle_since = 0.0  # loop time of the last sign of life while no response is going out
        self.request_started: float | None = None  # loop time of the first byte of a request not yet whole
        self.held = 0  # request body bytes this connection holds (counted in relay.buffered)
        self._new_request()

    # --- connection events -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        self.idle_since = self.loop.time()
        if len(self.relay.connections) >= self.relay.max_connections:
            # Turned away at once, so the descriptor is free again: holding it would starve /metrics.
            self.closed = True
            self.relay.turned_away += 1
            transport.write(CAP_REFUSAL)
            transport.close()
            return
        self.relay.connections.add(self)

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
        self.relay.connections.discard(self)
        self.pending.clear()
        if self.current is not None:
            self._finish(self.current, "client_disconnect")
        if self.connecting is not None and not self.connecting.done():
            self.connecting.cancel()  # an upstream connect for nobody (it can take CONNECT_TIMEOUT)
        if self.upstream is not None:
            self.upstream.transport.abort()  # how Ollama learns to stop generating for nobody
        # What this connection held goes now, not whenever the garbage collector finds the cycles
        # (parser <-> connection <-> upstream connection) that would keep it.
        self.relay.buffered -= self.held
        if self.held >= LARGE_BODY_BYTES:
            self.relay.let_go_large = True
        self.held = 0
        self.body = bytearray()
        self.parser = self.upstream = None

    def sweep(self, now: float) -> None:
        """The relay's periodic check: a request past REQUEST_TIMEOUT, or a connection idle past KEEPALIVE_TIMEOUT."""
        if self.closed:
            return
        if self.request_started is not None and now >= self.request_started + REQUEST_TIMEOUT:
            if self.refusal is None:
                self.refusal = Refusal(408, f"request not received whole within {REQUEST_TIMEOUT:g} s")
                if self.current is None:
                    self._next()
        elif self.current is None and not self.pending and now >= self.idle_since + KEEPALIVE_TIMEOUT:
            self._close()  # idle, or stalled inside a request (sending slowly is not idle)

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
        self.request_started = self.loop.time()

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
            raise Refusal(405, "CONNECT is not supported: this relay forwards only to its one upstream")
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
        if self.relay.buffered + len(body) > MAX_BUFFERED_BYTES:
            raise Refusal(503, "the proxy holds as many request bodies as it may: retry later")
        self.body += body
        self.held += len(body)
        self.relay.buffered += len(body)

    def on_message_complete(self) -> None:
        self.continue_due = False
        self.request_started = None
        parser = self.parser
        self.pending.append(
            Exchange(
                self.relay,
                parser.get_method(),
                self.url,
                self.headers,
                self.body,  # handed over, not copied: a body may be tens of MiB
                parser.should_keep_alive(),
                parser.get_http_version() == "1.0",
                self.relay.clock(),
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
                self.loop.call_soon(self.relay.begin, exchange)
        elif self.refusal is not None:
            refusal, self.refusal = self.refusal, None
            self._write_error(refusal.status, str(refusal), close=True)
        else:
            if self.continue_due:
                self.continue_due = False
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.idle_since = self.loop.time()

    def _send(self, exchange: Exchange) -> None:
        upstream = self.upstream
        if upstream is not None and not upstream.lost and not upstream.transport.is_closing():
            upstream.send(exchange)
        else:
            self.upstream = None
            self.connecting = asyncio.get_running_loop().create_task(self._connect_and_send(exchange))

    async def _connect_and_send(self, exchange: Exchange) -> None:
        relay = self.relay
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await asyncio.wait_for(
                loop.create_connection(
                    lambda: UpstreamConnection(self), relay.upstream_host, relay.upstream_port, ssl=relay.upstream_ssl
                ),
                CONNECT_TIMEOUT,
            )
        except OSError as exc:  # TimeoutError is an OSError
            reason = str(exc) or f"no connection within {CONNECT_TIMEOUT:.0f}s"
            log.warning(
                "%s %s: upstream %s unreachable: %s", relay.title, relay.instance, redact(relay.upstream_url), reason
            )
            if exchange is self.current and not self.closed:
                self._write_error(502, f"{relay.title}: upstream unreachable: {reason}", close=exchange.close_after)
                self._finish(exchange, "upstream_unreachable")
            return
        if self.closed or exchange is not self.current:
            upstream.transport.abort()
            return
        self.upstream = upstream
        if self.paused:
            upstream.transport.pause_reading()
        upstream.send(exchange)

    def forward(self, data: bytes) -> None:
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
        log.warning("%s %s: upstream stream broke: %s", self.relay.title, self.relay.instance, reason)
        if exchange.head_sent:
            self._finish(exchange, "upstream_broken")
            self._close()  # the client sees the stream end early, as it would directly
        else:
            self._write_error(502, f"{self.relay.title}: upstream closed the stream", close=exchange.close_after)
            self._finish(exchange, "upstream_broken")

    def _finish(self, exchange: Exchange, outcome: str) -> None:
        if exchange.done:
            return
        exchange.done = True
        self.current = None
        self.held -= len(exchange.body)
        self.relay.buffered -= len(exchange.body)
        if len(exchange.body) >= LARGE_BODY_BYTES:
            self.relay.let_go_large = True
        if exchange.observed:
            self.loop.call_soon(self.relay.end, exchange, outcome)
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
        via = self.relay.via
        self.transport.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: %d\r\n%s%s\r\n%s"
            % (
                status,
                HTTPStatus(status).phrase.encode(),
                len(body),
                b"Via: " + via + b"\r\n" if via else b"",
                b"Connection: close\r\n" if close else b"",
                body,
            )
        )
        if close:
            self._close()

    def _close(self) -> None:
        if not self.closed:
            self.transport.close()  # flushes what is buffered, then closes


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
        for data in exchange.upstream_request(self.client.relay):
            self.transport.write(data)

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
            self.client.loop.call_soon(self.client.relay.first_chunk, exchange)
        if self.complete:
            self.exchange = None
            if not self.keep_alive:
                self.transport.close()
            self.client.upstream_finished(exchange)

    def _flush(self) -> None:
        if self.out:
            self.client.forward(b"".join(self.out))
            self.out.clear()
            self.exchange.head_sent = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.parser = None  # no cycle through the parser keeps this connection (and its buffers) alive
        exchange = self.exchange
        if exchange is None or exchange.done:
            return
        self.exchange = None
        if self.until_eof:
            if exchange.chunked:
                self.client.forward(b"0\r\n\r\n")
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
        via = self.client.relay.via
        if via:
            head += (b"Via: ", via, b"\r\n")  # after the upstream's own Via lines: the list in hop order
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
            exchange.first_seen = self.client.relay.clock()
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
