"""servescope/host/bounded_http.py: every read of another service ends, holds a bounded body, stays on its origin, and says so
in one printable line without the URL's password (issue 42, "one bounded client for every other service")."""

from __future__ import annotations

import base64
import re
import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servescope.contracts import urls
from servescope.host import bounded_http
from servescope.host.bounded_http import MAX_JSON_DEPTH, Origin, ServiceError, parse_json
from servescope.text import printable
from tests.doubles.hostile_http import Hostile, drip, huge, reply

pytestmark = pytest.mark.timeout(120)

# Far above what any bounded read takes here, far below what the attacks would cost unbounded (minutes, or never).
HANG_S = 30.0
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def timed(call):
    started = time.monotonic()
    try:
        result = call()
    except ServiceError as exc:
        result = exc
    return time.monotonic() - started, result


# --- the deadline bounds the whole exchange --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "script",
    [
        drip(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"),  # the body at 1 byte/s
        drip(b"HTTP/1.1 200 OK\r\nX-Slow: ", byte=b"a"),  # a head that never ends
        drip(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", byte=b"1\r\nx\r\n"),  # a chunk a second
    ],
    ids=["body", "head", "chunks"],
)
def test_a_server_dripping_a_byte_a_second_costs_the_deadline(script):
    """Issue 42 case 1/7: a /metrics or /api/v1/query dripping 1 byte/s made a burst, and quick, never end."""
    with Hostile({"/metrics": script}) as server:
        elapsed, result = timed(lambda: bounded_http.get(f"{server.url}/metrics", 1.0))
    assert isinstance(result, ServiceError) and result.timed_out, result
    assert elapsed < HANG_S


def test_a_body_announced_past_the_cap_is_refused_before_it_is_read():
    """Issue 42 case 11: a 10 GB body on /api/version, /v1/models or /metrics was a MemoryError."""
    with Hostile({"/v1/models": huge()}) as server:
        elapsed, result = timed(lambda: bounded_http.get(f"{server.url}/v1/models", HANG_S))
    assert isinstance(result, ServiceError) and "body larger than" in str(result) and "10737418240" in str(result)


def test_a_body_past_the_cap_without_a_length_is_cut_at_the_cap():
    endless = drip(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", 0, byte=b"x" * 65536)  # no length: until close
    with Hostile({"/metrics": endless}) as server:
        _, result = timed(lambda: bounded_http.get(f"{server.url}/metrics", HANG_S, max_bytes=1 << 20))
    assert isinstance(result, ServiceError) and "body larger than 1048576 bytes" in str(result), result


# --- redirects stay on their origin ------------------------------------------------------------------------------------
def test_a_redirect_to_another_origin_is_not_followed_and_said():
    """Issue 42 case 14: `report plan` followed a Prometheus 302 to another port."""
    with Hostile({"/api": reply(b"secret", 200)}) as elsewhere:
        moved = reply(b"", 302, {"Location": f"{elsewhere.url}/api"})
        with Hostile({"/api": moved}) as server:
            _, result = timed(lambda: bounded_http.get(f"http://bob:PW@127.0.0.1:{server.port}/api", 5))
        assert elsewhere.requests == []  # nothing, credentials least of all, went there
    assert isinstance(result, ServiceError) and "redirected to another origin" in str(result)
    assert "PW" not in str(result) and "bob" not in str(result)


def test_a_redirect_within_the_origin_is_followed_with_its_credentials():
    routes = {"/old": reply(b"", 301, {"Location": "/new?x=1"}), "/new": reply({"ok": True})}
    with Hostile(routes) as server:
        answer = bounded_http.get(f"http://bob:PW@127.0.0.1:{server.port}/old", 5)
        assert server.paths() == ["/old", "/new"]
        assert server.requests[1].values("Authorization") == ["Basic " + base64.b64encode(b"bob:PW").decode()]
    assert answer.status == 200 and answer.json() == {"ok": True} and "PW" not in answer.url


def test_redirects_are_counted():
    with Hostile({"/loop": reply(b"", 302, {"Location": "/loop"})}) as server:
        _, result = timed(lambda: bounded_http.get(f"{server.url}/loop", 5))
    assert isinstance(result, ServiceError) and "more than 3 redirects" in str(result)


def test_a_location_with_control_characters_is_echoed_inert():
    with Hostile({"/x": reply(b"", 302, {"Location": "http://evil:1/\x1b[2J\x1b[31mok: fine"})}) as server:
        _, result = timed(lambda: bounded_http.get(f"{server.url}/x", 5))
    assert isinstance(result, ServiceError) and not UNSAFE.search(str(result)), repr(str(result))


# --- credentials never shown ---------------------------------------------------------------------------------------------
def test_every_message_masks_the_urls_credentials():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    for url in (f"http://bob:PW@127.0.0.1:{dead}/v1", f"http://bob:PW@127.0.0.1:{dead}", "http://bob:PW@[::1"):
        _, result = timed(lambda url=url: bounded_http.get(url, 2))
        assert isinstance(result, ServiceError) and "PW" not in str(result), result


def test_head_only_reads_the_status_and_headers_and_leaves_the_body():
    with Hostile({"/api/version": huge()}) as server:
        answer = bounded_http.get(f"{server.url}/api/version", HANG_S, head_only=True)
    assert answer.status == 200 and answer.headers["content-length"] == str(10 * 1024**3) and len(answer.body) < 1 << 20


# --- JSON ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [b"[" * 200_000, b'{"a":' * 100_000, b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)],
)
def test_json_nested_past_the_limit_is_one_error_never_a_recursion_error(body):
    """Issue 42 case 11: `[` x 200,000 on /api/version was a RecursionError."""
    with pytest.raises(ServiceError, match="nested deeper than 64 levels"):
        parse_json(body, "GET x")


def test_json_at_the_limit_is_read():
    assert parse_json(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH, "x") is not None


@settings(derandomize=True, max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300)))
def test_any_body_is_json_or_one_error(body):
    try:
        parse_json(body, "GET x")
    except ServiceError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("GET x: ")


# --- whatever comes back on the wire ---------------------------------------------------------------------------------------
RESPONSE_PARTS = st.sampled_from(
    [
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 302 Found\r\n",
        b"HTTP/1.1 103 Early\r\n\r\n",
        b"Content-Length: 5\r\n",
        b"Content-Length: 99999999999\r\n",
        b"Transfer-Encoding: chunked\r\n",
        b"Location: http://127.0.0.1:1/\r\n",
        b"Location: /again\r\n",
        b"X-A: \x1b[31m\r\n",
        b"\r\n",
        b"5\r\nhello\r\n0\r\n\r\n",
        b"[[[[[",
        b'{"a": 1}',
        b"\x00\xff",
    ]
)


@pytest.fixture(scope="module")
def wire():
    """One server whose every answer is the current example's bytes (then it closes)."""
    state = {"bytes": b""}

    def script(server, conn, request, index):
        conn.sendall(state["bytes"])
        return False

    with Hostile({"/": script, "/again": script}) as server:
        yield server, state


@settings(derandomize=True, max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(RESPONSE_PARTS, max_size=8).map(b"".join))
def test_whatever_a_server_sends_is_an_answer_or_one_error(wire, raw):
    server, state = wire
    state["bytes"] = raw
    started = time.monotonic()
    try:
        answer = bounded_http.get(f"{server.url}/", 3, max_bytes=1 << 20)
    except ServiceError as exc:
        assert "\n" not in str(exc) and not UNSAFE.search(str(exc))
    else:
        assert 100 <= answer.status < 600 and len(answer.body) <= 1 << 20
    assert time.monotonic() - started < HANG_S


# --- what is echoed ---------------------------------------------------------------------------------------------------------
@settings(derandomize=True, max_examples=300, deadline=None)
@given(st.text(max_size=400), st.integers(min_value=1, max_value=300))
def test_a_printable_line_is_one_line_without_controls_within_its_limit(text, limit):
    shown = printable.line(text, limit)
    assert len(shown) <= limit and not UNSAFE.search(shown) and "\n" not in shown


@settings(derandomize=True, max_examples=200, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Zs", "Zl", "Zp", "Cc"), blacklist_characters="/@"), max_size=20))
def test_a_printable_line_never_shows_a_urls_password(password):
    """A password is text without whitespace, "/" or "@" (else it is no URL's): masked, even when the line is cut."""
    secret = f"S3cr{password}"
    text = f"error at http://bob:{secret}@127.0.0.1:9090/api/v1/query \x1b[2J"
    assert secret not in printable.line(text, 60)


def test_an_origin_keeps_its_connections_alive():
    with Hostile({"/metrics": reply(b"ok")}) as server:
        with Origin(server.url) as origin:
            for _ in range(3):
                assert origin.get("/metrics", time.monotonic() + 5).body == b"ok"
        assert server.accepted == 1 and len(server.requests) == 3


@pytest.mark.parametrize(
    "typed, shown",
    [
        ("bob:PW@127.0.0.1:8000", "***@127.0.0.1:8000"),
        ("vllm=bob:P@W@h:1/v1", "vllm=***@h:1/v1"),
        ("bob:p=w@h:1", "***@h:1"),  # a password with "=": never taken for a kind
        ("http://bob:PW@h:1", "http://***@h:1"),
        ("h:1", "h:1"),
    ],
)
def test_an_address_as_typed_is_shown_without_its_password(typed, shown):
    """Issue 42 case 14: `exporter check bob:PW@HOST:PORT` printed it whole (no scheme: redact() found no URL)."""
    assert urls.redact_address(typed) == shown


def test_a_redirect_on_an_ipv6_origin_stays_on_it():
    """The origin compared as [::1]:PORT, not taken apart at its colons."""
    try:
        listener = socket.create_server(("::1", 0), family=socket.AF_INET6)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    port = listener.getsockname()[1]
    listener.settimeout(0.05)
    server = Hostile({"/old": reply(b"", 302, {"Location": f"http://[::1]:{port}/new"}), "/new": reply(b"ok")})
    server.listener.close()
    server.listener = listener  # the same server, on IPv6
    with server:
        assert bounded_http.get(f"http://[::1]:{port}/old", 5).body == b"ok"
    assert server.paths() == ["/old", "/new"]


def test_a_literal_address_is_looked_up_once_and_a_name_at_every_new_connection(monkeypatch):
    """The sampler connects ten times a second to an exporter that may not be up: an address needs no lookup, and
    under gevent each one is a round trip through its thread pool. A name is looked up again (a container moves)."""
    real, asked = socket.getaddrinfo, []
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: asked.append(host) or real(host, *a, **k))
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))  # bound, not listening: every connection is refused
        port = held.getsockname()[1]
        for host in ("127.0.0.1", "localhost"):
            origin = Origin(f"http://{host}:{port}")
            for _ in range(3):
                with pytest.raises(ServiceError):
                    origin.get("/metrics", time.monotonic() + 5)
    assert asked == ["127.0.0.1", "localhost", "localhost", "localhost"]
