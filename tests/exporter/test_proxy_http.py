"""The Ollama proxy's HTTP/1.1 plumbing on raw sockets: keep-alive, pipelining, Expect, HEAD, HTTP/1.0, refusals, back-pressure, retries, accounting."""

from __future__ import annotations

import asyncio
import fcntl
import gc
import json
import select
import socket
import sys
import termios
import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
import requests

import exporter.relay as relay_module
from exporter.proxy import OllamaProxy
from exporter.relay import MAX_REQUEST_BYTES
from tests.conftest import wait_until
from tests.doubles.ollama_simulator import OllamaSimulator
from tests.exporter.test_proxy import ExporterThread, chat_body

try:
    import uvloop
except ImportError:  # optional: `python -m exporter` falls back to asyncio's own loop
    uvloop = None

pytestmark = pytest.mark.timeout(60)

MODEL = "smollm2-135m:latest"
GENERATE = b'{"model":"m","prompt":"hi"}'  # an observed request; the proxy labels it m:latest
FINAL = {
    "model": "m:latest",
    "response": "",
    "done": True,
    "done_reason": "stop",
    "total_duration": 9_000_000,
    "load_duration": 1_000,
    "prompt_eval_count": 2,
    "prompt_eval_duration": 2_000_000,
    "eval_count": 3,
    "eval_duration": 3_000_000,
}


# --- the exporter, on asyncio's loop and on uvloop (what `python -m exporter` runs) ---------------
class UvloopExporterThread(ExporterThread):
    """ExporterThread with the event loop `python -m exporter` uses when uvloop is installed."""

    loop_factory = staticmethod(uvloop.new_event_loop if uvloop is not None else asyncio.new_event_loop)


@pytest.fixture(
    params=["asyncio", pytest.param("uvloop", marks=pytest.mark.skipif(uvloop is None, reason="uvloop not installed"))]
)
def exporter_cls(request):
    return ExporterThread if request.param == "asyncio" else UvloopExporterThread


def the_proxy(exporter: ExporterThread) -> OllamaProxy:
    return exporter.exporter.proxies[0][1]


def outcomes(exporter: ExporterThread) -> dict[tuple[str, str], float]:
    """(model, outcome) -> count, read from the proxy's own counter (no scrape, so the upstream sees only proxy traffic)."""
    return {
        (s.labels["model"], s.labels["outcome"]): s.value
        for metric in the_proxy(exporter).metrics.requests.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    }


def in_flight(exporter: ExporterThread) -> int:
    return the_proxy(exporter).observations.in_flight()


def on_loop(exporter: ExporterThread, fn):
    """fn() evaluated in the exporter's event loop thread."""

    async def call():
        return fn()

    return asyncio.run_coroutine_threadsafe(call(), exporter.loop).result(5)


def client_states(exporter: ExporterThread, state) -> list:
    """state(connection) for each of the proxy's client connections, read in the exporter's event loop thread."""
    return on_loop(exporter, lambda: [state(connection) for connection in the_proxy(exporter).connections])


def unread_bytes(exporter: ExporterThread) -> int:
    """Bytes clients sent that the proxy has not read from its sockets yet."""

    def queued(connection) -> int:
        counted = bytearray(4)
        fcntl.ioctl(connection.transport.get_extra_info("socket").fileno(), termios.FIONREAD, counted)
        return int.from_bytes(counted, sys.byteorder)

    return sum(client_states(exporter, queued))


def pending_connects(exporter: ExporterThread) -> int:
    return on_loop(
        exporter,
        lambda: sum(
            1 for task in asyncio.all_tasks() if not task.done() and "_connect_and_send" in repr(task.get_coro())
        ),
    )


# --- strict HTTP/1.1 message reading (requests/http.client hide framing) ---------------------------
@dataclass
class Message:
    start: bytes
    headers: list[tuple[str, str]]
    body: bytes = b""
    framing: str = "none"  # length | chunked | close | none
    interim: list[bytes] = field(default_factory=list)
    connection: int = -1  # which upstream connection a request came on (RawUpstream)

    @property
    def status(self) -> int:
        return int(self.start.split()[1])

    @property
    def target(self) -> str:
        return self.start.split()[1].decode()

    def values(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name.lower()]

    def header(self, name: str) -> str | None:
        values = self.values(name)
        return values[-1] if values else None


def read_head(reader) -> tuple[bytes, list[tuple[str, str]]] | None:
    start = reader.readline(65536)
    if not start:
        return None
    headers = []
    while True:
        line = reader.readline(65536)
        if not line:
            raise EOFError("connection closed inside a message head")
        if line in (b"\r\n", b"\n"):
            return start.rstrip(b"\r\n"), headers
        name, _, value = line.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))


def read_exact(reader, size: int) -> bytes:
    data = reader.read(size)
    if len(data) != size:
        raise EOFError(f"connection closed after {len(data)} of {size} body bytes")
    return data


def read_body(reader, message: Message, *, until_close: bool) -> None:
    encoding = message.header("transfer-encoding")
    length = message.header("content-length")
    if encoding is not None and "chunked" in encoding.lower():
        body = bytearray()
        while True:
            size_line = reader.readline(1024)
            if not size_line:
                raise EOFError("stream cut before the last chunk")
            size = int(size_line.split(b";")[0].strip(), 16)  # ValueError for anything that is not a chunk size
            if size == 0:
                while reader.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                break
            body += read_exact(reader, size)
            if reader.readline(8) != b"\r\n":
                raise ValueError("chunk data not followed by CRLF")
        message.body, message.framing = bytes(body), "chunked"
    elif length is not None:
        message.body, message.framing = read_exact(reader, int(length)), "length"
    elif until_close:
        message.body, message.framing = reader.read(), "close"


def read_response(reader, *, head: bool = False) -> Message:
    """One response with its framing checked; interim 1xx responses are kept in .interim."""
    interim = []
    while True:
        got = read_head(reader)
        if got is None:
            raise EOFError("connection closed before a response")
        start, headers = got
        message = Message(start, headers, interim=interim)
        if 100 <= message.status < 200:
            interim.append(start)
            continue
        if not head and message.status not in (204, 304):
            read_body(reader, message, until_close=True)
        return message


def read_request(reader) -> Message | None:
    got = read_head(reader)
    if got is None:
        return None
    message = Message(*got)
    read_body(reader, message, until_close=False)
    return message


def request_bytes(
    method: str,
    target: str,
    body: bytes = b"",
    *,
    headers=(),
    version: str = "HTTP/1.1",
    content_length: int | None = None,
) -> bytes:
    lines = [f"{method} {target} {version}", "Host: proxy.test", *(f"{name}: {value}" for name, value in headers)]
    if content_length is None and (body or method == "POST"):
        content_length = len(body)
    if content_length is not None:
        lines.append(f"Content-Length: {content_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def json_line(message: Message) -> dict:
    """A refusal body: ONE line of JSON with an `error`."""
    assert b"\n" not in message.body.rstrip(b"\n"), message.body
    assert message.header("Content-Type").startswith("application/json")
    return json.loads(message.body)


def closed_by_peer(reader) -> bool:
    try:
        return reader.read() == b""
    except ConnectionResetError:
        return True


@contextmanager
def client(exporter: ExporterThread, *, timeout: float = 5.0, rcvbuf: int | None = None):
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(timeout)
    sock.connect(("127.0.0.1", exporter.proxy_port))
    reader = sock.makefile("rb")
    try:
        yield sock, reader
    finally:
        reader.close()
        sock.close()


# --- a scripted upstream for what the simulator cannot do ---------------------------------------
def reply(
    conn: socket.socket,
    body: bytes,
    *,
    status: int = 200,
    headers=(("Content-Type", "application/json"),),
    extra: bytes = b"",
) -> None:
    head = [f"HTTP/1.1 {status} X", *(f"{name}: {value}" for name, value in headers), f"Content-Length: {len(body)}"]
    conn.sendall(("\r\n".join(head) + "\r\n").encode() + extra + b"\r\n" + body)


def echo(upstream: RawUpstream, conn: socket.socket, request: Message, index: int) -> bool:
    """Answers with what it saw: the target, which upstream connection, the request's index on it."""
    if request.target.startswith("/api/generate"):
        reply(conn, json.dumps(FINAL).encode())
    else:
        reply(conn, json.dumps({"target": request.target, "connection": request.connection, "index": index}).encode())
    return True


class RawUpstream:
    """Stands in for Ollama's HTTP server where the simulator cannot produce the case: raw sockets, a scripted
    respond(upstream, conn, request, index_on_connection) -> keep the connection open?, and counts of connections."""

    def __init__(self, respond=echo):
        self.respond = respond
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.requests: list[Message] = []
        self.accepted = 0
        self.proxy_closed = 0  # connections the proxy closed (EOF or reset seen here)
        self.sent = 0  # bytes a streaming respond() has written so far
        self.release = threading.Event()  # held responses go on when this is set
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []

    def __enter__(self) -> RawUpstream:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.release.set()
        for conn in list(self._conns):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            thread.join(3)
        self.listener.close()

    def note_proxy_closed(self) -> None:
        with self.lock:
            self.proxy_closed += 1

    def hold(self, conn: socket.socket, timeout: float = 5.0) -> bool:
        """Wait for `release`; False as soon as the proxy closes the connection instead."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._stop.is_set():
            if self.release.is_set():
                return True
            if select.select([conn], [], [], 0.02)[0]:
                try:
                    peeked = conn.recv(1, socket.MSG_PEEK)
                except OSError:
                    peeked = b""
                if not peeked:
                    self.note_proxy_closed()
                    return False
        return self.release.is_set()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self.lock:
                index = self.accepted
                self.accepted += 1
            self._conns.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn, index), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket, connection: int) -> None:
        conn.settimeout(10)
        reader = conn.makefile("rb")
        try:
            for index in range(1000):
                request = read_request(reader)
                if request is None:
                    self.note_proxy_closed()
                    return
                request.connection = connection
                with self.lock:
                    self.requests.append(request)
                if not self.respond(self, conn, request, index):
                    return
        except TimeoutError:
            return
        except (OSError, EOFError):
            if not self._stop.is_set():
                self.note_proxy_closed()
        finally:
            reader.close()
            conn.close()


@contextmanager
def unanswered_upstream():
    """A listener whose accept queue is full: connects to it hang (the kernel drops the SYNs), like a firewalled host."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address = listener.getsockname()
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(address)
        fillers.append(filler)
    probe = socket.socket()
    probe.settimeout(0.2)
    try:
        probe.connect(address)
        pytest.skip("this kernel completes connects to a full accept queue")
    except TimeoutError:
        pass
    finally:
        probe.close()
    try:
        yield f"http://127.0.0.1:{address[1]}"
    finally:
        for sock in (*fillers, listener):
            sock.close()


# --- keep-alive and pipelining ----------------------------------------------------------------------
def test_sequential_requests_on_one_client_connection_use_one_upstream_connection(exporter_cls):
    with RawUpstream() as upstream, exporter_cls(upstream.url) as exporter:
        with client(exporter) as (sock, reader):
            for i in range(20):
                sock.sendall(request_bytes("GET", f"/api/ps?i={i}"))
                resp = read_response(reader)
                assert resp.status == 200 and json.loads(resp.body) == {
                    "target": f"/api/ps?i={i}",
                    "connection": 0,
                    "index": i,
                }
            assert upstream.accepted == 1
            with client(exporter) as (other, other_reader):
                other.sendall(request_bytes("GET", "/api/version"))
                assert json.loads(read_response(other_reader).body)["connection"] == 1  # its own upstream connection
        # both clients hung up: their upstream connections are closed with them
        assert wait_until(lambda: upstream.proxy_closed == 2, 3)
        assert upstream.accepted == 2 and in_flight(exporter) == 0


def test_pipelined_requests_get_their_responses_in_order(exporter_cls):
    with (
        OllamaSimulator(token_delay=0.01, load_delay=0.0) as sim,
        exporter_cls(sim.url) as exporter,
        client(exporter) as (sock, reader),
    ):
        chat = json.dumps(chat_body(num_predict=5)).encode()
        # the slowest first: answered out of order, the version or the tags would come back first
        sock.sendall(
            request_bytes("POST", "/api/chat", chat, headers=[("Content-Type", "application/json")])
            + request_bytes("GET", "/api/version")
            + request_bytes("HEAD", "/api/tags")
            + request_bytes("GET", "/api/tags")
        )
        first, second = read_response(reader), read_response(reader)
        third, fourth = read_response(reader, head=True), read_response(reader)
        lines = first.body.splitlines()
        assert len(lines) == 6 and json.loads(lines[-1])["done"] is True
        assert json.loads(second.body) == {"version": "0.12.6"}
        assert third.status == 200 and int(third.header("Content-Length")) == len(fourth.body) > 0
        assert json.loads(fourth.body)["models"][0]["name"] == MODEL
        assert wait_until(lambda: outcomes(exporter) == {(MODEL, "ok"): 1.0}), outcomes(exporter)
        assert in_flight(exporter) == 0


def test_pipelined_requests_reach_the_upstream_one_at_a_time(exporter_cls):
    def respond(upstream, conn, request, index):
        if index == 0 and not upstream.hold(conn):
            return False
        return echo(upstream, conn, request, index)

    with RawUpstream(respond) as upstream, exporter_cls(upstream.url) as exporter, client(exporter) as (sock, reader):
        sock.sendall(b"".join(request_bytes("GET", f"/r{i}") for i in range(3)))
        assert wait_until(lambda: len(upstream.requests) == 1, 3)
        # both others parsed and queued behind it: the next request waits for this response (no upstream pipelining)
        assert wait_until(lambda: client_states(exporter, lambda c: len(c.pending)) == [2], 3)
        assert len(upstream.requests) == 1
        upstream.release.set()
        for i in range(3):
            assert json.loads(read_response(reader).body) == {"target": f"/r{i}", "connection": 0, "index": i}
        assert upstream.accepted == 1


def test_a_malformed_request_after_pipelined_ones_is_refused_only_after_they_are_answered(exporter_cls):
    """BUG at 9a6269b: ClientConnection.data_received clears `pending` on a parse error, so the second request is
    never answered and the client reads the 400 as its response."""

    def respond(upstream, conn, request, index):
        if index == 0 and not upstream.hold(conn):  # the garbage arrives while the first request is in flight
            return False
        return echo(upstream, conn, request, index)

    with RawUpstream(respond) as upstream, exporter_cls(upstream.url) as exporter, client(exporter) as (sock, reader):
        sock.sendall(request_bytes("GET", "/first") + request_bytes("GET", "/second") + b"\x01\x02 nonsense\r\n\r\n")
        assert wait_until(lambda: client_states(exporter, lambda c: c.refusal is not None) == [True], 3)
        upstream.release.set()
        first, second = read_response(reader), read_response(reader)
        assert json.loads(first.body)["target"] == "/first"
        assert second.status == 200 and json.loads(second.body)["target"] == "/second", second
        refusal = read_response(reader)
        assert refusal.status == 400 and "bad request" in json_line(refusal)["error"]
        assert closed_by_peer(reader)


# --- Expect: 100-continue ---------------------------------------------------------------------------
def test_expect_100_continue_is_answered_by_the_proxy_and_not_forwarded(exporter_cls):
    with (
        OllamaSimulator(token_delay=0.001, load_delay=0.0) as sim,
        exporter_cls(sim.url) as exporter,
        client(exporter) as (sock, reader),
    ):
        body = json.dumps(chat_body(num_predict=3, stream=False)).encode()
        sock.sendall(
            request_bytes(
                "POST",
                "/api/chat",
                content_length=len(body),
                headers=[("Content-Type", "application/json"), ("Expect", "100-continue")],
            )
        )
        interim = read_head(reader)  # before any body byte was sent
        assert interim == (b"HTTP/1.1 100 Continue", [])
        sock.sendall(body)
        resp = read_response(reader)
        assert resp.status == 200 and resp.interim == [] and json.loads(resp.body)["done"] is True
        assert "Expect" not in sim.last_request["headers"]
        assert sim.last_request["body"] == body
        sock.sendall(request_bytes("GET", "/api/version"))  # still a usable connection
        assert read_response(reader).status == 200


def test_expect_100_continue_of_a_pipelined_request_does_not_land_inside_a_streaming_response(exporter_cls):
    """BUG at 9a6269b: on_headers_complete writes `100 Continue` at once, i.e. in the middle of the chunked body of the
    response still streaming to this client, which corrupts its framing."""

    def respond(upstream, conn, request, index):
        if index == 0:
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"2\r\na\n\r\n"
            )
            upstream.sent = 1
            if not upstream.hold(conn):
                return False
            conn.sendall(b"2\r\nb\n\r\n0\r\n\r\n")
            return True
        return echo(upstream, conn, request, index)

    with RawUpstream(respond) as upstream, exporter_cls(upstream.url) as exporter, client(exporter) as (sock, reader):
        sock.sendall(request_bytes("POST", "/api/tags-stream", b"{}"))
        assert wait_until(lambda: upstream.sent == 1, 3)
        # the first chunk has been relayed to the client
        assert wait_until(lambda: client_states(exporter, lambda c: c.current and c.current.head_sent) == [True], 3)
        body = b'{"second": true}'
        sock.sendall(request_bytes("POST", "/second", content_length=len(body), headers=[("Expect", "100-continue")]))
        assert wait_until(lambda: client_states(exporter, lambda c: c.continue_due) == [True], 3)  # its head is read
        upstream.release.set()
        try:
            first = read_response(reader)
        except ValueError as exc:
            pytest.fail(f"the first response's chunked framing is broken: {exc}")
        assert first.body == b"a\nb\n" and first.interim == []
        sock.sendall(body)
        second = read_response(reader)
        assert second.status == 200 and json.loads(second.body)["target"] == "/second"
        assert second.interim in ([], [b"HTTP/1.1 100 Continue"])
        assert upstream.requests[-1].body == body and upstream.requests[-1].header("Expect") is None


def test_expect_100_continue_is_ignored_in_an_http10_request(exporter_cls):
    """BUG at 9a6269b (minor): RFC 9110 10.1.1 says a server MUST ignore 100-continue in an HTTP/1.0 request;
    the proxy sends an HTTP/1.1 100 Continue to an HTTP/1.0 client."""
    with RawUpstream() as upstream, exporter_cls(upstream.url) as exporter, client(exporter) as (sock, reader):
        sock.sendall(
            request_bytes("POST", "/v1/embeddings", b"{}", version="HTTP/1.0", headers=[("Expect", "100-continue")])
        )
        resp = read_response(reader)
        assert resp.interim == [] and resp.status == 200
        assert closed_by_peer(reader)


# --- HEAD, bodiless statuses, HTTP/1.0 -------------------------------------------------------------
def test_head_passes_content_length_without_a_body_and_the_connection_stays_usable(exporter_cls):
    with OllamaSimulator() as sim, exporter_cls(sim.url) as exporter, client(exporter) as (sock, reader):
        sock.sendall(request_bytes("HEAD", "/api/tags"))
        head = read_response(reader, head=True)
        sock.sendall(request_bytes("GET", "/api/tags"))  # a body sent for the HEAD would be read as this status line
        full = read_response(reader)
        assert head.status == full.status == 200
        assert head.header("Content-Length") == full.header("Content-Length") == str(len(full.body))
        assert head.header("Transfer-Encoding") is None and head.header("Content-Type") == full.header("Content-Type")
        sock.sendall(request_bytes("HEAD", "/"))
        assert read_response(reader, head=True).header("Content-Length") == str(len(b"Ollama is running"))
        sock.sendall(request_bytes("GET", "/api/version"))
        assert json.loads(read_response(reader).body) == {"version": "0.12.6"}


@pytest.mark.parametrize("status", [204, 304])
def test_bodiless_statuses_are_relayed_without_framing_and_keep_the_connection(exporter_cls, status):
    def respond(upstream, conn, request, index):
        if index == 0:
            conn.sendall(b"HTTP/1.1 %d X\r\nX-Seen: 1\r\n\r\n" % status)
            return True
        return echo(upstream, conn, request, index)

    with RawUpstream(respond) as upstream, exporter_cls(upstream.url) as exporter, client(exporter) as (sock, reader):
        sock.sendall(request_bytes("DELETE", "/api/delete", b'{"model":"m"}'))
        resp = read_response(reader)
        assert resp.status == status and resp.header("X-Seen") == "1"
        assert resp.header("Transfer-Encoding") is None and resp.header("Content-Length") is None
        sock.sendall(request_bytes("GET", "/next"))
        assert json.loads(read_response(reader).body) == {"target": "/next", "connection": 0, "index": 1}


def test_an_interim_103_from_upstream_is_not_relayed(exporter_cls):
    def respond(upstream, conn, request, index):
        conn.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n")
        return echo(upstream, conn, request, index)

    with RawUpstream(respond) as upstream, exporter_cls(upstream.url) as exporter, client(exporter) as (sock, reader):
        sock.sendall(request_bytes("GET", "/a") + request_bytes("GET", "/b"))
        first, second = read_response(reader), read_response(reader)
        assert first.interim == [] and first.header("Link") is None and json.loads(first.body)["target"] == "/a"
        assert json.loads(second.body)["target"] == "/b"


def test_an_http10_client_gets_a_streamed_body_that_ends_at_connection_close(exporter_cls):
    with OllamaSimulator(token_delay=0.005, load_delay=0.0) as sim, exporter_cls(sim.url) as exporter:
        with client(exporter) as (sock, reader):
            sock.sendall(
                request_bytes("POST", "/api/chat", json.dumps(chat_body(num_predict=5)).encode(), version="HTTP/1.0")
            )
            resp = read_response(reader)
            assert resp.status == 200 and resp.framing == "close"  # HTTP/1.0 has no chunks
            assert resp.header("Transfer-Encoding") is None and resp.header("Connection") == "close"
            lines = resp.body.splitlines()
            assert len(lines) == 6 and json.loads(lines[-1])["done"] is True
        assert wait_until(lambda: outcomes(exporter) == {(MODEL, "ok"): 1.0}), outcomes(exporter)
        assert in_flight(exporter) == 0
        # HTTP/1.0 asking for keep-alive still gets a streamed body ended by close (it cannot be chunked)
        with client(exporter) as (sock, reader):
            sock.sendall(
                request_bytes(
                    "POST",
                    "/api/chat",
                    json.dumps(chat_body(num_predict=2)).encode(),
                    version="HTTP/1.0",
                    headers=[("Connection", "keep-alive")],
                )
            )
            resp = read_response(reader)
            assert resp.framing == "close" and resp.header("Connection") == "close"
            assert json.loads(resp.body.splitlines()[-1])["eval_count"] == 2
        # HTTP/1.0 with keep-alive and a Content-Length response: the connection is kept
        with client(exporter) as (sock, reader):
            for _ in range(2):
                sock.sendall(
                    request_bytes("GET", "/api/version", version="HTTP/1.0", headers=[("Connection", "keep-alive")])
                )
                resp = read_response(reader)
                assert resp.framing == "length" and resp.header("Connection").lower() == "keep-alive"
            sock.sendall(request_bytes("GET", "/api/version", version="HTTP/1.0"))
            assert read_response(reader).status == 200 and closed_by_peer(reader)


# --- framing and headers of responses --------------------------------------------------------------
def test_a_content_length_response_passes_through_with_the_same_length(exporter_cls):
    with (
        OllamaSimulator(token_delay=0.001, load_delay=0.0) as sim,
        exporter_cls(sim.url) as exporter,
        client(exporter) as (sock, reader),
    ):
        body = json.dumps(chat_body(num_predict=4, stream=False)).encode()
        sock.sendall(request_bytes("POST", "/api/chat", body))
        resp = read_response(reader)
        assert resp.framing == "length" and resp.header("Transfer-Encoding") is None
        assert json.loads(resp.body)["eval_count"] == 4  # the non-streamed body is observed too
        assert wait_until(lambda: outcomes(exporter) == {(MODEL, "ok"): 1.0})
    fixed = b'{"models":[]}' * 1000
    with (
        RawUpstream(lambda up, conn, req, i: reply(conn, fixed) or True) as upstream,
        exporter_cls(upstream.url) as exporter,
        client(exporter) as (sock, reader),
    ):
        sock.sendall(request_bytes("GET", "/api/tags"))
        resp = read_response(reader)
        assert resp.framing == "length" and resp.header("Content-Length") == str(len(fixed)) and resp.body == fixed


def test_end_to_end_headers_pass_and_hop_by_hop_ones_do_not_in_either_direction(exporter_cls):
    def respond(upstream, conn, request, index):
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nX-Custom: kept\r\n"
            b"Connection: keep-alive, X-Hop\r\nX-Hop: dropped\r\nKeep-Alive: timeout=5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        )
        return True

    with RawUpstream(respond) as upstream, exporter_cls(upstream.url) as exporter, client(exporter) as (sock, reader):
        sock.sendall(
            b"POST /api/pull?x=1 HTTP/1.1\r\nHost: somewhere.else\r\nConnection: keep-alive, X-Secret\r\n"
            b"X-Secret: 1\r\nKeep-Alive: 300\r\nProxy-Authorization: Basic eA==\r\nTE: trailers\r\n"
            b'X-Request-Id: abc\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{"a\r\n4\r\n":1}\r\n0\r\n\r\n'
        )
        resp = read_response(reader)
        assert resp.status == 200 and resp.body == b"hello world" and resp.framing == "chunked"
        assert resp.header("Content-Type") == "application/x-ndjson" and resp.header("X-Custom") == "kept"
        assert resp.header("X-Hop") is None and resp.header("Keep-Alive") is None
        assert resp.values("Transfer-Encoding") == ["chunked"] and resp.header("Content-Length") is None
        assert resp.header("Connection") in (None, "keep-alive")
        seen = upstream.requests[0]
        assert seen.start == b"POST /api/pull?x=1 HTTP/1.1" and seen.body == b'{"a":1}'
        assert seen.header("Content-Length") == "7" and seen.header("Transfer-Encoding") is None
        assert seen.values("Host") == [upstream.url.removeprefix("http://")]
        assert seen.header("X-Request-Id") == "abc"
        for hop in ("X-Secret", "Keep-Alive", "Proxy-Authorization", "TE"):
            assert seen.header(hop) is None, hop


def test_a_response_delimited_by_close_is_rechunked_for_an_http11_client(exporter_cls):
    lines = b'{"response":"a","done":false}\n' + json.dumps(FINAL).encode() + b"\n"

    def respond(upstream, conn, request, index):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nConnection: close\r\n\r\n" + lines)
        return False  # the body ends when this connection does

    with RawUpstream(respond) as upstream, exporter_cls(upstream.url) as exporter, client(exporter) as (sock, reader):
        for _ in range(2):
            sock.sendall(request_bytes("POST", "/api/generate", GENERATE))
            resp = read_response(reader)
            assert resp.framing == "chunked" and resp.body == lines
        assert upstream.accepted == 2
        assert wait_until(lambda: outcomes(exporter) == {("m:latest", "ok"): 2.0}), outcomes(exporter)
        assert in_flight(exporter) == 0


# --- upstream connection reuse and failures --------------------------------------------------------
def test_an_upstream_connection_closed_while_idle_is_replaced_transparently(exporter_cls):
    def respond(upstream, conn, request, index):
        echo(upstream, conn, request, index)
        return False  # close after answering, without saying so (as an idle timeout upstream does)

    with RawUpstream(respond) as upstream, exporter_cls(upstream.url) as exporter, client(exporter) as (sock, reader):
        for expected in range(3):
            sock.sendall(request_bytes("POST", "/api/generate", GENERATE))
            assert read_response(reader).status == 200
            assert wait_until(lambda expected=expected: upstream.accepted == expected + 1, 3)
            # the proxy sees the upstream's FIN while idle
            assert wait_until(
                lambda: client_states(exporter, lambda c: c.upstream is None or c.upstream.lost) == [True]
            )
        assert wait_until(lambda: outcomes(exporter) == {("m:latest", "ok"): 3.0}), outcomes(exporter)
        assert in_flight(exporter) == 0


def test_a_reused_upstream_connection_closed_before_answering_is_retried_once(exporter_cls):
    def respond(upstream, conn, request, index):
        if request.connection == 0 and index == 1:
            return False  # closes with the request unanswered: the race with an upstream idle timeout
        return echo(upstream, conn, request, index)

    with RawUpstream(respond) as upstream, exporter_cls(upstream.url) as exporter, client(exporter) as (sock, reader):
        for _ in range(2):
            sock.sendall(request_bytes("POST", "/api/generate", GENERATE))
            resp = read_response(reader)
            assert resp.status == 200 and json.loads(resp.body)["done"] is True
        assert upstream.accepted == 2
        assert [(r.connection, r.body) for r in upstream.requests] == [(0, GENERATE), (0, GENERATE), (1, GENERATE)]
        # counted once each, as ok: the retry is invisible
        assert wait_until(lambda: outcomes(exporter) == {("m:latest", "ok"): 2.0}), outcomes(exporter)
        assert in_flight(exporter) == 0


def test_a_fresh_upstream_connection_closed_before_answering_is_502_without_retry(exporter_cls):
    with (
        RawUpstream(lambda up, conn, req, i: False) as upstream,
        exporter_cls(upstream.url) as exporter,
        client(exporter) as (sock, reader),
    ):
        sock.sendall(request_bytes("POST", "/api/generate", GENERATE))
        resp = read_response(reader)
        assert resp.status == 502 and "upstream closed" in json_line(resp)["error"]
        assert upstream.accepted == 1 and len(upstream.requests) == 1
        assert wait_until(lambda: outcomes(exporter) == {("other", "upstream_broken"): 1.0}), outcomes(exporter)
        assert in_flight(exporter) == 0
        sock.sendall(request_bytes("GET", "/api/version"))  # the client connection is still served
        assert read_response(reader).status == 502 and upstream.accepted == 2


@pytest.mark.parametrize(
    "broken",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10,
        b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"a"\r\n',
    ],
    ids=["content-length", "chunked"],
)
def test_an_upstream_cut_mid_body_cuts_the_client_connection_and_counts_upstream_broken(exporter_cls, broken):
    def respond(upstream, conn, request, index):
        conn.sendall(broken)
        return False

    with RawUpstream(respond) as upstream, exporter_cls(upstream.url) as exporter, client(exporter) as (sock, reader):
        sock.sendall(request_bytes("POST", "/api/generate", GENERATE))
        with pytest.raises(EOFError):
            read_response(reader)  # no false end of message (no chunked terminator, no padding)
        assert wait_until(lambda: outcomes(exporter) == {("other", "upstream_broken"): 1.0}), outcomes(exporter)
        assert in_flight(exporter) == 0


def test_a_malformed_upstream_response_is_502_and_the_connection_goes_on(exporter_cls):
    def respond(upstream, conn, request, index):
        if index == 0 and request.connection == 0:
            conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            return False
        return echo(upstream, conn, request, index)

    with RawUpstream(respond) as upstream, exporter_cls(upstream.url) as exporter, client(exporter) as (sock, reader):
        sock.sendall(request_bytes("POST", "/api/generate", GENERATE))
        resp = read_response(reader)
        assert resp.status == 502 and "error" in json_line(resp)
        sock.sendall(request_bytes("POST", "/api/generate", GENERATE))
        assert read_response(reader).status == 200
        assert wait_until(lambda: outcomes(exporter) == {("other", "upstream_broken"): 1.0, ("m:latest", "ok"): 1.0}), (
            outcomes(exporter)
        )
        assert in_flight(exporter) == 0


def test_upstream_unreachable_is_502_json_on_a_connection_that_stays_usable(exporter_cls):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with exporter_cls(gone) as exporter, client(exporter) as (sock, reader):
        for _ in range(2):
            sock.sendall(request_bytes("POST", "/api/generate", GENERATE))
            resp = read_response(reader)
            assert resp.status == 502 and "unreachable" in json_line(resp)["error"]
        assert wait_until(lambda: outcomes(exporter) == {("other", "upstream_unreachable"): 2.0}), outcomes(exporter)
        assert in_flight(exporter) == 0


# --- client behaviour: refusals, disconnects, slow readers, idle connections ------------------------
def _send_quietly(sock: socket.socket, *parts: bytes) -> None:
    try:
        for part in parts:
            sock.sendall(part)
    except OSError:
        pass  # the proxy may close as soon as it has refused


def test_a_body_over_the_limit_is_413_in_one_json_line_and_the_proxy_serves_on(exporter_cls):
    with RawUpstream() as upstream, exporter_cls(upstream.url) as exporter:
        with client(exporter, timeout=10) as (sock, reader):
            body = b"x" * (MAX_REQUEST_BYTES + 1)
            sender = threading.Thread(
                target=_send_quietly, args=(sock, request_bytes("POST", "/api/chat", content_length=len(body)), body)
            )
            sender.start()
            resp = read_response(reader)
            sender.join(10)
            assert resp.status == 413 and "larger than" in json_line(resp)["error"]
            assert resp.header("Connection") == "close" and closed_by_peer(reader)
        assert upstream.requests == [] and in_flight(exporter) == 0
        with client(exporter) as (sock, reader):
            sock.sendall(request_bytes("GET", "/api/version"))
            assert read_response(reader).status == 200


@pytest.mark.parametrize(
    "raw, status",
    [
        (b"GET /api/version HTTP/1.1\r\nHost: x\r\nno colon in this header\r\n\r\n", 400),
        (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(32) + b"\r\n\r\n", 400),  # TLS to the plain port
        (b"GET /api/version HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 66_000 + b"\r\n\r\n", 431),
        (b"CONNECT ollama.com:443 HTTP/1.1\r\nHost: ollama.com:443\r\n\r\n", 405),
    ],
    ids=["bad-header", "tls", "head-too-large", "connect"],
)
def test_a_refused_request_gets_one_json_line_and_the_proxy_serves_on(exporter_cls, raw, status):
    with RawUpstream() as upstream, exporter_cls(upstream.url) as exporter:
        with client(exporter) as (sock, reader):
            sock.sendall(raw)
            resp = read_response(reader)
            assert resp.status == status and json_line(resp)["error"]
            assert resp.header("Connection") == "close" and closed_by_peer(reader)
        with client(exporter) as (sock, reader):
            sock.sendall(request_bytes("GET", "/api/version"))
            assert read_response(reader).status == 200
        assert [r.target for r in upstream.requests] == ["/api/version"]  # nothing refused went upstream
        assert in_flight(exporter) == 0


def test_a_413_behind_a_request_in_flight_is_not_turned_into_a_400_by_later_bytes(exporter_cls):
    """BUG at 9a6269b: after a refusal the dead parser is fed again; that error has no Refusal as its context, so the
    pending 413 is replaced by `400 bad request` before it is sent."""

    def respond(upstream, conn, request, index):
        if index == 0 and not upstream.hold(conn, timeout=10):
            return False
        return echo(upstream, conn, request, index)

    with (
        RawUpstream(respond) as upstream,
        exporter_cls(upstream.url) as exporter,
        client(exporter, timeout=10) as (sock, reader),
    ):
        sock.sendall(request_bytes("GET", "/first"))
        assert wait_until(lambda: len(upstream.requests) == 1, 3)
        body = b"x" * (MAX_REQUEST_BYTES + 1)
        sock.sendall(request_bytes("POST", "/api/chat", content_length=len(body) + 10))
        sock.sendall(body)
        assert wait_until(
            lambda: client_states(exporter, lambda c: c.refusal is not None) == [True], 3
        )  # past the limit
        _send_quietly(sock, b"y" * 9)  # the rest of the declared body, read after the refusal
        assert wait_until(lambda: unread_bytes(exporter) == 0, 3)
        upstream.release.set()
        assert json.loads(read_response(reader).body)["target"] == "/first"
        refusal = read_response(reader)
        assert refusal.status == 413, refusal.body


def test_a_client_leaving_before_the_response_aborts_the_upstream_request(exporter_cls):
    def respond(upstream, conn, request, index):
        return upstream.hold(conn) and echo(upstream, conn, request, index)

    with RawUpstream(respond) as upstream, exporter_cls(upstream.url) as exporter:
        with client(exporter) as (sock, reader):
            # one in flight and one pipelined behind it: only the first was started, only it is counted
            sock.sendall(request_bytes("POST", "/api/generate", GENERATE) * 2)
            assert wait_until(lambda: len(upstream.requests) == 1, 3)
            assert in_flight(exporter) == 1
        assert wait_until(lambda: upstream.proxy_closed == 1, 3)  # how Ollama learns to stop generating
        assert wait_until(lambda: outcomes(exporter) == {("other", "client_disconnect"): 1.0}), outcomes(exporter)
        assert in_flight(exporter) == 0 and len(upstream.requests) == 1


def test_a_slow_reading_client_pauses_the_upstream_instead_of_buffering_the_stream(exporter_cls):
    piece = bytes(range(256)) * 256  # 64 KiB
    pieces = 384  # 24 MiB in all: far more than the socket buffers on the way hold

    def respond(upstream, conn, request, index):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(pieces):
            conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            upstream.sent += len(piece)
        conn.sendall(b"0\r\n\r\n")
        return True

    with (
        RawUpstream(respond) as upstream,
        exporter_cls(upstream.url) as exporter,
        client(exporter, rcvbuf=64 * 1024) as (sock, reader),
    ):
        sock.sendall(request_bytes("GET", "/api/pull-like"))
        # read nothing: the proxy stops reading the upstream once its buffer to this client is full
        assert wait_until(lambda: client_states(exporter, lambda c: c.paused) == [True], 5)
        buffered = on_loop(
            exporter, lambda: max(c.transport.get_write_buffer_size() for c in the_proxy(exporter).connections)
        )
        assert buffered < 2 * 1024 * 1024, f"proxy holds {buffered} bytes for a client that does not read"
        assert upstream.sent < pieces * len(piece)
        resp = read_response(reader)  # reading again resumes the upstream
        assert (
            len(resp.body) == pieces * len(piece)
            and resp.body[: len(piece)] == piece
            and resp.body[-len(piece) :] == piece
        )
        sock.sendall(request_bytes("GET", "/api/pull-like"))
        assert len(read_response(reader).body) == pieces * len(piece)
        assert upstream.accepted == 1


def test_the_trailer_of_a_chunked_request_body_does_not_go_upstream_as_a_header(exporter_cls):
    """The body goes upstream with a Content-Length; a trailer field has no place in that request's head."""
    with RawUpstream() as upstream, exporter_cls(upstream.url) as exporter, client(exporter) as (sock, reader):
        sock.sendall(
            b"POST /api/chat HTTP/1.1\r\nHost: x\r\nX-Request-Id: abc\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\n{}\r\n0\r\nX-Checksum: 99\r\nConnection: close\r\n\r\n"
        )
        assert read_response(reader).status == 200
        seen = upstream.requests[0]
        assert seen.body == b"{}" and seen.header("Content-Length") == "2" and seen.header("X-Request-Id") == "abc"
        assert seen.header("X-Checksum") is None and seen.header("Connection") is None


def test_a_stream_longer_than_the_keepalive_timeout_is_not_cut_and_a_busy_connection_stays_open(
    exporter_cls, monkeypatch
):
    """The idle timer is armed once per connection and checks on firing: a response going out, or a request every
    so often, is not idleness."""
    # Every idle gap is 0.2 s against a 1 s timeout: a busy host may stall the client 0.8 s before it looks idle.
    monkeypatch.setattr(relay_module, "KEEPALIVE_TIMEOUT", 1.0)

    def respond(upstream, conn, request, index):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(1 if request.target == "/quick" else 8):
            time.sleep(0.2)  # the stimulus, not an ordering: a stream paced past the keep-alive timeout
            conn.sendall(b"3\r\n{}\n\r\n")
        conn.sendall(b"0\r\n\r\n")
        return True

    with (
        RawUpstream(respond) as upstream,
        exporter_cls(upstream.url) as exporter,
        client(exporter, timeout=3) as (sock, reader),
    ):
        sock.sendall(request_bytes("POST", "/api/generate", b"{}"))
        assert read_response(reader).body == b"{}\n" * 8  # 1.6 s of stream against a 1 s timeout
        for _ in range(3):  # 3 x (0.2 s idle + 0.2 s response): past the timeout in all, never idle for that long
            time.sleep(0.2)  # the stimulus: idle gaps shorter than the timeout
            sock.sendall(request_bytes("POST", "/quick", b"{}"))
            assert read_response(reader).body == b"{}\n"
        assert upstream.accepted == 1
        assert closed_by_peer(reader)  # and once idle, it is closed


def test_an_idle_client_connection_is_closed_after_the_keepalive_timeout(exporter_cls, monkeypatch):
    monkeypatch.setattr(relay_module, "KEEPALIVE_TIMEOUT", 0.3)
    with RawUpstream() as upstream, exporter_cls(upstream.url) as exporter:
        with client(exporter, timeout=3) as (sock, reader):
            sock.sendall(request_bytes("GET", "/api/version"))
            assert read_response(reader).status == 200
            started = time.monotonic()
            assert closed_by_peer(reader) and time.monotonic() - started < 2.5
        assert wait_until(lambda: upstream.proxy_closed == 1, 2)  # its upstream connection went with it
        with client(exporter, timeout=3) as (sock, reader):
            assert closed_by_peer(reader)  # never sent anything
        assert not the_proxy(exporter).connections


def test_a_client_stalling_inside_a_request_head_is_closed_after_the_keepalive_timeout(exporter_cls, monkeypatch):
    """BUG at 9a6269b (minor): on_message_begin cancels the idle timer and nothing re-arms it until the request is
    complete, so a client that sends half a head and stalls holds its connection (and buffers) forever."""
    monkeypatch.setattr(relay_module, "KEEPALIVE_TIMEOUT", 0.3)
    with (
        RawUpstream() as upstream,
        exporter_cls(upstream.url) as exporter,
        client(exporter, timeout=1.5) as (sock, reader),
    ):
        sock.sendall(b"POST /api/chat HTTP/1.1\r\nHost: x\r\n")
        try:
            rest = reader.read()
        except TimeoutError:
            pytest.fail("the half-sent request holds the connection open past the keep-alive timeout")
        except ConnectionResetError:
            rest = b""
        assert rest == b""  # closed as idle: a 408 would be the request deadline (REQUEST_TIMEOUT), 30 s away
        assert upstream.requests == []


# --- connections being set up when the client leaves or the proxy stops ----------------------------
@pytest.mark.parametrize("ending", ["client-leaves", "proxy-stops"])
def test_an_upstream_connect_in_progress_does_not_outlive_its_client(exporter_cls, ending):
    """BUG at 9a6269b: the _connect_and_send task is not cancelled when the client connection is lost (or the proxy is
    stopped); it keeps connecting for up to CONNECT_TIMEOUT (10 s) for nobody and is destroyed pending at loop close."""
    with unanswered_upstream() as url, exporter_cls(url) as exporter:
        with client(exporter) as (sock, reader):
            sock.sendall(request_bytes("POST", "/api/generate", GENERATE))
            assert wait_until(lambda: pending_connects(exporter) == 1, 3)
            if ending == "proxy-stops":
                asyncio.run_coroutine_threadsafe(the_proxy(exporter).stop(), exporter.loop).result(5)
                assert closed_by_peer(reader)
        assert wait_until(lambda: outcomes(exporter) == {("other", "client_disconnect"): 1.0}), outcomes(exporter)
        assert in_flight(exporter) == 0
        assert wait_until(lambda: pending_connects(exporter) == 0, 1), "the upstream connect goes on for nobody"


def test_stop_closes_client_and_upstream_connections_and_counts_the_request_once(exporter_cls):
    def respond(upstream, conn, request, index):
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n2\r\na\n\r\n"
        )
        return upstream.hold(conn) and False

    with RawUpstream(respond) as upstream, exporter_cls(upstream.url) as exporter:
        with client(exporter) as (sock, reader), client(exporter) as (idle, idle_reader):
            sock.sendall(request_bytes("POST", "/api/generate", GENERATE))
            assert wait_until(lambda: in_flight(exporter) == 1 and upstream.requests, 3)
            # the response head and first chunk went to the client (the idle connection has no exchange)
            assert wait_until(
                lambda: (
                    sorted(client_states(exporter, lambda c: bool(c.current and c.current.head_sent))) == [False, True]
                )
            )
            asyncio.run_coroutine_threadsafe(the_proxy(exporter).stop(), exporter.loop).result(5)
            with pytest.raises(EOFError):
                read_response(reader)
            assert closed_by_peer(idle_reader)
        assert wait_until(lambda: upstream.proxy_closed == 1, 3)
        assert wait_until(lambda: outcomes(exporter) == {("other", "client_disconnect"): 1.0}), outcomes(exporter)
        assert in_flight(exporter) == 0
        assert not the_proxy(exporter).connections
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", exporter.proxy_port), 1).close()


# --- slow clients, many clients, large bodies ----------------------------
def drip(sock: socket.socket, data: bytes, every: float, stop: threading.Event) -> None:
    """Send `data` a byte at a time, one every `every` seconds (slowloris), until sent or stopped."""
    for byte in data:
        if stop.wait(every):
            return
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return


@pytest.mark.parametrize("part", ["head", "body"])
def test_a_request_dripped_a_byte_at_a_time_is_cut_at_the_request_deadline(exporter_cls, monkeypatch, part):
    """BUG at 6364460: 500 connections sending a byte every 5 s all stayed open for 100 s: every byte reset the
    idle timer and no deadline bounded the head or the body."""
    monkeypatch.setattr(relay_module, "REQUEST_TIMEOUT", 0.5)
    head = b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
    with (
        RawUpstream() as upstream,
        exporter_cls(upstream.url) as exporter,
        client(exporter, timeout=10) as (sock, reader),
    ):
        stop = threading.Event()
        if part == "body":
            sock.sendall(head + b"\r\n")
        dripper = threading.Thread(
            target=drip, args=(sock, head + b"X-Slow: " + b"a" * 200 if part == "head" else b"x" * 99, 0.05, stop)
        )
        started = time.monotonic()
        dripper.start()
        try:
            resp = read_response(reader)
            took = time.monotonic() - started
        finally:
            stop.set()
            dripper.join(5)
        assert resp.status == 408 and "within" in json_line(resp)["error"] and closed_by_peer(reader)
        assert took < 3.0, f"a 0.5 s request deadline took {took:.1f} s"  # the drip alone lasts 5 s or more
        assert upstream.requests == []


def test_connections_past_the_cap_are_turned_away_and_metrics_stays_reachable(exporter_cls):
    """BUG at 6364460: no connection cap: 1,100 slow connections exhausted 1,024 descriptors and /metrics and the
    proxy reset every new connection."""
    with RawUpstream() as upstream, exporter_cls(upstream.url) as exporter:
        the_proxy(exporter).max_connections = 8
        held = [socket.create_connection(("127.0.0.1", exporter.proxy_port), 5) for _ in range(8)]
        try:
            assert wait_until(lambda: len(the_proxy(exporter).connections) == 8, 3)
            with client(exporter) as (sock, reader):
                turned_away = read_response(reader)  # before it sent anything
                assert turned_away.status == 503 and "too many connections" in json_line(turned_away)["error"]
                assert closed_by_peer(reader)
            assert requests.get(exporter.metrics_url, timeout=5).status_code == 200
        finally:
            for sock in held:
                sock.close()
        assert wait_until(lambda: not the_proxy(exporter).connections, 3)
        with client(exporter) as (sock, reader):
            sock.sendall(request_bytes("GET", "/api/version"))
            assert read_response(reader).status == 200


def test_the_connection_cap_follows_the_descriptor_limit(monkeypatch):
    monkeypatch.setattr(relay_module.resource, "getrlimit", lambda which: (1024, 4096))
    assert relay_module.connection_cap() == (1024 - relay_module.FD_RESERVE) // 2
    monkeypatch.setattr(relay_module.resource, "getrlimit", lambda which: (1 << 20, 1 << 20))
    assert relay_module.connection_cap() == relay_module.MAX_CONNECTIONS


def test_request_bodies_held_at_once_are_bounded_and_let_go_with_their_connections(exporter_cls, monkeypatch):
    """BUG at 6364460: 6 connections each sending 60 MiB of an unfinished body took RSS from 45 to 424 MB, not
    given back after they closed."""
    monkeypatch.setattr(relay_module, "MAX_BUFFERED_BYTES", 4 << 20)
    chunk = b"x" * (1 << 20)
    with RawUpstream() as upstream, exporter_cls(upstream.url) as exporter:
        proxy = the_proxy(exporter)
        socks = [socket.create_connection(("127.0.0.1", exporter.proxy_port), 5) for _ in range(3)]
        refused = []
        try:
            for index, sock in enumerate(socks):
                sock.sendall(request_bytes("POST", "/api/chat", content_length=3 << 20))
                for _ in range(2):
                    _send_quietly(sock, chunk)
                if index < 2:  # each read whole before the next connection sends
                    assert wait_until(lambda index=index: proxy.buffered == (index + 1) * 2 * len(chunk), 3)
                else:  # 3 x 2 MiB > 4 MiB: the third is refused
                    sock.settimeout(5)
                    reader = sock.makefile("rb")
                    refused.append(read_response(reader))
                    reader.close()
                    assert proxy.buffered <= 4 << 20
            assert refused[0].status == 503 and "retry later" in json_line(refused[0])["error"]
            connections = on_loop(exporter, lambda: [weakref.ref(c) for c in proxy.connections])
            assert len(connections) == 2
        finally:
            gc.disable()  # what is let go must be let go by reference counting, not by a later collection
            for sock in socks:
                sock.close()
        try:
            assert wait_until(lambda: proxy.buffered == 0 and not proxy.connections, 3)
            assert wait_until(lambda: all(ref() is None for ref in connections), 3), "a cycle keeps a connection"
        finally:
            gc.enable()
        assert upstream.requests == []
