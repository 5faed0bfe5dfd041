"""One streamed chat request and its measurement: TTFT, every inter-chunk gap, E2E, output tokens, from raw perf_counter stamps.

Definitions (the README repeats them beside vLLM bench, GuideLLM and AIPerf):
  TTFT  send -> first chunk with NON-EMPTY content (vLLM's first chunk is an empty role chunk: skipped)
  ITL   every gap between consecutive content chunks, all kept
  E2E   send -> last content chunk
  TPOT  (E2E - TTFT) / (output_tokens - 1)
  output tokens: the server's `usage` (OpenAI, asked for with stream_options.include_usage) or
  Ollama's `eval_count`; counting content chunks is a fallback, flagged tokens_source="chunks".

Where the stamps come from: send = the clock just before the request is handed to the HTTP client, on a
connection opened beforehand where the scenario allows (`Transport.connect()`: a burst's users connect
before the gate opens). A chunk = the moment its bytes reached this host's socket: the kernel's receive
stamp (SO_TIMESTAMPNS, plain-HTTP geventhttpclient on Linux), else the clock as the socket read returns;
never after parsing, so neither JSON decoding nor the event loop serving 63 other streams first is in it.

Two HTTP transports sit behind one interface so `bench/loadgen_accuracy.py` can measure them side by
side: geventhttpclient (the default: what Locust's FastHttpUser uses) and requests.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import gevent
from gevent import monkey as gevent_monkey

from servescope.kernel_stamps import CMSG_SIZE, SO_TIMESTAMPNS, receive_stamp

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


class StreamError(Exception):
    """A request that failed: str() is the one-line reason kept in the record and Locust's failures."""


@dataclass
class Measurement:
    """Raw stamps of one request; every derived number is a property computed from them."""

    started_at: float  # epoch seconds at send
    t_send: float  # perf_counter at send
    status: int = 0
    error: str | None = None
    content_times: list[float] = field(default_factory=list)  # perf_counter per non-empty content chunk
    usage_tokens: int | None = None
    prompt_tokens: int | None = None
    tokens_source: str | None = None
    engine_stats: dict[str, Any] = field(default_factory=dict)
    finished: bool = False  # saw [DONE] (OpenAI) or done:true (Ollama)
    t_end: float | None = None  # perf_counter when the exchange ended (ok or not)

    @property
    def ok(self) -> bool:
        return self.error is None

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
    def elapsed_s(self) -> float | None:
        """send -> end of the exchange (a failure's partial time; Locust's response_time)."""
        end = self.t_end if self.t_end is not None else (self.content_times[-1] if self.content_times else None)
        return None if end is None else end - self.t_send


# --- the request body per API flavour ---


def chat_payload(api: str, model: str, prompt: str, max_tokens: int, temperature: float, ignore_eos: bool) -> dict:
    messages = [{"role": "user", "content": prompt}]
    if api == "ollama":
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
# Kernel receive stamps (servescope.kernel_stamps): a chunk's stamp does not wait for this process to be
# scheduled (at 64 streams the event loop serves them one after another) nor for anything parsed before it.
# The blocking select.select, also where Locust has monkey-patched it (looked up once, at import).
_REAL_SELECT = gevent_monkey.get_original("select", "select")
STAMP_MAX_AGE_S = 60.0  # a kernel stamp older than this when read is taken for a clock step, not a slow reader
DRAIN_S = 1.0  # after [DONE] / done:true, how long the end of the HTTP body may take before the connection is dropped


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

    def __init__(self, base_url: str, timeout: float = 120.0, concurrency: int = 1):
        from geventhttpclient import HTTPClient

        parts = urlsplit(base_url)
        self.prefix = parts.path.rstrip("/")
        # Kernel receive stamps need recvmsg() on the plain socket: not through TLS.
        self.kernel_stamps = parts.scheme == "http" and CMSG_SIZE > 0 and SO_TIMESTAMPNS is not None
        self.client = HTTPClient(
            parts.hostname,
            port=parts.port or 80,
            concurrency=max(1, concurrency),
            connection_timeout=min(timeout, 10.0),
            network_timeout=timeout,
            block_size=READ_SIZE,
            headers={"Content-Type": "application/json", "Accept": "text/event-stream, application/x-ndjson"},
        )
        pool = self.client._connection_pool
        # The pool checks a kept-alive socket with gevent's select(timeout=0), which also does a gevent.sleep(0):
        # between a request's send stamp and its send every other greenlet of a burst would run first (+17 ms
        # median TTFT at 64 users, measured). The same check without the hub round trip:
        pool._is_socket_alive = _idle_socket_alive
        if self.kernel_stamps:
            pool.after_connect = _ask_for_receive_stamps  # geventhttpclient's hook for socket options

    def connect(self) -> None:
        pool = self.client._connection_pool
        try:
            sock = pool.get_socket()  # a live pooled socket, else a new connection
        except OSError:
            return  # the request itself will fail and record why
        pool.return_socket(sock)

    def post(self, path: str, body: bytes) -> _GeventResponse:
        from geventhttpclient.response import HTTPConnectionClosed

        try:
            response = self.client.request("POST", self.prefix + path, body=body)
        except HTTPConnectionClosed:
            # A kept-alive connection the server closed as the request went out (llama.cpp's server does,
            # intermittently, in e2e runs): no response byte came back, so it is sent once more on a new connection.
            response = self.client.request("POST", self.prefix + path, body=body)
        return _GeventResponse(response, self.kernel_stamps)

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


def _kernel_stamp(ancillary, now: float) -> float:
    """The kernel's receive time of a read's bytes on the perf_counter clock; `now` (read just after) without one."""
    stamp = receive_stamp(ancillary, time.perf_counter)
    # A wall-clock step between the kernel's stamp and its conversion would put it in the future or far back.
    return stamp if stamp is not None and now - STAMP_MAX_AGE_S < stamp <= now else now


class _GeventResponse:
    def __init__(self, response, kernel_stamps: bool = False):
        self.response = response
        self.status = response.status_code
        self.kernel_stamps = kernel_stamps

    def blocks(self, clock: Callable[[], float]) -> Iterator[tuple[float, bytes]]:
        response = self.response
        kernel = self.kernel_stamps and clock is time.perf_counter  # kernel stamps convert to perf_counter only
        if response._body_buffer:  # body bytes that came with the headers
            yield clock(), _take(response._body_buffer)
        while not response.message_complete:
            sock = response._sock
            if sock is None:
                raise StreamError("connection closed mid-stream")
            try:
                if kernel:
                    data, ancillary, _flags, _addr = sock.recvmsg(READ_SIZE, CMSG_SIZE)
                    stamp = _kernel_stamp(ancillary, clock())
                else:
                    data = sock.recv(READ_SIZE)
                    stamp = clock()
                response.feed(data)  # llhttp takes the chunked framing off into _body_buffer
            except BaseException:
                response.release()
                raise
            if response._body_buffer:
                yield stamp, _take(response._body_buffer)
            if not data and not response.message_complete:
                raise StreamError("connection closed mid-stream")

    def body_text(self) -> str:
        return self.response.read().decode("utf-8", "replace")

    def close(self, complete: bool = False) -> None:
        response = self.response
        if complete and not response.message_complete and response._sock is not None:
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


def _take(buffer: bytearray) -> bytes:
    data = bytes(buffer)
    del buffer[:]
    return data


class RequestsTransport:
    """requests + urllib3: the common choice; measured against geventhttpclient in bench/loadgen_accuracy.py."""

    name = "requests"

    def __init__(self, base_url: str, timeout: float = 120.0, concurrency: int = 1):
        import requests
        from requests.adapters import HTTPAdapter

        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=max(1, concurrency)))
        self.session.headers.update({"Content-Type": "application/json"})

    def connect(self) -> None:
        try:
            pool = self.session.get_adapter(self.base_url).poolmanager.connection_from_url(self.base_url)
            conn = pool._get_conn()
        except Exception:  # noqa: BLE001 - warming is best effort: the request reports its own failure
            return
        try:
            if conn.sock is None:
                conn.connect()
        except OSError:
            conn.close()
        finally:
            pool._put_conn(conn)

    def post(self, path: str, body: bytes) -> _RequestsResponse:
        return _RequestsResponse(
            self.session.post(
                self.base_url + path, data=body, stream=True, timeout=(min(self.timeout, 10.0), self.timeout)
            )
        )

    def close(self) -> None:
        self.session.close()


class _RequestsResponse:
    def __init__(self, response):
        self.response = response
        self.status = response.status_code

    def blocks(self, clock: Callable[[], float]) -> Iterator[tuple[float, bytes]]:
        # chunk_size=None: each piece as the socket delivers it, never waiting to fill a buffer.
        for piece in self.response.iter_content(chunk_size=None):
            yield clock(), piece

    def body_text(self) -> str:
        return self.response.text

    def close(self, complete: bool = False) -> None:
        self.response.close()


TRANSPORTS: dict[str, type] = {"geventhttpclient": GeventTransport, "requests": RequestsTransport}


def make_transport(name: str, base_url: str, timeout: float = 120.0, concurrency: int = 1) -> Transport:
    try:
        return TRANSPORTS[name](base_url, timeout=timeout, concurrency=concurrency)
    except KeyError:
        raise ValueError(f"unknown HTTP client {name!r}: expected one of {', '.join(TRANSPORTS)}") from None


# --- the measured exchange ---


def stream_chat(
    transport: Transport,
    path: str,
    api: str,
    payload: dict,
    on_first_content: Callable[[Measurement], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    into: list[Measurement] | None = None,
) -> Measurement:
    """Send one streaming chat request and stamp every content chunk; never raises for a failed request.

    `into` receives the measurement before the send, so a caller whose greenlet is killed mid-stream
    (Ctrl-C, runner stop) still holds the partial stamps.
    """
    body = json.dumps(payload).encode()
    m = Measurement(started_at=time.time(), t_send=clock())
    if into is not None:
        into.append(m)
    response = None
    try:
        response = transport.post(path, body)
        m.status = response.status
        if response.status != 200:
            raise StreamError(f"HTTP {response.status}: {_error_message(response.body_text())}")
        if api == "ollama":
            _read_ndjson(response, m, on_first_content, clock)
        else:
            _read_sse(response, m, on_first_content, clock)
        if not m.finished:
            raise StreamError(
                f"stream cut after {len(m.content_times)} content chunks (no {'done' if api == 'ollama' else '[DONE]'})"
            )
    except StreamError as exc:
        m.error = str(exc)
    except Exception as exc:  # noqa: BLE001 - every transport failure becomes a recorded reason, the run goes on
        m.error = _describe(exc, len(m.content_times))
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


def _stamped_lines(response: StreamResponse, clock) -> Iterator[tuple[float, bytes]]:
    """Each line of the body with the stamp of the read that completed it; a last line without a newline too."""
    pending = b""
    for stamp, block in response.blocks(clock):
        if pending:
            block = pending + block
        lines = block.split(b"\n")
        pending = lines.pop()
        for line in lines:
            yield stamp, line
    if pending:
        yield clock(), pending


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
        raise StreamError(f"malformed chunk after {chunks} content chunks: {data[:80]!r}")
    return event


def _read_sse(response: StreamResponse, m: Measurement, on_first, clock) -> None:
    content_times = m.content_times
    for stamp, line in _stamped_lines(response, clock):
        if not line.startswith(b"data:"):
            continue  # blank separators, comments (":"), event:/id: fields
        data = line[5:].strip()
        if data == b"[DONE]":
            m.finished = True
            return
        event = _json_object(data, len(content_times))
        if event.get("error"):
            raise StreamError(
                f"engine error mid-stream after {len(content_times)} content chunks: {_error_message(event)}"
            )
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            # Reasoning models stream thinking as reasoning_content: it is output all the same.
            if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
                content_times.append(stamp)
                if len(content_times) == 1 and on_first is not None:
                    on_first(m)
                break
        usage = event.get("usage")
        if usage:
            if usage.get("completion_tokens") is not None:
                m.usage_tokens = int(usage["completion_tokens"])
                m.tokens_source = "usage"
            if usage.get("prompt_tokens") is not None:
                m.prompt_tokens = int(usage["prompt_tokens"])
        if event.get("timings"):
            m.engine_stats["timings"] = event["timings"]  # llama.cpp's own prompt/predicted ms


def _read_ndjson(response: StreamResponse, m: Measurement, on_first, clock) -> None:
    content_times = m.content_times
    for stamp, raw in _stamped_lines(response, clock):
        line = raw.strip()
        if not line:
            continue
        event = _json_object(line, len(content_times))
        if event.get("error"):
            raise StreamError(
                f"engine error mid-stream after {len(content_times)} content chunks: {_error_message(event)}"
            )
        message = event.get("message") or {}
        if message.get("content") or message.get("thinking"):
            content_times.append(stamp)
            if len(content_times) == 1 and on_first is not None:
                on_first(m)
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


def _describe(exc: BaseException, chunks: int) -> str:
    """One line for any transport exception, naming where in the stream it happened."""
    where = f"after {chunks} content chunks" if chunks else "before the first content chunk"
    if isinstance(exc, ConnectionRefusedError) or "refused" in str(exc).lower():
        return "connection refused"
    if (
        isinstance(exc, socket.timeout | TimeoutError)
        or "timed out" in str(exc).lower()
        or type(exc).__name__ in ("Timeout", "ReadTimeout", "ConnectTimeout")
    ):
        return f"timeout {where}"
    if isinstance(exc, ConnectionResetError | BrokenPipeError) or any(
        word in str(exc).lower() for word in ("closed", "eof", "incomplete", "reset")
    ):
        return f"stream cut {where}: {type(exc).__name__}"
    text = " ".join(str(exc).split())[:ERROR_BODY_CHARS]
    return f"{type(exc).__name__} {where}: {text}" if text else f"{type(exc).__name__} {where}"
