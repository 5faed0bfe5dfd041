"""Accuracy of the measurement itself: the synthetic server's truth starts when a request arrives, chunk stamps come from the socket, a burst's sends don't wait on each other."""

from __future__ import annotations

import json
import select
import socket
from unittest import mock

import gevent
import gevent.select
import pytest
from gevent import monkey
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen import client as llm
from tests.doubles.synthetic_openai import SO_TIMESTAMPNS, SyntheticProcess, SyntheticServer

linux_stamps = pytest.mark.skipif(
    SO_TIMESTAMPNS is None, reason="kernel receive stamps (SO_TIMESTAMPNS) are Linux-only"
)
real_sleep = monkey.get_original("time", "sleep")  # blocks the whole process even where Locust has patched time


@linux_stamps
def test_server_times_its_first_chunk_from_the_requests_arrival_not_from_when_it_read_it():
    # Headers now, body 0.3 s later: a server whose clock starts when it has read the request would send the first
    # chunk >= 0.6 s after the request arrived; this one sends it TTFT (0.3 s) after the first bytes got there.
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "arrival"}], "max_tokens": 2, "stream": True}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with SyntheticServer(ttft=0.3, itl=0.01, tokens=2) as server:
        with socket.create_connection((server.host, server.port), timeout=10) as sock:
            sock.sendall(head)
            gevent.sleep(0.3)
            sock.sendall(body)
            reply = b""
            while b"[DONE]" not in reply:
                data = sock.recv(65536)
                if not data:
                    break
                reply += data
        for _ in range(100):  # the server files the stream just after its last write: the client may be first
            if server.stats.streams:
                break
            gevent.sleep(0.05)
        stream = list(server.stats.streams)[-1]
    assert b"[DONE]" in reply
    assert stream["t0"] == stream["t_arrival"] <= stream["t_request_line"]
    assert stream["t_body"] - stream["t_arrival"] >= 0.25
    first = stream["writes"][0] - stream["t_arrival"]
    # A server timing from the read of the request writes no sooner than TTFT after it read the body; this one wrote
    # before that. Held against the body's own read stamp, which a busy host delays alike, not a fixed 0.55 s.
    assert 0.3 <= first and stream["writes"][0] < stream["t_body"] + 0.3, (
        first,
        stream["t_body"] - stream["t_arrival"],
    )


@linux_stamps
@pytest.mark.serial  # the client's own error, in milliseconds: a CPU shared with another worker adds to it
def test_chunk_stamp_is_when_the_bytes_arrived_not_when_the_client_got_round_to_reading_them():
    server = SyntheticProcess("--ttft", "0.05", "--itl", "0.1", "--tokens", "2")
    transport = llm.make_transport("geventhttpclient", server.url, timeout=10)
    try:
        # The process is busy for 0.25 s right after the first chunk (as when 63 other streams are served first);
        # the second chunk reaches the socket 0.1 s after the first all the same.
        m = llm.stream_chat(
            transport,
            "/v1/chat/completions",
            "openai",
            llm.chat_payload("openai", "m", "busy reader", 2, 0.0, False),
            on_first_content=lambda _m: real_sleep(0.25),
        )
        (stream,) = server.streams(at_least=1)
    finally:
        transport.close()
        server.stop()
    assert m.ok, m.error
    server_gap = stream["writes"][1] - stream["writes"][0]
    assert abs(m.itl_s[0] - server_gap) < 0.02, (m.itl_s, server_gap)  # stamping after the read: ~+0.15 s


def test_a_pooled_connection_is_handed_out_without_letting_other_greenlets_run_first():
    # Locust patches select: gevent's select(timeout=0) ends in gevent.sleep(0). In a burst, that hub round trip
    # between a request's send stamp and its send let every other user stamp first (+17 ms median TTFT at 64).
    with (
        SyntheticServer(ttft=0.01, itl=0.001, tokens=2) as server,
        mock.patch.object(select, "select", gevent.select.select),
    ):
        transport = llm.make_transport("geventhttpclient", server.url, timeout=10)
        try:
            transport.connect()
            pool = transport.client._connection_pool
            others: list[int] = []
            other = gevent.spawn(others.append, 1)
            sock = pool.get_socket()
            assert others == [], "get_socket() yielded to the hub"
            pool.return_socket(sock)
            other.join()
            assert others == [1]
        finally:
            transport.close()


def test_connect_opens_the_connection_the_next_request_uses():
    with SyntheticServer(ttft=0.01, itl=0.001, tokens=3) as server:
        transport = llm.make_transport("geventhttpclient", server.url, timeout=10)
        pool = transport.client._connection_pool
        opened: list[object] = []
        hook = pool.after_connect
        pool.after_connect = lambda sock: (opened.append(sock), hook(sock))
        try:
            transport.connect()
            assert len(opened) == 1
            for _ in range(5):
                m = llm.stream_chat(
                    transport, "/v1/chat/completions", "openai", llm.chat_payload("openai", "m", "again", 3, 0.0, False)
                )
                assert m.ok, m.error
                transport.connect()
        finally:
            transport.close()
    assert len(opened) == 1  # the stream is read to its HTTP end, so the connection goes back to the pool


@linux_stamps
@pytest.mark.serial  # the client's own error, in milliseconds: a CPU shared with another worker adds to it
def test_a_burst_after_connect_sends_each_request_right_after_its_stamp():
    """64 users released at once, each on a connection opened before the release: TTFT against the server's own
    stamps (first write - arrival of the request) is the client's error alone; it must not grow with the burst."""
    server = SyntheticProcess("--ttft", "0.1", "--itl", "0.01", "--tokens", "4")
    users = 64
    transports = [llm.make_transport("geventhttpclient", server.url, timeout=30) for _ in range(users)]
    try:
        for transport in transports:
            transport.connect()
        gate = gevent.event.Event()

        def user(i: int) -> llm.Measurement:
            gate.wait()
            return llm.stream_chat(
                transports[i],
                "/v1/chat/completions",
                "openai",
                llm.chat_payload("openai", "m", f"user {i}", 4, 0.0, False),
            )

        greenlets = [gevent.spawn(user, i) for i in range(users)]
        gevent.sleep(0.05)
        gate.set()
        gevent.joinall(greenlets, timeout=60)
        streams = {s["prompt"]: s for s in server.streams(at_least=users)}
    finally:
        for transport in transports:
            transport.close()
        server.stop()
    errors = []
    for i, greenlet in enumerate(greenlets):
        m = greenlet.value
        assert m is not None and m.ok, m and m.error
        stream = streams[f"user {i}"]
        errors.append(m.ttft_s - (stream["writes"][0] - stream["t_arrival"]))
    errors.sort()
    assert errors[0] > -0.001  # a chunk cannot be seen before it was sent
    # Generous for a shared 2-core machine; before the fix the median was ~17 ms at 64 users (accuracy is in bench/).
    assert errors[len(errors) // 2] < 0.005, errors


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(), JSON_VALUES, max_size=6))
def test_chunk_parser_reads_every_json_object_as_json_loads_does(obj):
    data = json.dumps(obj, ensure_ascii=False).encode()
    assert llm._json_object(data, 0) == json.loads(data)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=40),
        st.text(max_size=40).map(str.encode),
        st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=3)
        .map(lambda d: json.dumps(d).encode())
        .flatmap(lambda b: st.integers(0, len(b)).map(lambda cut: b[:cut] + b"x" * (cut % 2))),
    )
)
def test_chunk_parser_rejects_what_json_loads_rejects_as_a_malformed_chunk(data):
    data = data.strip()  # as the SSE/NDJSON readers hand it over
    try:
        expected = json.loads(data.decode("utf-8"))
    except ValueError:
        expected = None
    if isinstance(expected, dict):
        assert llm._json_object(data, 0) == expected
    else:
        with pytest.raises(llm.StreamError, match="^malformed chunk after 3 content chunks"):
            llm._json_object(data, 3)


def _sse_event(delta: dict | None = None, **extra) -> bytes:
    body = {"choices": [{"index": 0, "delta": delta}] if delta is not None else [], **extra}
    return b"data: " + json.dumps(body).encode()


SSE_EVENTS = st.lists(
    st.one_of(
        st.sampled_from([{"role": "assistant", "content": ""}, {"content": "a"}, {"content": "b c"}, {}]).map(
            _sse_event
        ),
        st.just(_sse_event(usage={"completion_tokens": 3, "prompt_tokens": 2})),
        st.sampled_from([b": keep-alive", b"event: message", b"data:" + json.dumps({"choices": []}).encode()]),
    ),
    max_size=8,
)


class _Blocks:
    """A response whose body arrives in the given reads, the i-th stamped i."""

    def __init__(self, reads: list[bytes]):
        self.reads = reads

    def blocks(self, clock):
        yield from enumerate(self.reads)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(SSE_EVENTS, st.sampled_from([b"\n\n", b"\r\n\r\n", b"\n"]), st.data())
def test_a_stream_cut_into_any_reads_is_measured_as_its_events_say(events, separator, data):
    # One event per read (a stream read as it comes: the readers' shortcut), several per read, events cut mid-line:
    # the same chunks counted, each stamped by the read that completed its line, the same end.
    body = b"".join(event + separator for event in [*events, b"data: [DONE]"])
    if data.draw(st.booleans()):  # a read per event, as a stream read as it comes arrives
        reads = [event + separator for event in [*events, b"data: [DONE]"]]
    else:
        cuts = sorted(data.draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=6, unique=True)))
        reads = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True) if body[a:b]]
    whole, parts = llm.Measurement(0.0, 0.0), llm.Measurement(0.0, 0.0)
    llm._read_sse(_Blocks([body]), whole, None, lambda: -1.0)
    llm._read_sse(_Blocks(reads), parts, None, lambda: -1.0)
    assert whole.finished and parts.finished
    assert (
        len(parts.content_times)
        == len(whole.content_times)
        == sum(b'"content": "' in e and b'""' not in e for e in events)
    )
    assert parts.usage_tokens == whole.usage_tokens
    # Each chunk's stamp: the read in which its line ended.
    ends, offset = [], 0
    for index, read in enumerate(reads):
        offset += len(read)
        ends.append((offset, index))
    expected, position = [], 0
    for event in events:
        position += len(event) + len(separator)
        if b'"content": "' in event and b'""' not in event:
            line_end = position - len(separator) + separator.index(b"\n") + 1  # its line ends at the first newline
            expected.append(next(index for end, index in ends if end >= line_end))
    assert parts.content_times == expected
