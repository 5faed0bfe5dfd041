"""One streamed chat request and its measurement: TTFT, every inter-chunk gap, E2E, output tokens, from raw perf_counter stamps.

Definitions (the README repeats them beside vLLM bench, GuideLLM and AIPerf):
  TTFT  send -> first chunk with NON-EMPTY content (vLLM's first chunk is an empty role chunk: skipped)
  ITL   every gap between consecutive content chunks, all kept
  E2E   send -> last content chunk
  TPOT  (E2E - TTFT) / (output_tokens - 1)
  output tokens: the server's `usage` (OpenAI, asked for with stream_options.include_usage) or
  Ollama's `eval_count`; counting content chunks is a fallback, flagged tokens_source="chunks".

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

# Ollama's final NDJSON object: the engine-side numbers the report cross-checks (nanoseconds).
OLLAMA_STATS = ("eval_count", "eval_duration", "prompt_eval_count", "prompt_eval_duration", "load_duration",
                "total_duration", "done_reason")
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
        return {"model": model, "messages": messages, "stream": True,
                "options": {"num_predict": max_tokens, "temperature": temperature}}
    payload = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature,
               "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        payload["ignore_eos"] = True
    return payload


# --- transports: POST a body, hand back status and the body's lines as they arrive ---

class StreamResponse(Protocol):
    status: int

    def lines(self) -> Iterator[bytes]: ...

    def body_text(self) -> str: ...

    def close(self) -> None: ...


class Transport(Protocol):
    name: str

    def post(self, path: str, body: bytes) -> StreamResponse: ...

    def close(self) -> None: ...


class GeventTransport:
    """geventhttpclient (Locust's FastHttpUser client): a C parser, cooperative sockets, line reads straight off recv()."""

    name = "geventhttpclient"

    def __init__(self, base_url: str, timeout: float = 120.0, concurrency: int = 1):
        from geventhttpclient import HTTPClient

        parts = urlsplit(base_url)
        self.prefix = parts.path.rstrip("/")
        self.client = HTTPClient(parts.hostname, port=parts.port or 80, concurrency=max(1, concurrency),
                                 connection_timeout=min(timeout, 10.0), network_timeout=timeout,
                                 headers={"Content-Type": "application/json", "Accept": "text/event-stream, application/x-ndjson"})

    def post(self, path: str, body: bytes) -> _GeventResponse:
        return _GeventResponse(self.client.request("POST", self.prefix + path, body=body))

    def close(self) -> None:
        self.client.close()


class _GeventResponse:
    def __init__(self, response):
        self.response = response
        self.status = response.status_code

    def lines(self) -> Iterator[bytes]:
        readline = self.response.readline
        while True:
            line = readline(b"\n")
            if not line:
                if not self.response.message_complete:
                    raise StreamError("connection closed mid-stream")
                return
            yield line

    def body_text(self) -> str:
        return self.response.read().decode("utf-8", "replace")

    def close(self) -> None:
        # A stream we stopped reading cannot go back to the pool half-read.
        response = self.response
        if not response.message_complete and response._sock is not None and response._pool is not None:
            sock, pool = response._sock, response._pool
            response._sock = response._pool = None
            pool.release_socket(sock)  # closes it and frees the pool slot
        response.release()


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

    def post(self, path: str, body: bytes) -> _RequestsResponse:
        return _RequestsResponse(self.session.post(self.base_url + path, data=body, stream=True,
                                                   timeout=(min(self.timeout, 10.0), self.timeout)))

    def close(self) -> None:
        self.session.close()


class _RequestsResponse:
    def __init__(self, response):
        self.response = response
        self.status = response.status_code

    def lines(self) -> Iterator[bytes]:
        pending = b""
        # chunk_size=None: yield each piece as the socket delivers it, never wait to fill a buffer.
        for piece in self.response.iter_content(chunk_size=None):
            pending += piece
            while True:
                cut = pending.find(b"\n")
                if cut < 0:
                    break
                yield pending[: cut + 1]
                pending = pending[cut + 1:]
        if pending:
            yield pending

    def body_text(self) -> str:
        return self.response.text

    def close(self) -> None:
        self.response.close()


TRANSPORTS: dict[str, type] = {"geventhttpclient": GeventTransport, "requests": RequestsTransport}


def make_transport(name: str, base_url: str, timeout: float = 120.0, concurrency: int = 1) -> Transport:
    try:
        return TRANSPORTS[name](base_url, timeout=timeout, concurrency=concurrency)
    except KeyError:
        raise ValueError(f"unknown HTTP client {name!r}: expected one of {', '.join(TRANSPORTS)}") from None


# --- the measured exchange ---

def stream_chat(transport: Transport, path: str, api: str, payload: dict,
                on_first_content: Callable[[Measurement], None] | None = None,
                clock: Callable[[], float] = time.perf_counter, into: list[Measurement] | None = None) -> Measurement:
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
            raise StreamError(f"stream cut after {len(m.content_times)} content chunks (no {'done' if api == 'ollama' else '[DONE]'})")
    except StreamError as exc:
        m.error = str(exc)
    except Exception as exc:  # noqa: BLE001 - every transport failure becomes a recorded reason, the run goes on
        m.error = _describe(exc, len(m.content_times))
    finally:
        m.t_end = clock()
        if response is not None:
            try:
                response.close()
            except Exception:  # noqa: BLE001 - closing a broken socket must not hide the real reason
                pass
    if m.usage_tokens is None and m.content_times:
        m.tokens_source = "chunks"
    return m


def _read_sse(response: StreamResponse, m: Measurement, on_first, clock) -> None:
    for raw in response.lines():
        stamp = clock()
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue  # blank separators, comments (":"), event:/id: fields
        data = line[5:].strip()
        if data == b"[DONE]":
            m.finished = True
            return
        try:
            event = json.loads(data)
        except ValueError:
            raise StreamError(f"malformed chunk after {len(m.content_times)} content chunks: {data[:80]!r}") from None
        if not isinstance(event, dict):
            raise StreamError(f"malformed chunk after {len(m.content_times)} content chunks: {data[:80]!r}")
        if event.get("error"):
            raise StreamError(f"engine error mid-stream after {len(m.content_times)} content chunks: {_error_message(event)}")
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            # Reasoning models stream thinking as reasoning_content: it is output all the same.
            if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
                m.content_times.append(stamp)
                if len(m.content_times) == 1 and on_first is not None:
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
    for raw in response.lines():
        stamp = clock()
        line = raw.strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            raise StreamError(f"malformed chunk after {len(m.content_times)} content chunks: {line[:80]!r}") from None
        if not isinstance(event, dict):
            raise StreamError(f"malformed chunk after {len(m.content_times)} content chunks: {line[:80]!r}")
        if event.get("error"):
            raise StreamError(f"engine error mid-stream after {len(m.content_times)} content chunks: {_error_message(event)}")
        message = event.get("message") or {}
        if message.get("content") or message.get("thinking"):
            m.content_times.append(stamp)
            if len(m.content_times) == 1 and on_first is not None:
                on_first(m)
        if event.get("done"):
            m.finished = True
            for key in OLLAMA_STATS:
                if key in event:
                    m.engine_stats[key if key == "done_reason" or not key.endswith("duration") else f"{key}_ns"] = event[key]
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
    if isinstance(exc, socket.timeout | TimeoutError) or "timed out" in str(exc).lower() or type(exc).__name__ in ("Timeout", "ReadTimeout", "ConnectTimeout"):
        return f"timeout {where}"
    if (isinstance(exc, ConnectionResetError | BrokenPipeError)
            or any(word in str(exc).lower() for word in ("closed", "eof", "incomplete", "reset"))):
        return f"stream cut {where}: {type(exc).__name__}"
    text = " ".join(str(exc).split())[:ERROR_BODY_CHARS]
    return f"{type(exc).__name__} {where}: {text}" if text else f"{type(exc).__name__} {where}"
