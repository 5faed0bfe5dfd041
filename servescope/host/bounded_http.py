"""Every HTTP read of another service (an engine's own endpoints, Prometheus' API, an exporter's page), bounded and safe to echo.

The one client for what servescope reads but does not serve: the exporter's reads of engines (exporter/upstream.py),
the run's sampler, quick's discovery, the report's and the plan's Prometheus queries, `exporter check`. Whatever the
other end sends, an exchange:
- ends by one deadline over all of it (name lookup, connect, TLS, request, status line, headers, body): every
  receive waits only for what is left of it, so a server dripping a byte a second costs the deadline, no more
  (a socket timeout bounds each read: it held a scrape many times past its budget);
- holds at most `max_bytes` of body (MAX_BODY_BYTES unless the caller says less) and MAX_HEAD_BYTES of head: a
  Content-Length past the cap is refused before any of the body is read;
- is framed strictly (llhttp, the proxy's parser too): a body shorter than its Content-Length, a duplicate,
  negative or non-numeric Content-Length, Content-Length with chunked, control characters in a header are
  errors, never a page silently taken as complete;
- follows a redirect only within the origin it was sent to (scheme, host, port), at most MAX_REDIRECTS: a 302 to
  another host or port is an error, so credentials and queries never go where the user did not send them;
- sends a URL's user:password as Basic authentication (or an API key as a Bearer token), and never shows them:
  every message names the URL with its credentials masked and carries only printable text (servescope/text/printable.py).
`parse_json` reads a body as JSON with its depth checked (MAX_JSON_DEPTH): `[` x 200,000 is one error, never a
RecursionError. Proxy environment variables are deliberately not honoured: the services are reached directly.
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
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import httptools

from servescope.contracts.urls import credentials, redact
from servescope.text import printable

# A metrics page or JSON payload larger than this is not something an engine or Prometheus sends here; refuse it
# rather than hold it in memory.
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_HEAD_BYTES = 64 * 1024
# Deeper than any answer servescope reads (a Prometheus answer is 5 levels, an engine's /props 4).
MAX_JSON_DEPTH = 64
MAX_REDIRECTS = 3
REDIRECTS = frozenset((301, 302, 303, 307, 308))
IDLE_CONNECTIONS = 4  # kept-alive connections per origin: a reader asks a few endpoints in turn
RECEIVE_BYTES = 256 * 1024
KNOWN_TARGETS = 64  # request targets an origin keeps made (a reader asks a few, again and again)
# What a request target may hold as sent: a redirect's Location is re-quoted to it (no space, CR or LF).
_TARGET_SAFE = "/?&=%:@!$'()*+,;~-._"


class ServiceError(Exception):
    """Another service could not be read: one printable line, its URL's credentials masked. `timed_out` and
    `unreachable` say which of the usual causes it was (its callers word those in their own terms)."""

    def __init__(self, message: str, *, reason: str = "", timed_out: bool = False, unreachable: bool = False):
        super().__init__(printable.line(message, limit=400))
        self.reason = printable.line(reason) if reason else str(self)  # the words after "GET URL: "
        self.timed_out = timed_out
        self.unreachable = unreachable


class _Closed(Exception):
    """The service closed a connection before any byte of a response (a kept-alive one it had timed out)."""


@dataclass
class Answer:
    """One response, whole: its status, its headers (lower-case names) and its body."""

    url: str  # the URL that answered, credentials masked (after a redirect within the origin: where it led)
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self, max_depth: int = MAX_JSON_DEPTH) -> Any:
        """The body as JSON; ServiceError (one line) for anything else or anything nested past `max_depth`."""
        return parse_json(self.body, f"GET {self.url}", max_depth=max_depth)


class _Response:
    """httptools callbacks for one response; `complete` once its last byte has been read."""

    __slots__ = ("parser", "status", "head_bytes", "framed", "headers", "body", "complete", "keep_alive", "error")
    __slots__ += ("max_bytes", "head_done", "head_only")

    def __init__(self, max_bytes: int, head_only: bool = False):
        self.parser: httptools.HttpResponseParser | None = None
        self.max_bytes = max_bytes
        self.head_only = head_only  # the body is not read: what it announces is no concern
        self.status = 0
        self.head_bytes = 0
        self.framed = False  # a Content-Length or Transfer-Encoding: else the body ends with the connection
        self.headers: dict[str, str] = {}
        self.head_done = False
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
            return
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text
        if key in ("content-length", "transfer-encoding"):
            self.framed = True
        if key == "content-length" and not self.head_only and text.strip().isdigit() and int(text) > self.max_bytes:
            self.error = f"body larger than {self.max_bytes} bytes (Content-Length {int(text)})"

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.head_done = self.status >= 200

    def on_body(self, body: bytes) -> None:
        self.body += body
        if len(self.body) > self.max_bytes:
            self.error = f"body larger than {self.max_bytes} bytes"

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200:  # an interim response: the real one follows on the same connection
            self.status, self.head_bytes, self.framed, self.headers = 0, 0, False, {}
            return
        if not self.complete:
            self.keep_alive = self.parser.should_keep_alive()  # only meaningful inside this callback
            self.complete = True

    @property
    def ends_at_close(self) -> bool:
        """A response whose body is everything up to the connection's end: complete when it closes."""
        return self.status >= 200 and not self.framed and self.status not in (204, 304)


class Origin:
    """One service's base URL (scheme, host, port, path prefix, credentials) and its kept-alive connections.

    `deadline` arguments are absolute times on `clock`; every exchange stops there, however the other end paces
    its bytes. `api_key` is sent as `Authorization: Bearer`; without one, a user:password in the URL is sent as
    Basic authentication. Errors are `error` (a ServiceError subclass: the exporter's UpstreamError).
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str = "",
        clock: Callable[[], float] = time.monotonic,
        user_agent: str = "servescope",
        accept: str = "*/*",
        error: type[ServiceError] = ServiceError,
    ):
        self.base_url = base_url.rstrip("/")
        self.shown_url = printable.line(redact(self.base_url))  # what messages say: never the URL's password
        try:
            parts = urlsplit(self.base_url)
        except ValueError:  # "http://[::1" and its kind
            raise error(f"{self.shown_url}: not an http(s)://HOST:PORT URL") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise error(f"{self.shown_url}: not an http(s)://HOST:PORT URL")
        self.scheme = parts.scheme
        self.host = parts.hostname
        try:
            self.port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise error(f"{self.shown_url}: the port must be a number from 1 to 65535") from None
        self.prefix = quote(parts.path, safe=_TARGET_SAFE)  # a service behind a path prefix
        self.tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.error = error
        netloc = self._netloc = parts.netloc.rpartition("@")[2]
        self.shown_root = printable.line(redact(f"{parts.scheme}://{parts.netloc}"))
        headers = [f"Host: {netloc}", f"Accept: {accept}", f"User-Agent: {user_agent}"]
        login = credentials(self.base_url)
        if api_key:
            headers.append(f"Authorization: Bearer {api_key}")
        elif login is not None:
            token = base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode("ascii")
            headers.append(f"Authorization: Basic {token}")
        if any(c in line for line in headers for c in "\r\n"):
            raise error(f"{self.shown_url}: a header would carry a line break (in the URL or the API key)")
        self._headers = ("".join(f"{line}\r\n" for line in headers) + "\r\n").encode("latin-1", errors="replace")
        self.clock = clock
        self._requests: dict[str, tuple[str, bytes]] = {}
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._lookup: Future | None = None  # one name lookup at a time, however many readers wait on it
        try:
            ipaddress.ip_address(self.host)
            self._literal = True
        except ValueError:
            self._literal = False
        self._numeric: list | None = None  # a literal host's addresses, once asked for

    def _fail(self, url: str, reason: str, *, timed_out: bool = False, unreachable: bool = False) -> ServiceError:
        return self.error(f"GET {url}: {reason}", reason=reason, timed_out=timed_out, unreachable=unreachable)

    @property
    def root(self) -> tuple[str, str, int]:
        return self.scheme, self.host.lower(), self.port

    # --- one GET ----------------------------------------------------------------------------------
    def get(
        self,
        path: str,
        deadline: float,
        *,
        max_bytes: int = MAX_BODY_BYTES,
        redirects: int = 0,
        head_only: bool = False,
    ) -> Answer:
        """GET base_url+path, any status; a redirect within the origin followed (at most `redirects` of them), one
        to another origin an error. `head_only`: the status and headers, the body left unread (and the
        connection closed)."""
        target = f"{self.prefix}{path}"
        for _ in range(redirects + 1):
            answer = self._fetch(target, deadline, max_bytes, head_only)
            if answer.status not in REDIRECTS or not redirects:
                return answer
            target = self._same_origin(answer, target)
        raise self._fail(answer.url, f"more than {redirects} redirects")

    def _same_origin(self, answer: Answer, target: str) -> str:
        """Where a redirect leads, as a request target on this origin; an error when it leads elsewhere."""
        location = answer.headers.get("location", "").strip()
        if not location:
            raise self._fail(answer.url, f"HTTP {answer.status} without a Location")
        try:
            there = urlsplit(urljoin(f"{self.scheme}://{self._netloc}{target}", location))
            root = (
                there.scheme,
                (there.hostname or "").lower(),
                there.port or (443 if there.scheme == "https" else 80),
            )
        except ValueError:  # a Location that is no URL ("http://[x", a port of letters) leads nowhere here
            root = None
        if root != self.root:
            shown = printable.line(redact(location), limit=120)
            raise self._fail(answer.url, f"redirected to another origin ({shown}): not followed")
        query = f"?{quote(there.query, safe=_TARGET_SAFE)}" if there.query else ""
        return quote(there.path or "/", safe=_TARGET_SAFE) + query

    def _fetch(self, target: str, deadline: float, max_bytes: int, head_only: bool) -> Answer:
        url, request = self._requests.get(target) or self._request(target)
        for attempt in (1, 2):
            sock, reused = self._checkout(deadline, url)
            try:
                response = self._exchange(sock, request, deadline, url, max_bytes, head_only)
            except _Closed:
                sock.close()
                if reused and attempt == 1:
                    continue  # the service closed an idle kept-alive connection: one fresh try
                raise self._fail(url, "connection closed without a response") from None
            except BaseException:
                sock.close()
                raise
            if response.complete and response.keep_alive:
                self._checkin(sock)
            else:
                sock.close()
            return Answer(url, response.status, response.headers, bytes(response.body))
        raise AssertionError("unreachable")

    def _request(self, target: str) -> tuple[str, bytes]:
        """(the target's URL as messages show it, the request's bytes): made once per target, since a reader (the
        exporter every scrape, the sampler ten times a second) asks the same few again and again."""
        made = (
            printable.line(f"{self.shown_root}{target}", limit=300),
            f"GET {target} HTTP/1.1\r\n".encode("latin-1", errors="replace") + self._headers,
        )
        if len(self._requests) < KNOWN_TARGETS:
            self._requests[target] = made
        return made

    def _exchange(
        self, sock: socket.socket, request: bytes, deadline: float, url: str, max_bytes: int, head_only: bool
    ) -> _Response:
        response = _Response(max_bytes, head_only)
        parser = response.parser = httptools.HttpResponseParser(response)
        received = 0
        try:
            sock.settimeout(self._remaining(deadline, url))
            sock.sendall(request)
            while not (response.complete or (head_only and response.head_done)):
                # Each receive waits only for what is left of the deadline: however the service paces its
                # bytes, the exchange ends there.
                sock.settimeout(self._remaining(deadline, url))
                data = sock.recv(RECEIVE_BYTES)
                if not data:
                    if received == 0:
                        raise _Closed
                    if response.ends_at_close:
                        response.complete, response.keep_alive = True, False
                        break
                    raise self._fail(url, f"connection closed after {received} bytes of the response")
                received += len(data)
                parser.feed_data(data)
                if response.error:
                    raise self._fail(url, response.error)
        except (BrokenPipeError, ConnectionResetError):
            if received == 0:
                raise _Closed from None
            raise self._fail(url, f"connection reset after {received} bytes of the response") from None
        except httptools.HttpParserError as exc:
            if not response.complete:
                raise self._fail(url, f"malformed HTTP response ({exc})") from None
            response.keep_alive = False  # garbage after a whole response: the response stands, the connection goes
        except OSError as exc:
            raise self._fail(url, reason(exc), timed_out=_is_timeout(exc)) from None
        finally:
            # The parser holds the response (its callbacks) and the response the parser: a cycle, which only the
            # cyclic collector would free, with the body in it. Broken here, the body goes when the caller is done.
            response.parser = None
        return response

    # --- connections ------------------------------------------------------------------------------
    def _remaining(self, deadline: float, url: str) -> float:
        remaining = deadline - self.clock()
        if remaining <= 0:
            raise self._fail(url, "timed out", timed_out=True)
        return remaining

    def _checkout(self, deadline: float, url: str) -> tuple[socket.socket, bool]:
        while True:
            with self._lock:
                sock = self._idle.pop() if self._idle else None
            if sock is None:
                return self._connect(deadline, url), False
            if not select.select([sock], [], [], 0)[0]:
                return sock, True
            sock.close()  # readable while idle: the service closed it, or sent bytes nobody asked for

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
        if last is None:
            raise self._fail(url, "no address to connect to", unreachable=True)
        raise self._fail(url, reason(last), timed_out=_is_timeout(last), unreachable=not _is_timeout(last))

    def _addresses(self, deadline: float, url: str) -> list:
        if self._literal:
            # An address needs no lookup and its answer never changes: asked once. Under gevent each getaddrinfo is
            # a round trip through its thread pool, and the sampler connects ten times a second to an exporter
            # that may not be up (a third of each refused read's CPU).
            if self._numeric is None:
                self._numeric = socket.getaddrinfo(
                    self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
                )
            return self._numeric
        # getaddrinfo cannot be interrupted: it runs in a thread of its own, waited on until the
        # deadline only, and shared by the readers that come while it is still resolving.
        with self._lock:
            lookup = self._lookup
            if lookup is None or (lookup.done() and lookup.exception() is not None):
                lookup = self._lookup = Future()
                threading.Thread(target=self._resolve, args=(lookup,), daemon=True, name="resolve").start()
        try:
            addresses = lookup.result(timeout=self._remaining(deadline, url))
        except FutureTimeout:
            raise self._fail(url, f"timed out looking up {self.host}", timed_out=True) from None
        except (OSError, UnicodeError) as exc:
            raise self._fail(url, f"cannot look up {self.host}: {reason(exc)}", unreachable=True) from None
        with self._lock:
            if self._lookup is lookup:
                self._lookup = None  # the next new connection looks the name up again (a container may move)
        return addresses

    def _resolve(self, lookup: Future) -> None:
        try:
            lookup.set_result(socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError) as exc:  # a host name too long for IDNA is a UnicodeError
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
                raise self._fail(url, "timed out in the TLS handshake", timed_out=True)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()

    def __enter__(self) -> Origin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def get(
    url: str,
    timeout_s: float,
    *,
    max_bytes: int = MAX_BODY_BYTES,
    redirects: int = MAX_REDIRECTS,
    head_only: bool = False,
    api_key: str = "",
    accept: str = "*/*",
) -> Answer:
    """One GET of `url` (any status), bounded by `timeout_s` as a whole; ServiceError (one line) when it cannot be had."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        raise ServiceError(f"{redact(url)}: not an http(s)://HOST:PORT URL") from None
    base = f"{parts.scheme}://{parts.netloc}"
    path = quote(parts.path or "/", safe=_TARGET_SAFE) + (
        f"?{quote(parts.query, safe=_TARGET_SAFE)}" if parts.query else ""
    )
    with Origin(base, api_key=api_key, accept=accept) as origin:
        return origin.get(
            path, time.monotonic() + timeout_s, max_bytes=max_bytes, redirects=redirects, head_only=head_only
        )


def parse_json(
    body: bytes | str, what: str, *, max_depth: int = MAX_JSON_DEPTH, error: Callable[[str], Exception] = ServiceError
) -> Any:
    """`body` as JSON, nested at most `max_depth` deep; `error` (one line, starting with `what`) otherwise."""
    try:
        value = json.loads(body)
    except RecursionError:
        raise error(f"{what}: JSON nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # UnicodeDecodeError too; and an integer of more digits than Python converts
        raise error(f"{what}: not JSON ({printable.line(exc, limit=80)})") from None
    if depth(value, max_depth) > max_depth:
        raise error(f"{what}: JSON nested deeper than {max_depth} levels")
    return value


def depth(value: Any, limit: int) -> int:
    """How deep `value` nests lists and dicts (a scalar 0), counted without recursion and no further than limit+1."""
    deepest = 0
    stack: list[tuple[Iterable[Any], int]] = [((value,), 0)]
    while stack:
        items, level = stack.pop()
        for item in items:
            if isinstance(item, dict | list):
                if level + 1 > limit:
                    return level + 1
                deepest = max(deepest, level + 1)
                stack.append((item.values() if isinstance(item, dict) else item, level + 1))
    return deepest


def reason(exc: BaseException) -> str:
    """A socket's error in a few words."""
    if _is_timeout(exc):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error ({exc.reason or exc})"
    return printable.line(exc, limit=200) or type(exc).__name__


def _is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, socket.timeout | TimeoutError)
