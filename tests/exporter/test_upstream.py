"""The exporter's HTTP reads of an engine on raw sockets: one deadline over the whole fetch, strict framing, reuse, auth."""

from __future__ import annotations

import base64
import socket
import time
from contextlib import contextmanager

import pytest

from exporter.upstream import MISSING, Unauthorized, Upstream, UpstreamError
from tests.exporter.test_proxy_http import RawUpstream

pytestmark = pytest.mark.timeout(60)

PAGE = b"vllm:num_requests_running 1\n" * 2248  # 62,944 bytes, about a vLLM page


def drip(data: bytes, size: int, every: float):
    """A RawUpstream script sending `data` in pieces of `size` bytes, one every `every` seconds (a slow or stuck
    engine), then closing."""

    def script(upstream, conn, request, index):
        for start in range(0, len(data), size):
            conn.sendall(data[start : start + size])
            time.sleep(every)
        return False

    return script


def answer(body: bytes = b"ok", *, status: int = 200, headers: bytes = b"", close: bool = False):
    def script(upstream, conn, request, index):
        conn.sendall(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n%s\r\n%s" % (status, len(body), headers, body))
        return not close

    return script


def timed_get(url: str, timeout: float, path: str = "/metrics") -> tuple[float, object]:
    upstream = Upstream(url)
    started = time.monotonic()
    try:
        result: object = upstream.get_bytes(path, started + timeout)
    except UpstreamError as exc:
        result = exc
    finally:
        upstream.close()
    return time.monotonic() - started, result


# --- one deadline over the whole fetch ----------------------------------------------
@pytest.mark.parametrize(
    "script",
    [
        drip(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(PAGE) + PAGE, 256, 0.05),  # 12 s of body
        drip(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 400, 1, 0.02),  # a head that never ends
        drip(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1\r\nx\r\n" * 400, 6, 0.05),
    ],
    ids=["slow-body", "slow-head", "slow-chunks"],
)
def test_a_slow_engine_costs_the_deadline_and_no_more(script):
    """BUG at 6364460: the socket timeout bounded each read, not the fetch: 256 B every 50 ms held a scrape 12.4 s."""
    with RawUpstream(script) as engine:
        elapsed, result = timed_get(engine.url, 0.5)
    assert isinstance(result, UpstreamError) and "timed out" in str(result), result
    # 2 s of slack for a busy host; read to their end, these scripts last 3.3 s (slow-chunks) to 12 s (slow-body).
    assert elapsed < 0.5 + 2, f"a fetch with a 0.5 s budget took {elapsed:.2f} s"


def test_a_connect_that_never_completes_costs_the_deadline_and_no_more():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    for _ in range(4):  # fill the accept queue: further SYNs are dropped, connects hang
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(listener.getsockname())
        fillers.append(filler)
    try:
        elapsed, result = timed_get(f"http://127.0.0.1:{listener.getsockname()[1]}", 0.5)
    finally:
        for sock in (*fillers, listener):
            sock.close()
    assert isinstance(result, UpstreamError) and elapsed < 0.5 + 2, (elapsed, result)  # else SYN retries: minutes


# --- strict framing -----------------------------------------------------------------
@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 62947\r\n\r\n" + b"x" * 20_000, "closed after 20"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\nok", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: two\r\n\r\nok", "Content-Length"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            "Transfer-Encoding",
        ),
        (b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 2\r\n\r\nok", "header"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n", "closed after"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\nok", "head larger"),
        (b"not http at all\r\n\r\n", "malformed HTTP response"),
    ],
    ids=[
        "cut-short",
        "duplicate-length",
        "negative-length",
        "word-length",
        "length-and-chunked",
        "nul",
        "last-chunk-missing",
        "huge-head",
        "garbage",
    ],
)
def test_a_response_that_is_not_whole_and_well_framed_is_an_error(raw, reason):
    """BUG at 6364460: http.client took 20,000 of 62,947 bytes as the whole page, and lenient headers as fine."""
    with RawUpstream(drip(raw, 1 << 20, 0)) as engine:
        _, result = timed_get(engine.url, 3)
    assert isinstance(result, UpstreamError) and reason in str(result), result


def test_a_body_that_ends_with_the_connection_is_read_whole():
    with RawUpstream(drip(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + PAGE, 4096, 0)) as engine:
        _, result = timed_get(engine.url, 3)
    assert result == PAGE


def test_chunked_bodies_and_interim_responses_are_read():
    raw = b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    raw += b"3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n"
    with RawUpstream(drip(raw, 5, 0)) as engine:
        _, result = timed_get(engine.url, 3)
    assert result == b"abcde"


def test_an_oversized_body_is_refused_before_it_is_all_held():
    raw = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"x" * (17 * 1024 * 1024)
    with RawUpstream(drip(raw, 1 << 20, 0)) as engine:
        _, result = timed_get(engine.url, 10)
    assert isinstance(result, UpstreamError) and "larger than" in str(result)


# --- connections, statuses, credentials ----------------------------------------------------------------
def test_kept_alive_connections_are_reused_and_a_stale_one_is_replaced():
    def script(upstream, conn, request, index):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        return len(upstream.requests) != 2  # the second answer closes its connection, unannounced

    with RawUpstream(script) as engine:
        upstream = Upstream(engine.url)
        for _ in range(4):
            assert upstream.get_bytes("/metrics", time.monotonic() + 3) == b"ok"
        upstream.close()
    assert engine.accepted == 2 and len(engine.requests) == 4


def test_statuses_map_to_missing_unauthorized_and_errors():
    with (
        RawUpstream(answer(status=501)) as off,
        RawUpstream(answer(status=401)) as locked,
        RawUpstream(answer(status=500)) as broken,
    ):
        deadline = time.monotonic() + 3
        off_upstream, locked_upstream, broken_upstream = Upstream(off.url), Upstream(locked.url), Upstream(broken.url)
        assert off_upstream.get_bytes("/metrics", deadline, missing_ok=True) is MISSING
        with pytest.raises(UpstreamError, match="HTTP 501"):
            off_upstream.get_bytes("/metrics", deadline)
        with pytest.raises(Unauthorized, match="API key"):
            locked_upstream.get_bytes("/v1/models", deadline, missing_ok=True)
        with pytest.raises(UpstreamError, match="HTTP 500"):
            broken_upstream.get_bytes("/metrics", deadline, missing_ok=True)
        for upstream in (off_upstream, locked_upstream, broken_upstream):
            upstream.close()


def test_an_api_key_is_sent_as_bearer_and_url_credentials_as_basic_never_both():
    with RawUpstream(answer()) as engine:
        port = engine.url.rsplit(":", 1)[1]
        deadline = time.monotonic() + 3
        for upstream in (
            Upstream(engine.url, api_key="sk-123"),
            Upstream(f"http://al%40ice:p%3Ass@127.0.0.1:{port}/prefix"),
            Upstream(f"http://al:pw@127.0.0.1:{port}", api_key="sk-9"),
        ):
            upstream.get_bytes("/v1/models", deadline)
            upstream.close()
    bearer, basic, both = engine.requests
    assert bearer.values("Authorization") == ["Bearer sk-123"]
    token = base64.b64encode(b"al@ice:p:ss").decode()
    assert basic.start == b"GET /prefix/v1/models HTTP/1.1" and basic.values("Authorization") == [f"Basic {token}"]
    assert basic.values("Host") == [f"127.0.0.1:{port}"]  # never the userinfo
    assert both.values("Authorization") == ["Bearer sk-9"]


@contextmanager
def nothing_listening():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_refused_connection_is_one_short_reason():
    with nothing_listening() as url:
        _, result = timed_get(url, 3)
    assert isinstance(result, UpstreamError) and str(result).endswith("connection refused"), result
