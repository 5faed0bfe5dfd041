"""HTTP GETs against one engine instance over kept-alive connections, each bounded as a whole by the scrape's deadline.

Raw sockets and llhttp (httptools, the proxy's parser too) rather than http.client or requests:
- the deadline bounds the whole fetch (name lookup, connect, TLS, request, status line, headers,
  body): every receive waits only for what is left of it. http.client's socket timeout bounds each
  read, so an engine trickling a few bytes at a time held a scrape many times past its budget;
- llhttp is strict where http.client is lenient: a body shorter than its Content-Length, a duplicate,
  negative or non-numeric Content-Length, Content-Length with chunked, control characters in a
  header are all errors here, never a page silently taken as complete;
- a call costs less CPU than with requests (see bench/exporter_scrape.py).
Proxy environment variables are deliberately not honoured: engines are reached directly.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any
from urllib.parse import urlsplit

import httptools

from exporter.heap import LARGE_BODY_BYTES
from servescope.urls import credentials, redact

# A metrics page or JSON payload larger than this is not something an engine sends; refuse it
# rather than hold it in memory.
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_HEAD_BYTES = 64 * 1024
IDLE_CONNECTIONS = 4  # kept-alive connections per engine: a scrape reads at most a few endpoints in turn
RECEIVE_BYTES = 256 * 1024


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


# What get_*(missing_ok=True) returns when the engine says the endpoint is off (404/501); distinct
# from a JSON `null` body, which is a malformed answer.
MISSING: Any = _Missing()


class UpstreamError(Exception):
    """The engine could not be read: down, too slow, an HTTP error status, or a malformed payload."""


class Unauthorized(UpstreamError):
    """The engine answered 401/403: it wants an API key the exporter lacks or got wrong."""


class _Closed(Exception):
    """The engine closed a connection before any byte of a response (a kept-alive one it had timed out)."""


class _Response:
    """httptools callbacks for one response; `complete` once its last byte has been read."""

    __slots__ = ("parser", "status", "head_bytes", "framed", "body", "complete", "keep_alive", "error")

    def __init__(self):
        self.parser: httptools.HttpResponseParser | None = None
        self.status = 0
        self.head_bytes = 0
        self.framed = False  # a Content-Length or Transfer-Encoding: else the body ends with the connection
        self.body = bytearray()
        self.complete = False
        self.keep_alive = False
        self.error = ""

    def on_message_begin(self) -> None:
        self.keep_alive = False  # bytes after the response: this connection is not reused

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value)
        if self.head_bytes > MAX_HEAD_BYTES:
            self.error = f"response head larger than {MAX_HEAD_BYTES} bytes"
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.body += body
        if len(self.body) > MAX_BODY_BYTES:
            self.error = f"body larger than {MAX_BODY_BYTES} bytes"

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200:  # an interim response: the real one follows on the same connection
            self.status, self.head_bytes, self.framed = 0, 0, False
            return
        if not self.complete:
            self.keep_alive = self.parser.should_keep_alive()  # only meaningful inside this callback
            self.complete = True

    @property
    def ends_at_close(self) -> bool:
        """A response whose body is everything up to the connection's end: complete when it closes."""
        return self.status >= 200 and not self.framed and self.status not in (204, 304)


class Upstream:
    """One engine's base URL plus the connections, clock and deadline handling used to read it.

    `deadline` arguments are absolute times on `clock`; every fetch stops there, so a slow engine
    costs at most the configured timeout however many endpoints a collector reads. `api_key` is sent
    as `Authorization: Bearer` (vLLM's and llama-server's --api-key); without one, a user:password in
    the URL is sent as Basic authentication.
    """

    def __init__(self, base_url: str, *, api_key: str = "", clock: Callable[[], float] = time.monotonic):
        self.base_url = base_url.rstrip("/")
        self.shown_url = redact(self.base_url)  # what logs and errors say: never the URL's password
        parts = urlsplit(self.base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path  # an engine behind a path prefix
        self.tls = ssl.create_default_context() if parts.scheme == "https" else None
        netloc = parts.netloc.rpartition("@")[2]
        headers = [f"Host: {netloc}", "Accept: */*", "User-Agent: servescope-exporter"]
        login = credentials(self.base_url)
        if api_key:
            headers.append(f"Authorization: Bearer {api_key}")
        elif login is not None:
            token = base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode("ascii")
            headers.append(f"Authorization: Basic {token}")
        self._headers = ("".join(f"{line}\r\n" for line in headers) + "\r\n").encode("latin-1")
        self.clock = clock
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._lookup: Future | None = None  # one name lookup at a time, however many scrapes wait on it
        self.large_read = False  # a body of LARGE_BODY_BYTES or more was read since the collector last looked
        try:
            ipaddress.ip_address(self.host)
            self._literal = True
        except ValueError:
            self._literal = False

    # --- one GET ----------------------------------------------------------------------------------
    def get_bytes(self, path: str, deadline: float, *, missing_ok: bool = False) -> Any:
        """The body of GET base_url+path; MISSING when missing_ok and the engine says 404/501 (feature off)."""
        url = self.shown_url + path
        request = f"GET {self.prefix}{path} HTTP/1.1\r\n".encode("latin-1") + self._headers
        for attempt in (1, 2):
            sock, reused = self._checkout(deadline, url)
            try:
                response = self._exchange(sock, request, deadline, url)
            except _Closed:
                sock.close()
                if reused and attempt == 1:
                    continue  # the engine closed an idle kept-alive connection: one fresh try
                raise UpstreamError(f"GET {url}: connection closed without a response") from None
            except BaseException:
                sock.close()
                raise
            if response.keep_alive:
                self._checkin(sock)
            else:
                sock.close()
            if missing_ok and response.status in (404, 501):
                return MISSING
            if response.status in (401, 403):
                raise Unauthorized(
                    f"GET {url}: HTTP {response.status} (an API key is needed, or the one given is wrong)"
                )
            if response.status != 200:
                raise UpstreamError(f"GET {url}: HTTP {response.status}")
            if len(response.body) >= LARGE_BODY_BYTES:
                self.large_read = True  # the collector gives the heap back once it is done with the page
            return bytes(response.body)
        raise AssertionError("unreachable")

    def _exchange(self, sock: socket.socket, request: bytes, deadline: float, url: str) -> _Response:
        response = _Response()
        parser = response.parser = httptools.HttpResponseParser(response)
        received = 0
        try:
            sock.settimeout(self._remaining(deadline, url))
            sock.sendall(request)
            while not response.complete:
                # Each receive waits only for what is left of the deadline: however the engine
                # paces its bytes, the fetch ends there.
                sock.settimeout(self._remaining(deadline, url))
                data = sock.recv(RECEIVE_BYTES)
                if not data:
                    if received == 0:
                        raise _Closed
                    if response.ends_at_close:
                        response.complete, response.keep_alive = True, False
                        break
                    raise UpstreamError(f"GET {url}: connection closed after {received} bytes of the response")
                received += len(data)
                parser.feed_data(data)
                if response.error:
                    raise UpstreamError(f"GET {url}: {response.error}")
        except (BrokenPipeError, ConnectionResetError):
            if received == 0:
                raise _Closed from None
            raise UpstreamError(f"GET {url}: connection reset after {received} bytes of the response") from None
        except httptools.HttpParserError as exc:
            if not response.complete:
                raise UpstreamError(f"GET {url}: malformed HTTP response ({exc})") from None
            response.keep_alive = False  # garbage after a whole response: the response stands, the connection goes
        except OSError as exc:
            raise UpstreamError(f"GET {url}: {_reason(exc)}") from None
        finally:
            # The parser holds the response (its callbacks) and the response the parser: a cycle, which only the
            # cyclic collector would free, with the body in it. Broken here, the body goes when the caller is done.
            response.parser = None
        return response

    # --- connections ------------------------------------------------------------------------------
    def _remaining(self, deadline: float, url: str) -> float:
        remaining = deadline - self.clock()
        if remaining <= 0:
            raise UpstreamError(f"GET {url}: timed out (no time left in this scrape)")
        return remaining

    def _checkout(self, deadline: float, url: str) -> tuple[socket.socket, bool]:
        while True:
            with self._lock:
                sock = self._idle.pop() if self._idle else None
            if sock is None:
                return self._connect(deadline, url), False
            if not select.select([sock], [], [], 0)[0]:
                return sock, True
            sock.close()  # readable while idle: the engine closed it, or sent bytes nobody asked for

    def _checkin(self, sock: socket.socket) -> None:
        with self._lock:
            if len(self._idle) < IDLE_CONNECTIONS:
                self._idle.append(sock)
                return
        sock.close()

    def _connect(self, deadline: float, url: str) -> socket.socket:
        last: OSError | None = None
        for family, kind, proto, _, address in self._addresses(deadline, url):
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(self._remaining(deadline, url))
                sock.connect(address)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return self._wrap_tls(sock, deadline, url) if self.tls is not None else sock
            except OSError as exc:
                sock.close()
                last = exc
            except BaseException:
                sock.close()
                raise
        raise UpstreamError(f"GET {url}: {_reason(last) if last else 'no address to connect to'}")

    def _addresses(self, deadline: float, url: str) -> list:
        if self._literal:
            return socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
        # getaddrinfo cannot be interrupted: it runs in a thread of its own, waited on until the
        # deadline only, and shared by the scrapes that come while it is still resolving.
        with self._lock:
            lookup = self._lookup
            if lookup is None or (lookup.done() and lookup.exception() is not None):
                lookup = self._lookup = Future()
                threading.Thread(target=self._resolve, args=(lookup,), daemon=True, name="resolve").start()
        try:
            addresses = lookup.result(timeout=self._remaining(deadline, url))
        except FutureTimeout:
            raise UpstreamError(f"GET {url}: timed out looking up {self.host}") from None
        except OSError as exc:
            raise UpstreamError(f"GET {url}: cannot look up {self.host}: {_reason(exc)}") from None
        with self._lock:
            if self._lookup is lookup:
                self._lookup = None  # the next new connection looks the name up again (a container may move)
        return addresses

    def _resolve(self, lookup: Future) -> None:
        try:
            lookup.set_result(socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM))
        except OSError as exc:
            lookup.set_exception(exc)

    def _wrap_tls(self, sock: socket.socket, deadline: float, url: str) -> ssl.SSLSocket:
        tls = self.tls.wrap_socket(sock, server_hostname=self.host, do_handshake_on_connect=False)
        tls.setblocking(False)
        while True:  # the handshake takes several round trips: each waits only for what is left
            try:
                tls.do_handshake()
                return tls
            except ssl.SSLWantReadError:
                ready = select.select([tls], [], [], self._remaining(deadline, url))[0]
            except ssl.SSLWantWriteError:
                ready = select.select([], [tls], [], self._remaining(deadline, url))[1]
            if not ready:
                tls.close()
                raise UpstreamError(f"GET {url}: timed out in the TLS handshake")

    # --- decoded bodies ---------------------------------------------------------------------------
    def get_text(self, path: str, deadline: float, *, missing_ok: bool = False) -> Any:
        body = self.get_bytes(path, deadline, missing_ok=missing_ok)
        if body is MISSING:
            return MISSING
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            raise UpstreamError(f"GET {self.shown_url}{path}: body is not UTF-8") from None

    def get_json(self, path: str, deadline: float, *, missing_ok: bool = False) -> Any:
        body = self.get_bytes(path, deadline, missing_ok=missing_ok)
        if body is MISSING:
            return MISSING
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise UpstreamError(f"GET {self.shown_url}{path}: malformed JSON ({exc})") from None

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error ({exc.reason or exc})"
    return " ".join(str(exc).split())[:200] or type(exc).__name__
