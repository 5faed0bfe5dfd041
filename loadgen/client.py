"""One streamed chat request and its measurement: TTFT, every inter-chunk gap, E2E, output tokens, from raw perf_counter stamps.

Definitions (docs/latency.md repeats them beside vLLM bench, GuideLLM and AIPerf):
  TTFT  send -> first chunk with NON-EMPTY content (vLLM's first chunk is an empty role chunk: skipped)
  ITL   every gap between consecutive content chunks, all kept
  E2E   send -> last content chunk
  TPOT  (E2E - TTFT) / (output_tokens - 1)
  output tokens: the server's `usage` (OpenAI, asked for with stream_options.include_usage) or
  Ollama's `eval_count`; counting content chunks is a fallback, flagged tokens_source="chunks".

Where the stamps come from: send = the clock as the request's bytes are handed to the socket (plain-HTTP
geventhttpclient: the request built and the pooled connection checked first), else just before the request is
handed to the HTTP client; on a connection opened beforehand where the scenario allows (`Transport.connect()`: a burst's users connect
before the gate opens). A chunk = the moment its bytes reached this host's socket: the kernel's receive
stamp (SO_TIMESTAMPNS, plain-HTTP geventhttpclient on Linux), else the clock as the socket read returns;
never after parsing, so neither JSON decoding nor the event loop serving 63 other streams first is in it.

The transport is geventhttpclient (what Locust's FastHttpUser uses), reached below its public API for
the stamps above: `check_geventhttpclient()` says in one line when an installed version lacks those
internals. Other transports register in TRANSPORTS behind the same interface (bench/ adds requests to
measure it beside this one).
"""

from __future__ import annotations

import base64
import enum
import json
import socket
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import gevent
from gevent import monkey as gevent_monkey
from gevent import socket as gevent_socket
from gevent.hub import Waiter
from geventhttpclient import HTTPClient
from geventhttpclient.connectionpool import ConnectionPool
from geventhttpclient.response import (
    HTTPConnectionClosed,
    HTTPParseError,
    HTTPResponse,
    HTTPResponseParser,
    HTTPSocketPoolResponse,
    HTTPSocketResponse,
)

from servescope.contracts.urls import redact
from servescope.engines.base import OLLAMA_API
from servescope.host.kernel_stamps import CMSG_SIZE, SO_TIMESTAMPNS, receive_stamp

# Ollama's final NDJSON object: the engine-side numbers the report cross-checks (nanoseconds).
OLLAMA_STATS = (
    "eval_count",
    "eval_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "load_duration",
    "total_duration",
    "done_reason",
)
ERROR_BODY_CHARS = 200


class ErrorKind(enum.StrEnum):
    """Why a request failed, as a bounded value: the client metrics' `outcome` label and the record's error_kind."""

    CONNECTION_REFUSED = "connection_refused"
    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    HTTP_OTHER = "http_other"
    TIMEOUT = "timeout"
    STREAM_CUT = "stream_cut"
    MALFORMED_CHUNK = "malformed_chunk"
    ENGINE_ERROR = "engine_error"
    INTERRUPTED = "interrupted"
    WORKER_LOST = "worker_lost"  # its load generator worker process died or went silent with it in flight
    OTHER = "other_error"


class StreamError(Exception):
    """A request that failed: its kind, and str() the one-line reason kept in the record and Locust's failures."""

    def __init__(self, kind: ErrorKind, message: str):
        super().__init__(message)
        self.kind = kind


class HttpClientError(RuntimeError):
    """The installed geventhttpclient lacks an internal this module relies on: one line for the terminal."""


@dataclass
class Measurement:
    """Raw stamps of one request; every derived number is a property computed from them."""

    started_at: float  # epoch seconds at send
    t_send: float  # perf_counter at send
    status: int = 0
    error: str | None = None
    error_kind: ErrorKind | None = None
    content_times: list[float] = field(default_factory=list)  # perf_counter per non-empty content chunk
    usage_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens the engine took from its cache, where it says so
    tokens_source: str | None = None
    engine_stats: dict[str, Any] = field(default_factory=dict)
    finished: bool = False  # saw [DONE] (OpenAI) or done:true (Ollama)
    t_end: float | None = None  # perf_counter when the exchange ended (ok or not)
    answer: list[str] | None = None  # the content's text, kept only when asked (a conversation's next turn needs it)

    @property
    def ok(self) -> bool:
        return self.error is None

    def record_fields(self) -> dict[str, Any]:
        """What RequestRecord takes from the measurement itself; the caller adds who sent what (engine, phase...)."""
        return {
            "started_at": self.started_at,
            "ok": self.ok,
            "status": self.status,
            "error": self.error,
            "error_kind": self.error_kind,
            "ttft_s": self.ttft_s,
            "e2e_s": self.e2e_s,
            "itl_s": self.itl_s,
            "tpot_s": self.tpot_s,
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "tokens_source": self.tokens_source,
            "content_chunks": len(self.content_times),
            "engine_stats": self.engine_stats,
            "cached_tokens": self.cached_tokens,
        }

    def fail(self, error: StreamError) -> None:
        self.error, self.error_kind = str(error), error.kind

    @property
    def ttft_s(self) -> float | None:
        return self.content_times[0] - self.t_send if self.content_times else None

    @property
    def e2e_s(self) -> float | None:
        return self.content_times[-1] - self.t_send if self.content_times else None

    @property
    def itl_s(self) -> list[float]:
        times = self.content_times
        return [b - a for a, b in zip(times, times[1:], strict=False)]

    @property
    def output_tokens(self) -> int | None:
        if self.usage_tokens is not None:
            return self.usage_tokens
        return len(self.content_times) if self.content_times else None

    @property
    def tpot_s(self) -> float | None:
        tokens = self.output_tokens
        if not tokens or tokens < 2 or self.ttft_s is None or self.e2e_s is None:
            return None
        return (self.e2e_s - self.ttft_s) / (tokens - 1)

    @property
    def text(self) -> str | None:
        return None if self.answer is None else "".join(self.answer)

    @property
    def elapsed_s(self) -> float | None:
        """send -> end of the exchange (a failure's partial time; Locust's response_time)."""
        end = self.t_end if self.t_end is not None else (self.content_times[-1] if self.content_times else None)
        return None if end is None else end - self.t_send


# --- the request body per API flavour ---


def chat_payload(
    api: str, model: str, prompt: str | list[dict[str, str]], max_tokens: int, temperature: float, ignore_eos: bool
) -> dict:
    """The streaming chat request: `prompt` is one user message's text, or the messages of a conversation so far."""
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    if api == OLLAMA_API:
        # Ollama has no ignore_eos; num_predict is its max_tokens.
        return {
            "model": model,
            "messages": messages,
            "stream": True,
            "options": {"num_predict": max_tokens, "temperature": temperature},
        }
    payload = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        payload["ignore_eos"] = True
    return payload


# --- transports: POST a body, hand back status and the body's bytes as they arrive, each with its arrival stamp ---

READ_SIZE = 16 * 1024
# Kernel receive stamps (servescope.host.kernel_stamps): a chunk's stamp does not wait for this process to be
# scheduled (at 64 streams the event loop serves them one after another) nor for anything parsed before it.
# The blocking select.select, also where Locust has monkey-patched it (looked up once, at import).
_REAL_SELECT = gevent_monkey.get_original("select", "select")
STAMP_MAX_AGE_S = 60.0  # a kernel stamp older than this when read is taken for a clock step, not a slow reader
# A stream's reader greenlet is woken for its first two reads with body bytes (an OpenAI stream's first is often the
# role chunk alone: Locust's live TTFT event waits for the first content), then once per this many reads, and for a
# read that holds the API's end (a server may hold the HTTP body's own end back): each wake is two greenlet switches,
# once a token before.
WAKE_EVERY = 16
FIRST_WAKES = 2
SSE_DONE = b"[DONE]"  # an OpenAI stream's last event's data
# A read holding one of these may hold the API's end: OpenAI's SSE end (with or without the space after "data:"),
# Ollama's final object. A hint for the wake only (content quoting it costs one wake); the parsers decide.
END_MARKERS = (SSE_DONE, b'"done":true', b'"done": true')
DRAIN_S = 1.0  # after [DONE] / done:true, how long the end of the HTTP body may take before the connection is dropped
# llhttp's feed, without HTTPResponse's wrapper around it (which only mends a HEAD response's body: never a POST's).
_PARSER_FEED = HTTPResponseParser.feed


class StreamResponse(Protocol):
    status: int

    def blocks(self, clock: Callable[[], float]) -> Iterator[tuple[float, bytes]]:
        """The body as it arrives: (stamp, bytes) per socket read, the stamp taken before any parsing."""

    def body_text(self) -> str: ...

    def close(self, complete: bool = False) -> None:
        """complete: the stream ended as the API says (the connection may go back to the pool)."""


class Transport(Protocol):
    name: str

    def connect(self) -> None:
        """Have an open keep-alive connection ready (best effort), so the next request does not pay a TCP
        handshake inside its TTFT; a burst calls it before its users are released."""

    def post(self, path: str, body: bytes) -> StreamResponse: ...

    def close(self) -> None: ...


class GeventTransport:
    """geventhttpclient (Locust's FastHttpUser client): a C parser, cooperative sockets, body reads straight off recvmsg()."""

    name = "geventhttpclient"

    def __init__(self, base_url: str, timeout: float, concurrency: int = 1):
        parts = urlsplit(base_url)
        self.prefix = parts.path.rstrip("/")
        # Kernel receive stamps need recvmsg() on the plain socket: not through TLS.
        self.kernel_stamps = parts.scheme == "http" and CMSG_SIZE > 0 and SO_TIMESTAMPNS is not None
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/x-ndjson"}
        if parts.username is not None:
            # user:password@ in the engine's URL (an engine behind a proxy with basic auth), as requests would send it.
            credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            headers["Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode("ascii")
        self.client = HTTPClient(
            parts.hostname,
            port=parts.port or (443 if parts.scheme == "https" else 80),
            ssl=parts.scheme == "https",
            concurrency=max(1, concurrency),
            connection_timeout=min(timeout, 10.0),
            network_timeout=timeout,
            block_size=READ_SIZE,
            headers=headers,
        )
        pool = self.client._connection_pool
        # The pool checks a kept-alive socket with gevent's select(timeout=0), which also does a gevent.sleep(0):
        # between a request's send stamp and its send every other greenlet of a burst would run first, and the
        # request's TTFT would count their time. The same check without the hub round trip:
        pool._is_socket_alive = _idle_socket_alive
        if self.kernel_stamps:
            pool.after_connect = _ask_for_receive_stamps  # geventhttpclient's hook for socket options
            # Its socket factory: each read that may carry the headers keeps its kernel stamp for post().
            self.read_stamps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
            self.send_stamps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
            pool._create_tcp_socket = lambda *family_type_proto: _StampedSocket(
                *family_type_proto, stamps=self.read_stamps, sends=self.send_stamps
            )

    def connect(self) -> None:
        pool = self.client._connection_pool
        try:
            sock = pool.get_socket()  # a live pooled socket, else a new connection
        except OSError:
            return  # the request itself will fail and record why
        pool.return_socket(sock)

    def post(self, path: str, body: bytes) -> _GeventResponse:
        try:
            response = self.client.request("POST", self.prefix + path, body=body)
        except HTTPConnectionClosed:
            # A kept-alive connection the server closed as the request went out (llama.cpp's server does,
            # intermittently, in e2e runs): no response byte came back, so it is sent once more on a new connection.
            response = self.client.request("POST", self.prefix + path, body=body)
        # The last read of this greenlet was the one that completed the headers: nothing yields between it and here.
        me = gevent.getcurrent()
        header_stamp = self.read_stamps.pop(me, None) if self.kernel_stamps else None
        sent = self.send_stamps.pop(me, None) if self.kernel_stamps else None
        return _GeventResponse(response, self.kernel_stamps, header_stamp, sent)

    def close(self) -> None:
        self.client.close()


def _idle_socket_alive(sock) -> bool:
    """An idle keep-alive socket is alive when it is not readable (readable = the server closed it, or stray bytes)."""
    if sock is None:
        return False
    try:
        if sock.fileno() < 0:
            return False
        readable, _, _ = _REAL_SELECT([sock], [], [], 0.0)
        return not readable
    except (OSError, ValueError):
        return False


def _ask_for_receive_stamps(sock) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        pass  # no kernel stamps: reads carry no ancillary data and are stamped by the clock as they return


class _StampedSocket(gevent_socket.socket):
    """A cooperative socket whose recv() keeps the kernel's receive stamp of what it read (on the perf_counter clock),
    by reading greenlet, in `stamps`. geventhttpclient reads a response's headers with recv(), and with them every
    body byte that had arrived: on a client many streams deep those can be the first content chunks, which were then
    stamped when parsed rather than when they arrived (a whole short answer can come with the headers, its
    connection back in the pool before the body is looked at)."""

    def __init__(self, *family_type_proto, stamps: weakref.WeakKeyDictionary, sends: weakref.WeakKeyDictionary):
        super().__init__(*family_type_proto)
        self._stamps = stamps
        self._sends = sends

    def sendall(self, data, flags: int = 0):
        # The send stamp as the request's bytes go to the kernel: the request built, the pooled socket checked.
        self._sends[gevent.getcurrent()] = (time.time(), time.perf_counter())
        return super().sendall(data, flags)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data, ancillary, _flags, _addr = self.recvmsg(bufsize, CMSG_SIZE, flags)
        self._stamps[gevent.getcurrent()] = _kernel_stamp(ancillary, time.perf_counter())
        return data


def _kernel_stamp(ancillary, now: float) -> float:
    """The kernel's receive time of a read's bytes on the perf_counter clock; `now` (read just after) without one."""
    stamp = receive_stamp(ancillary, time.perf_counter)
    # A wall-clock step between the kernel's stamp and its conversion would put it in the future or far back.
    return stamp if stamp is not None and now - STAMP_MAX_AGE_S < stamp <= now else now


class _Arrivals:
    """A stream's reads made in the event loop as its socket becomes readable, each stamped by the kernel; its reader
    greenlet woken for the first FIRST_WAKES reads with body bytes, then once per WAKE_EVERY reads, for the API's end,
    at the body's end and on a failure.

    Every read is the same read as before (recvmsg() on the socket's own C socket, its kernel stamp, llhttp taking the
    chunked framing off), made in the watcher's callback instead of after two greenlet switches (the hub to the reader
    and back) per token, which were a fifth of the client's CPU per token at 64 streams: the stamps are the kernel's,
    so when the reader parses a read changes none of them. The network timeout is counted from the last read on one
    timer per stream. Where gevent's socket lacks the internals, reads go through it as before (`of` answers None)."""

    __slots__ = (
        "_recvmsg", "hub", "watcher", "limit", "response", "pieces", "arrived", "failure", "ended", "waiter",
        "last", "timer", "woken",
    )  # fmt: skip

    def __init__(self, sock, response=None) -> None:
        self._recvmsg = sock._sock.recvmsg
        self.hub = sock.hub
        self.watcher = sock._read_event
        self.limit: float | None = sock.timeout  # gevent's network timeout (None: none)
        self.response = response  # the HTTP response whose body the reads carry (llhttp's parser)
        self.pieces: list[bytearray] = []  # the body's pieces llhttp handed over from the read being parsed
        self.arrived: list[tuple[float, bytes]] = []  # (kernel stamp, body bytes) per read, not yet taken
        self.failure: BaseException | None = None  # what ends the stream, raised in the reader once it took the rest
        self.ended = False  # no more reads: the body's end, the server's close or a failure
        self.waiter: Waiter | None = None  # the reader, while it waits
        self.last = time.perf_counter()  # the last read (the network timeout counts from it)
        self.timer = None
        self.woken = 0

    @classmethod
    def of(cls, sock, response=None) -> _Arrivals | None:
        try:
            return cls(sock, response)
        except AttributeError:
            return None

    def start(self) -> None:
        """The parser's body into `pieces`, the socket watched; the timer armed."""
        self.response._on_body = self.pieces.append
        self.watcher.start(self._readable)
        if self.limit is not None:
            self._arm(self.limit)

    def take(self) -> list[tuple[float, bytes]]:
        """What was read and not yet taken, in the order read, waiting for a read if there is none; [] once the stream
        ended, its failure (if any) raised after everything read before it was taken."""
        while not self.arrived:
            if self.ended:
                failure, self.failure = self.failure, None
                if failure is not None:
                    raise failure
                return []
            self.waiter = Waiter(self.hub)
            try:
                self.waiter.get()
            except BaseException as exc:  # killed while waiting (Ctrl-C, a phase's end): what was read counts first
                self.waiter = None
                self.stop()
                self.failure = self.failure or exc
                self.ended = True
        taken, self.arrived = self.arrived, []
        return taken

    def _readable(self) -> None:
        """The watcher's callback, in the event loop: one read, stamped and parsed; never raises."""
        try:
            data, ancillary, _flags, _addr = self._recvmsg(READ_SIZE, CMSG_SIZE)
        except BlockingIOError:
            return  # nothing after all
        except BaseException as exc:  # noqa: BLE001 - the reader raises it
            self._end(exc)
            return
        now = time.perf_counter()
        self.last = now
        stamp = _kernel_stamp(ancillary, now)
        response = self.response
        try:
            _PARSER_FEED(response, data)  # llhttp takes the chunked framing off into `pieces`
        except HTTPParseError as exc:
            # the server closed before the body's end: llhttp calls that incomplete
            self._end(EOFError("connection closed mid-stream") if not data else exc)
            return
        except BaseException as exc:  # noqa: BLE001 - the reader raises it
            self._end(exc)
            return
        pieces = self.pieces
        body = b""
        if pieces:
            body = bytes(pieces[0]) if len(pieces) == 1 else b"".join(pieces)
            self.arrived.append((stamp, body))
            pieces.clear()
        if response.message_complete:
            self._end(None)
        elif not data:
            self._end(EOFError("connection closed mid-stream"))
        elif self.waiter is not None and body:
            if self.woken < FIRST_WAKES or len(self.arrived) >= WAKE_EVERY or any(e in body for e in END_MARKERS):
                self._wake()

    def _end(self, failure: BaseException | None) -> None:
        self.failure = self.failure or failure
        self.ended = True
        self.stop()
        if self.waiter is not None:
            self._wake()

    def _wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        self.woken += 1
        waiter.switch(None)

    def _arm(self, after: float) -> None:
        self.timer = self.hub.loop.timer(after, ref=False)
        self.timer.start(self._expired)

    def _expired(self) -> None:
        """The timer, once per network timeout at most: the stream is timed out once nothing was read for as long."""
        self.timer.close()
        self.timer = None
        if self.ended:
            return
        left = self.last + self.limit - time.perf_counter()
        if left <= 0:
            self._end(TimeoutError("timed out"))  # as gevent's Timeout does
        else:
            self._arm(max(left, 1e-3))

    def stop(self) -> None:
        """The socket no longer watched, the timer closed (the stream's end, or its reader gone)."""
        self.watcher.stop()
        if self.timer is not None:
            self.timer.close()
            self.timer = None


class _GeventResponse:
    def __init__(
        self,
        response,
        kernel_stamps: bool = False,
        header_stamp: float | None = None,
        sent: tuple[float, float] | None = None,
    ):
        self.response = response
        self.status = response.status_code
        self.kernel_stamps = kernel_stamps
        self.header_stamp = header_stamp  # the kernel's stamp of the read that completed the headers
        self.sent = sent  # (time.time(), perf_counter) as the request went to the socket, where the transport saw it
        # A stop (GreenletExit, Ctrl-C) that reached the reader while reads it had not taken were buffered: the stream's
        # end may be among them, and its reader then never asks again; close() raises it, so the stop goes on.
        self.pending_stop: BaseException | None = None

    def blocks(self, clock: Callable[[], float]) -> Iterator[tuple[float, bytes]]:
        response = self.response
        kernel = self.kernel_stamps and clock is time.perf_counter  # kernel stamps convert to perf_counter only
        last = float("-inf")
        if response._body_buffer:  # body bytes that came with the headers: the header read's stamp
            last = self.header_stamp if kernel and self.header_stamp is not None else clock()
            yield last, _take(response._body_buffer)
        if not response.message_complete and response._sock is not None and kernel:
            arrivals = _Arrivals.of(response._sock, response)
            if arrivals is not None:
                arrivals.start()
                try:
                    while True:
                        try:
                            taken = arrivals.take()
                        except BaseException:
                            response.release()
                            raise
                        if not taken:
                            return
                        for stamp, block in taken:
                            # A read's kernel stamp is its last segment's: a later read's may be earlier than the stamp
                            # of bytes that came with the headers where the kernel gave none (the clock's, taken when
                            # parsed). Stamps never go back: a negative gap is no measurement (the run-folder reader
                            # refuses the record).
                            if stamp > last:
                                last = stamp
                            yield last, block
                finally:
                    arrivals.stop()
                    del response._on_body  # the class's again: what close() drains goes to _body_buffer
                    if arrivals.failure is not None and not isinstance(arrivals.failure, Exception):
                        self.pending_stop = arrivals.failure
        # The body's pieces as llhttp hands them over, without a Python call per piece: the parser calls the
        # instance's _on_body, which here is a list's append (its own appends them to _body_buffer in Python).
        pieces: list[bytearray] = []
        response._on_body = pieces.append
        try:
            while not response.message_complete:
                sock = response._sock
                if sock is None:
                    raise EOFError("connection closed mid-stream")
                try:
                    if kernel:
                        data, ancillary, _flags, _addr = sock.recvmsg(READ_SIZE, CMSG_SIZE)
                        stamp = _kernel_stamp(ancillary, clock())
                    else:
                        data = sock.recv(READ_SIZE)
                        stamp = clock()
                    _PARSER_FEED(response, data)  # llhttp takes the chunked framing off into `pieces`
                except HTTPParseError:
                    response.release()
                    if not data:  # the server closed before the body's end: llhttp calls that incomplete
                        raise EOFError("connection closed mid-stream") from None
                    raise
                except BaseException:
                    response.release()
                    raise
                if pieces:
                    last = max(stamp, last)  # stamps never go back (above)
                    yield last, bytes(pieces[0]) if len(pieces) == 1 else b"".join(pieces)
                    pieces.clear()
                if not data and not response.message_complete:
                    raise EOFError("connection closed mid-stream")
        finally:
            del response._on_body  # the class's again: what close() drains goes to _body_buffer

    def body_text(self) -> str:
        return self.response.read().decode("utf-8", "replace")

    def close(self, complete: bool = False) -> None:
        response = self.response
        stop, self.pending_stop = self.pending_stop, None
        if complete and stop is None and not response.message_complete and response._sock is not None:
            # The API's end came before the HTTP body's end (the terminating chunk is its own write): read it so the
            # connection goes back to the pool instead of the next request paying a TCP handshake.
            with gevent.Timeout(DRAIN_S, False):
                try:
                    while not response.message_complete and response._sock is not None:
                        data = response._sock.recv(READ_SIZE)
                        response.feed(data)
                        del response._body_buffer[:]
                        if not data:
                            break
                except Exception:  # noqa: BLE001 - the measurement is done; a broken tail only costs the connection
                    pass
        # A stream we stopped reading cannot go back to the pool half-read.
        if not response.message_complete and response._sock is not None and response._pool is not None:
            sock, pool = response._sock, response._pool
            response._sock = response._pool = None
            pool.release_socket(sock)  # closes it and frees the pool slot
        response.release()
        if stop is not None:
            raise stop


def _take(buffer: bytearray) -> bytes:
    data = bytes(buffer)
    del buffer[:]
    return data


# The transports `--http-client` can name; bench/ registers more to measure them beside this one.
TRANSPORTS: dict[str, type] = {"geventhttpclient": GeventTransport}


def make_transport(name: str, base_url: str, timeout: float, concurrency: int = 1) -> Transport:
    try:
        return TRANSPORTS[name](base_url, timeout=timeout, concurrency=concurrency)
    except KeyError:
        raise ValueError(f"unknown HTTP client {name!r}: expected one of {', '.join(TRANSPORTS)}") from None


# geventhttpclient below its public API, as GeventTransport and _GeventResponse use it. Not promised by its authors:
# pyproject.toml pins the range these were tested with, and this check names what a newer version took away.
_GEVENTHTTPCLIENT_INTERNALS: tuple[tuple[str, Callable[[], bool]], ...] = (
    ("HTTPClient._connection_pool", lambda: "_connection_pool" in HTTPClient.__init__.__code__.co_names),
    ("ConnectionPool._is_socket_alive", lambda: callable(getattr(ConnectionPool, "_is_socket_alive", None))),
    ("ConnectionPool._create_tcp_socket", lambda: callable(getattr(ConnectionPool, "_create_tcp_socket", None))),
    ("ConnectionPool.after_connect", lambda: callable(getattr(ConnectionPool, "after_connect", None))),
    (
        "ConnectionPool.get_socket/return_socket/release_socket",
        lambda: all(
            callable(getattr(ConnectionPool, n, None)) for n in ("get_socket", "return_socket", "release_socket")
        ),
    ),
    ("HTTPResponse._body_buffer", lambda: isinstance(getattr(HTTPResponse(), "_body_buffer", None), bytearray)),
    ("HTTPResponse.feed/message_complete", lambda: callable(getattr(HTTPResponse, "feed", None))),
    ("HTTPResponseParser.feed calling the instance's _on_body", lambda: _body_reaches_a_list()),
    ("HTTPSocketResponse._sock", lambda: "_sock" in HTTPSocketResponse.__init__.__code__.co_names),
    ("HTTPSocketPoolResponse._pool", lambda: "_pool" in HTTPSocketPoolResponse.__init__.__code__.co_names),
)


def _body_reaches_a_list() -> bool:
    """llhttp's feed hands the body to the instance's _on_body, so _GeventResponse.blocks can make it a list's append."""
    pieces: list[bytearray] = []
    response = HTTPResponse()
    response._on_body = pieces.append
    _PARSER_FEED(response, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    return pieces == [b"ok"] and response.message_complete and not response._body_buffer


def check_geventhttpclient() -> None:
    """Raise HttpClientError (one line) when the installed geventhttpclient lacks an internal used here."""
    missing = [name for name, present in _GEVENTHTTPCLIENT_INTERNALS if not _holds(present)]
    if missing:
        from importlib.metadata import version

        raise HttpClientError(
            f"geventhttpclient {version('geventhttpclient')} lacks {', '.join(missing)}, which loadgen/client.py "
            f"reads for its stamps: install the range pyproject.toml names (make install)"
        )


def _holds(check: Callable[[], bool]) -> bool:
    try:
        return bool(check())
    except Exception:  # noqa: BLE001 - a changed internal may fail in any way: it is missing all the same
        return False


# --- the measured exchange ---


def stream_chat(
    transport: Transport,
    path: str,
    api: str,
    payload: dict,
    on_first_content: Callable[[Measurement], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    into: list[Measurement] | None = None,
    keep_text: bool = False,
) -> Measurement:
    """Send one streaming chat request and stamp every content chunk; never raises for a failed request.

    `into` receives the measurement before the send, so a caller whose greenlet is killed mid-stream
    (Ctrl-C, runner stop) still holds the partial stamps. `keep_text` keeps the answer's text.
    """
    body = json.dumps(payload).encode()
    m = Measurement(started_at=time.time(), t_send=clock(), answer=[] if keep_text else None)
    if into is not None:
        into.append(m)
    response = None
    try:
        response = transport.post(path, body)
        sent = getattr(response, "sent", None)
        if sent is not None and clock is time.perf_counter:
            m.started_at, m.t_send = sent  # later than the stamp above by the request's building: none of it in TTFT
        m.status = response.status
        if response.status != 200:
            raise StreamError(
                _status_kind(response.status), f"HTTP {response.status}: {_error_message(response.body_text())}"
            )
        if api == OLLAMA_API:
            _read_ndjson(response, m, on_first_content, clock)
        else:
            _read_sse(response, m, on_first_content, clock)
        if not m.finished:
            raise StreamError(
                ErrorKind.STREAM_CUT,
                f"stream cut after {len(m.content_times)} content chunks (no {'done' if api == OLLAMA_API else '[DONE]'})",
            )
    except StreamError as exc:
        m.fail(exc)
    except Exception as exc:  # noqa: BLE001 - every transport failure becomes a recorded reason, the run goes on
        m.fail(_describe(exc, len(m.content_times)))
    finally:
        m.t_end = clock()
        if response is not None:
            try:
                response.close(complete=m.finished and m.error is None)
            except Exception:  # noqa: BLE001 - closing a broken socket must not hide the real reason
                pass
    if m.usage_tokens is None and m.content_times:
        m.tokens_source = "chunks"
    return m


def _stamped_lines(response: StreamResponse, clock) -> Iterator[tuple[float, Sequence[bytes]]]:
    """The lines each read completed, with its stamp; a last line without a newline too (one resumption per read,
    not per line: an SSE event is two lines)."""
    pending = b""
    for stamp, block in response.blocks(clock):
        if pending:
            block = pending + block
        elif block.find(b"\n") == len(block) - 2 and block.endswith(b"\n\n"):
            yield stamp, (block[:-2],)  # one SSE event and its blank line, as a stream's read mostly is
            continue
        lines = block.split(b"\n")
        pending = lines.pop()
        if lines:
            yield stamp, lines
    if pending:
        yield clock(), [pending]


# json.loads' own C scanner, called straight: loads() also sniffs the encoding of bytes and wraps the scanner in
# two Python calls and two regex matches, more than half of its cost on a 200-byte chunk. Same grammar, same errors.
_SCAN_JSON = json.JSONDecoder().scan_once


def _json_object(data: bytes, chunks: int) -> dict:
    try:
        text = data.decode("utf-8")
        event, end = _SCAN_JSON(text, 0)
    except (ValueError, StopIteration):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        event, end, text = None, -1, ""
    if end != len(text) or not isinstance(event, dict):
        raise StreamError(ErrorKind.MALFORMED_CHUNK, f"malformed chunk after {chunks} content chunks: {data[:80]!r}")
    return event


def _event(data: bytes, chunks: int) -> dict:
    """One chunk's object, of either stream: an error the engine sends mid-stream ends the request as its error."""
    event = _json_object(data, chunks)
    if event.get("error"):
        raise StreamError(
            ErrorKind.ENGINE_ERROR, f"engine error mid-stream after {chunks} content chunks: {_error_message(event)}"
        )
    return event


def _read_sse(response: StreamResponse, m: Measurement, on_first, clock) -> None:
    content_times = m.content_times
    for stamp, lines in _stamped_lines(response, clock):
        for line in lines:
            if not line.startswith(b"data:"):
                continue  # blank separators, comments (":"), event:/id: fields
            data = line[5:].strip()
            if data == SSE_DONE:
                m.finished = True
                return
            event = _event(data, len(content_times))
            for choice in event.get("choices") or ():
                delta = choice.get("delta") or {}
                # Reasoning models stream thinking as reasoning_content: it is output all the same.
                if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
                    content_times.append(stamp)
                    if len(content_times) == 1 and on_first is not None:
                        on_first(m)
                    if m.answer is not None and isinstance(delta.get("content"), str):
                        m.answer.append(delta["content"])
                    break
            usage = event.get("usage")
            if usage:
                if usage.get("completion_tokens") is not None:
                    m.usage_tokens = int(usage["completion_tokens"])
                    m.tokens_source = "usage"
                if usage.get("prompt_tokens") is not None:
                    m.prompt_tokens = int(usage["prompt_tokens"])
                # llama.cpp always, vLLM with --enable-prompt-tokens-details: the prompt tokens its cache supplied.
                details = usage.get("prompt_tokens_details")
                if isinstance(details, dict) and _is_count(details.get("cached_tokens")):
                    m.cached_tokens = details["cached_tokens"]
            timings = event.get("timings")
            if timings:
                m.engine_stats["timings"] = timings  # llama.cpp's own prompt/predicted ms
                if m.cached_tokens is None and isinstance(timings, dict) and _is_count(timings.get("cache_n")):
                    m.cached_tokens = timings["cache_n"]  # llama.cpp: prompt tokens reused from the slot's cache


def _read_ndjson(response: StreamResponse, m: Measurement, on_first, clock) -> None:
    content_times = m.content_times
    for stamp, lines in _stamped_lines(response, clock):
        for raw in lines:
            line = raw.strip()
            if not line:
                continue
            event = _event(line, len(content_times))
            message = event.get("message") or {}
            if message.get("content") or message.get("thinking"):
                content_times.append(stamp)
                if len(content_times) == 1 and on_first is not None:
                    on_first(m)
                if m.answer is not None and isinstance(message.get("content"), str):
                    m.answer.append(message["content"])
            if event.get("done"):
                m.finished = True
                for key in OLLAMA_STATS:
                    if key in event:
                        m.engine_stats[key if key == "done_reason" or not key.endswith("duration") else f"{key}_ns"] = (
                            event[key]
                        )
                if event.get("eval_count") is not None:
                    m.usage_tokens = int(event["eval_count"])
                    m.tokens_source = "eval_count"
                if event.get("prompt_eval_count") is not None:
                    m.prompt_tokens = int(event["prompt_eval_count"])
                return


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _error_message(body: str | dict) -> str:
    """The engine's own error text, on one line."""
    data: Any = body
    if isinstance(body, str):
        try:
            data = json.loads(body)
        except ValueError:
            data = body
    if isinstance(data, dict):
        err = data.get("error", data.get("message", data))
        if isinstance(err, dict):
            err = err.get("message", err)
        data = err
    return " ".join(str(data).split())[:ERROR_BODY_CHARS] or "(empty body)"


def _status_kind(status: int) -> ErrorKind:
    if 400 <= status < 500:
        return ErrorKind.HTTP_4XX
    if 500 <= status < 600:
        return ErrorKind.HTTP_5XX
    return ErrorKind.HTTP_OTHER


# What a transport raises, by type, outermost first; a wrapper (requests' ConnectionError around urllib3's
# around the socket's) is looked through to the exception it was raised from.
_EXCEPTION_KINDS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], ErrorKind], ...] = (
    (ConnectionRefusedError, ErrorKind.CONNECTION_REFUSED),
    ((TimeoutError, gevent.Timeout), ErrorKind.TIMEOUT),
    ((ConnectionError, EOFError, HTTPConnectionClosed), ErrorKind.STREAM_CUT),  # reset, aborted, broken pipe, EOF
)


def classify(exc: BaseException) -> ErrorKind:
    """The kind of a transport exception, from its type or the types it was raised from."""
    pending: list[object] = [exc]
    seen: set[int] = set()
    while pending and len(seen) < 16:
        current = pending.pop(0)
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        for types, kind in _EXCEPTION_KINDS:
            if isinstance(current, types):
                return kind
        pending += [current.__cause__, current.__context__, getattr(current, "reason", None)]
    return ErrorKind.OTHER


def _describe(exc: BaseException, chunks: int) -> StreamError:
    """One line for any transport exception, naming where in the stream it happened."""
    where = f"after {chunks} content chunks" if chunks else "before the first content chunk"
    kind = classify(exc)
    if kind is ErrorKind.CONNECTION_REFUSED:
        return StreamError(kind, "connection refused")
    if kind is ErrorKind.TIMEOUT:
        return StreamError(kind, f"timeout {where}")
    if kind is ErrorKind.STREAM_CUT:
        return StreamError(kind, f"stream cut {where}: {type(exc).__name__}")
    text = redact(" ".join(str(exc).split()))[:ERROR_BODY_CHARS]
    return StreamError(kind, f"{type(exc).__name__} {where}: {text}" if text else f"{type(exc).__name__} {where}")
