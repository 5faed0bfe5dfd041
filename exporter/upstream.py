"""HTTP GETs against one engine instance over kept-alive connections, bounded by the scrape's deadline.

Plain http.client rather than requests: a scrape makes three to six of these calls, and
requests' per-call machinery cost several times more CPU than the call itself (see
bench/exporter_scrape.py). Proxy environment variables are deliberately not honoured:
engines are reached directly.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from servescope.urls import redact

# A metrics page or JSON payload larger than this is not something an engine sends; refuse it
# rather than hold it in memory.
MAX_BODY_BYTES = 16 * 1024 * 1024
HEADERS = {"Accept": "*/*", "User-Agent": "servescope-exporter"}


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


# What get_*(missing_ok=True) returns when the engine says the endpoint is off (404/501); distinct
# from a JSON `null` body, which is a malformed answer.
MISSING: Any = _Missing()


class UpstreamError(Exception):
    """The engine could not be read: down, too slow, an HTTP error status, or a malformed payload."""


class Upstream:
    """One engine's base URL plus the connections, clock and deadline handling used to read it.

    `deadline` arguments are absolute times on `clock`; every read stops there, so a slow engine
    costs at most the configured timeout however many endpoints a collector reads.
    `connection_factory(host, port, timeout)` makes a connection (tests may pass their own).
    """

    def __init__(
        self,
        base_url: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        connection_factory: Callable[..., http.client.HTTPConnection] | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.shown_url = redact(self.base_url)  # what logs and errors say: never the URL's password
        parts = urlsplit(self.base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port
        self.prefix = parts.path  # an engine behind a path prefix
        default = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self.connection_factory = connection_factory or default
        self.clock = clock
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _remaining(self, deadline: float, path: str) -> float:
        remaining = deadline - self.clock()
        if remaining <= 0:
            raise UpstreamError(f"GET {self.shown_url}{path}: no time left in this scrape")
        return remaining

    def _checkout(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            return self.connection_factory(self.host, self.port, timeout=timeout), False
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, True

    def _checkin(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < 4:
                self._idle.append(conn)
                return
        conn.close()

    def get_bytes(self, path: str, deadline: float, *, missing_ok: bool = False) -> Any:
        """The body of GET base_url+path; MISSING when missing_ok and the engine says 404/501 (feature off)."""
        url = self.shown_url + path
        for attempt in (1, 2):
            conn, reused = self._checkout(self._remaining(deadline, path))
            try:
                conn.request("GET", self.prefix + path, headers=HEADERS)
                resp = conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                conn.close()
                if reused and attempt == 1:
                    continue  # the engine closed an idle kept-alive connection: one fresh try
                raise UpstreamError(f"GET {url}: {_reason(exc)}") from None
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise UpstreamError(f"GET {url}: {_reason(exc)}") from None
            try:
                body = self._read_body(resp, deadline, url)
            except BaseException:
                conn.close()
                raise
            if resp.will_close:
                conn.close()
            else:
                self._checkin(conn)
            if missing_ok and resp.status in (404, 501):
                return MISSING
            if resp.status != 200:
                raise UpstreamError(f"GET {url}: HTTP {resp.status}")
            return body
        raise AssertionError("unreachable")

    def _read_body(self, resp: http.client.HTTPResponse, deadline: float, url: str) -> bytes:
        body = bytearray()
        try:
            # The socket timeout bounds each read, not the whole body: an engine dripping bytes
            # slowly is cut off here at the deadline.
            while chunk := resp.read(65536):
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise UpstreamError(f"GET {url}: body larger than {MAX_BODY_BYTES} bytes")
                if self.clock() > deadline:
                    raise UpstreamError(f"GET {url}: timed out while reading the body")
        except (OSError, http.client.HTTPException) as exc:
            raise UpstreamError(f"GET {url}: {_reason(exc)}") from None
        return bytes(body)

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
        except ValueError as exc:
            raise UpstreamError(f"GET {self.shown_url}{path}: malformed JSON ({exc})") from None

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "connection closed without a response"
    if isinstance(exc, http.client.HTTPException):
        return f"malformed HTTP response ({type(exc).__name__})"
    return " ".join(str(exc).split())[:200] or type(exc).__name__
