"""Load generator measurement: TTFT/ITL/E2E/TPOT from raw stamps, token sources, every failure kind, prompt sets."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time

import pytest
from geventhttpclient.response import HTTPParseError, HTTPResponse

from bench import requests_transport
from loadgen import client as llm
from servescope.host.kernel_stamps import SO_TIMESTAMPNS, TIMESPEC
from servescope.workloads import prompts
from tests.doubles.ollama_simulator import OllamaSimulator
from tests.doubles.synthetic_openai import SyntheticServer
from tests.harness import run_python

# The load generator's own client, and bench/'s requests transport behind the same interface: the same measurement.
TRANSPORTS = [*llm.TRANSPORTS, requests_transport.NAME]


@pytest.fixture(autouse=True)
def bench_transport(monkeypatch):
    monkeypatch.setitem(llm.TRANSPORTS, requests_transport.NAME, requests_transport.RequestsTransport)


def chat(
    server_url: str,
    transport: str,
    prompt: str = "Say OK.",
    max_tokens: int = 8,
    timeout: float = 5.0,
    api: str = "openai",
    path: str = "/v1/chat/completions",
    model: str = "synthetic/model",
) -> llm.Measurement:
    t = llm.make_transport(transport, server_url, timeout=timeout)
    try:
        return llm.stream_chat(t, path, api, llm.chat_payload(api, model, prompt, max_tokens, 0.0, api == "openai"))
    finally:
        t.close()


@pytest.fixture(scope="module")
def server():
    with SyntheticServer(ttft=0.08, itl=0.01, tokens=64, timings=True) as s:
        yield s


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_ttft_skips_empty_role_chunk_and_itl_covers_every_gap(server, transport):
    m = chat(server.url, transport, max_tokens=12)
    assert m.ok, m.error
    # The role chunk goes out at t0: counting it would give a TTFT of ~0. Content can't come before
    # its deadline; upper bounds are loose because the test machine is shared (accuracy is in bench/).
    assert 0.08 <= m.ttft_s < 0.08 + 0.5
    assert len(m.content_times) == 12 and len(m.itl_s) == 11
    assert all(0.0 <= gap < 0.5 for gap in m.itl_s)
    assert sum(m.itl_s) == pytest.approx(m.e2e_s - m.ttft_s)
    assert 0.08 + 11 * 0.01 - 0.002 <= m.e2e_s < 0.08 + 11 * 0.01 + 0.5
    assert m.output_tokens == 12 and m.tokens_source == "usage"
    assert m.prompt_tokens == 2  # the synthetic server counts words
    assert m.tpot_s == pytest.approx((m.e2e_s - m.ttft_s) / 11)
    assert m.engine_stats["timings"]["predicted_n"] == 12  # llama.cpp's timings object kept as sent


def test_chunk_count_is_a_flagged_fallback_without_usage():
    with SyntheticServer(ttft=0.01, itl=0.001, tokens=5, usage=False) as s:
        m = chat(s.url, "geventhttpclient")
    assert m.ok and m.output_tokens == 5 and m.tokens_source == "chunks"


def test_payload_asks_for_usage_and_honours_ignore_eos_only_where_accepted():
    openai = llm.chat_payload("openai", "m", "hi", 48, 0.0, True)
    assert openai["stream_options"] == {"include_usage": True} and openai["ignore_eos"] is True
    assert openai["max_tokens"] == 48 and openai["temperature"] == 0.0
    assert "ignore_eos" not in llm.chat_payload("openai", "m", "hi", 48, 0.0, False)
    ollama = llm.chat_payload("ollama", "m", "hi", 48, 0.0, True)
    assert "ignore_eos" not in ollama and ollama["options"] == {"num_predict": 48, "temperature": 0.0}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    ("fault", "kind", "reason", "chunks"),
    [
        ("status=503", llm.ErrorKind.HTTP_5XX, "HTTP 503: synthetic fault: HTTP 503", 0),
        ("status=500", llm.ErrorKind.HTTP_5XX, "HTTP 500: synthetic fault: HTTP 500", 0),
        ("status=429", llm.ErrorKind.HTTP_4XX, "HTTP 429: synthetic fault: HTTP 429", 0),
        ("cut=3", llm.ErrorKind.STREAM_CUT, "stream cut after 3 content chunks", 3),
        ("malformed=2", llm.ErrorKind.MALFORMED_CHUNK, "malformed chunk after 2 content chunks", 2),
        ("error=4", llm.ErrorKind.ENGINE_ERROR, "engine error mid-stream after 4 content chunks", 4),
        ("stall=2", llm.ErrorKind.TIMEOUT, "timeout before the first content chunk", 0),
    ],
)
def test_each_failure_has_a_kind_and_a_reason_and_keeps_partial_timings(server, transport, fault, kind, reason, chunks):
    m = chat(server.url, transport, prompt=f"Say OK. [[fault:{fault}]]", timeout=0.6)
    assert not m.ok
    assert m.error_kind is kind and m.error.startswith(reason), (m.error_kind, m.error)
    assert "\n" not in m.error
    assert len(m.content_times) == chunks
    if chunks:
        assert m.ttft_s is not None and len(m.itl_s) == chunks - 1
        assert m.tokens_source == "chunks"
    # The same client goes on working after any failure.
    after = chat(server.url, transport, max_tokens=3)
    assert after.ok, after.error


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stream_longer_than_the_timeout_is_not_cut_while_its_gaps_are_shorter(transport):
    # The network timeout bounds the wait for the next bytes, not the whole answer: 5 tokens 0.3 s apart take longer
    # than a 1 s timeout, each gap well inside it (the client's reader keeps one timer per stream, not one per read).
    with SyntheticServer(ttft=0.05, itl=0.3, tokens=5) as s:
        m = chat(s.url, transport, max_tokens=5, timeout=1.0)
    assert m.ok, m.error
    assert len(m.content_times) == 5 and m.e2e_s > 1.0


def _stalls_after_two_chunks(server, conn, request, index) -> bool:
    """An SSE answer whose server sends its role chunk and two content chunks, then nothing for a minute."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    for delta in ('{"role": "assistant", "content": ""}', '{"content": "a"}', '{"content": "b"}'):
        event = f'data: {{"choices": [{{"index": 0, "delta": {delta}}}]}}\n\n'.encode()
        conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
        time.sleep(0.05)
    server._stop.wait(60)
    return False


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stream_that_stalls_mid_answer_times_out_with_the_chunks_it_had(transport):
    # The server stays connected and silent: only the client's network timeout can end it, after 2 content chunks.
    from tests.doubles.hostile_http import Hostile

    with Hostile({"/v1/chat/completions": _stalls_after_two_chunks}) as s:
        m = chat(s.url, transport, timeout=0.5)
    assert m.error_kind is llm.ErrorKind.TIMEOUT and m.error == "timeout after 2 content chunks", m.error
    assert len(m.content_times) == 2 and m.elapsed_s < 30


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_connection_refused(transport):
    from tests.conftest import free_port

    m = chat(f"http://127.0.0.1:{free_port()}", transport)
    assert m.error == "connection refused" and m.status == 0 and m.content_times == []
    assert m.error_kind is llm.ErrorKind.CONNECTION_REFUSED


def stream(url: str, api: str, path: str, prompt, model: str = "synthetic/model") -> llm.Measurement:
    t = llm.make_transport("geventhttpclient", url, timeout=5.0)
    try:
        return llm.stream_chat(t, path, api, llm.chat_payload(api, model, prompt, 6, 0.0, False), keep_text=True)
    finally:
        t.close()


def test_a_conversation_goes_out_whole_and_the_answer_text_comes_back():
    history = [
        {"role": "user", "content": "one two three"},
        {"role": "assistant", "content": "tok0 tok1"},
        {"role": "user", "content": "four"},
    ]
    assert llm.chat_payload("openai", "m", history, 8, 0.0, True)["messages"] == history
    assert llm.chat_payload("ollama", "m", history, 8, 0.0, True)["messages"] == history
    with SyntheticServer(ttft=0.01, itl=0.001, tokens=64) as s:
        m = stream(s.url, "openai", "/v1/chat/completions", history)
    assert m.text == "tok0 tok1 tok2 tok3 tok4 tok5 " and m.prompt_tokens == 6
    assert m.cached_tokens is None  # vLLM says nothing about its cache unless started with the details flag
    with OllamaSimulator(token_delay=0.001) as sim:
        o = stream(sim.url, "ollama", "/api/chat", history, model=sim.models[0])
    assert o.text == "The cache holds keys and values" and o.cached_tokens is None


@pytest.mark.parametrize(
    ("server", "where"),
    [
        ({"timings": True}, "llama.cpp: timings.cache_n and usage.prompt_tokens_details"),
        ({"prompt_tokens_details": True}, "vLLM --enable-prompt-tokens-details: usage.prompt_tokens_details"),
    ],
)
def test_the_engines_own_count_of_cached_prompt_tokens(server, where):
    prompt = [{"role": "user", "content": " ".join(f"w{k}" for k in range(40))}]
    with SyntheticServer(ttft=0.01, itl=0.001, tokens=8, prefix_cache=True, prefix_block=16, **server) as s:
        first = stream(s.url, "openai", "/v1/chat/completions", prompt)
        again = stream(s.url, "openai", "/v1/chat/completions", prompt)
    assert (first.cached_tokens, again.cached_tokens, again.prompt_tokens) == (0, 32, 40), where
    assert again.text is not None and first.answer is not None


def test_ollama_ndjson_keeps_engine_stats_in_nanoseconds():
    with OllamaSimulator(token_delay=0.005) as sim:
        m = chat(sim.url, "geventhttpclient", api="ollama", path="/api/chat", model=sim.models[0], max_tokens=6)
        sent = sim.last_request
    assert m.ok, m.error
    assert m.tokens_source == "eval_count" and m.output_tokens == m.engine_stats["eval_count"]
    for key in ("eval_duration_ns", "prompt_eval_duration_ns", "load_duration_ns", "prompt_eval_count"):
        assert key in m.engine_stats, m.engine_stats
    assert isinstance(m.engine_stats["eval_duration_ns"], int)
    assert m.ttft_s is not None and len(m.itl_s) == len(m.content_times) - 1
    assert m.output_tokens == 6 and json.loads(sent["body"])["options"]["num_predict"] == 6


def test_prompt_sets_shipped_synthetic_and_user_files(tmp_path):
    burst3 = prompts.load("burst3")
    assert [p.text for p in burst3.prompts] == [
        "Say OK.",
        "In one sentence, what is a container?",
        "Name two container runtimes.",
    ]
    assert len(prompts.load("sequential4")) == 4 and len(prompts.load("mixed")) >= 4
    assert burst3.sha256 == prompts.load("burst3").sha256 != prompts.load("sequential4").sha256
    synthetic = prompts.load("synthetic:64x3")
    assert len(synthetic) == 3 and all(len(p.text.split()) == 64 for p in synthetic.prompts)
    assert synthetic.sha256 == prompts.load("synthetic:64x3").sha256
    (tmp_path / "mine.txt").write_text("first\n\nsecond\n")
    assert [p.text for p in prompts.load(str(tmp_path / "mine.txt")).prompts] == ["first", "second"]
    (tmp_path / "mine.jsonl").write_text('{"id": "a", "prompt": "x"}\n"plain"\n')
    loaded = prompts.load(str(tmp_path / "mine.jsonl"))
    assert [(p.id, p.text) for p in loaded.prompts] == [("a", "x"), ("mine-2", "plain")]
    (tmp_path / "bad.jsonl").write_text("{nope\n")
    with pytest.raises(prompts.PromptSetError, match="bad.jsonl:1: not JSON"):
        prompts.load(str(tmp_path / "bad.jsonl"))
    with pytest.raises(prompts.PromptSetError, match="not one of"):
        prompts.load("no-such-set")


@pytest.mark.parametrize("old, new", sorted(prompts.RENAMED.items()))
def test_a_shipped_sets_first_name_loads_it_under_its_new_name(old, new):
    """`--prompts seed3` / LOADGEN_PROMPTS=seed3 in a user's .env: the same prompts, recorded as burst3."""
    loaded, canonical = prompts.load(old), prompts.load(new)
    assert new in prompts.SHIPPED and old not in prompts.SHIPPED
    assert loaded.name == new and loaded.prompts == canonical.prompts
    # The hash is of the prompts alone: an old run folder's seed3 and a new run's burst3 are one set to the
    # matched-set rule.
    assert loaded.sha256 == canonical.sha256 == dataclasses.replace(canonical, name=old).sha256


def test_the_installed_geventhttpclient_has_every_internal_the_client_reads():
    llm.check_geventhttpclient()


CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunked_reader(sock) -> llm._Arrivals:
    """A stream's reader over `sock`, its response past the headers of a chunked body."""
    response = HTTPResponse()
    response.feed(CHUNKED_HEAD)
    return llm._Arrivals(sock, response)


def _framed(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_a_stream_is_read_off_the_socket_below_gevents_wrapper_where_gevent_has_the_internals():
    # Without them the client still works (through gevent's recvmsg) but pays a Timeout per read: say so here.
    from gevent import socket as gevent_socket

    a, b = gevent_socket.socketpair()
    with a, b:
        a.settimeout(2.0)
        response = HTTPResponse()
        response.feed(CHUNKED_HEAD)
        arrivals = llm._Arrivals.of(a, response)
        assert arrivals is not None and arrivals.limit == 2.0
        arrivals.start()
        b.sendall(_framed(b"x"))
        assert [block for _stamp, block in arrivals.take()] == [b"x"]
        b.sendall(b"0\r\n\r\n")  # the body's end: nothing more, and the stream ended without a failure
        assert arrivals.take() == [] and arrivals.ended and response.message_complete
        arrivals.stop()


def test_a_stream_is_read_as_its_bytes_come_and_its_reader_woken_once_per_few_reads(monkeypatch):
    # Each read is made in the event loop as the socket turns readable (none fails to find bytes), stamped then;
    # the reader greenlet is woken for the first bytes, then once per WAKE_EVERY reads and at the end: not per read.
    import gevent
    from gevent import socket as gevent_socket

    monkeypatch.setattr(llm, "WAKE_EVERY", 3)
    chunks = [b"data: %d\n\n" % i for i in range(7)]
    with gevent_socket.create_server(("127.0.0.1", 0)) as listener:
        reader = gevent_socket.create_connection(listener.getsockname())
        writer, _ = listener.accept()
        with reader, writer:
            reader.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)

            def send() -> None:
                for chunk in chunks:
                    gevent.sleep(0.05)
                    writer.sendall(_framed(chunk))
                writer.sendall(b"0\r\n\r\n")

            arrivals = _chunked_reader(reader)
            tries, made = [], []
            real = arrivals._recvmsg

            def counted(*args):
                tries.append(1)
                result = real(*args)
                made.append(result[0])
                return result

            arrivals._recvmsg = counted
            sender = gevent.spawn(send)
            arrivals.start()
            got = []
            while taken := arrivals.take():
                got += taken
            sender.join()
            arrivals.stop()
    assert b"".join(block for _stamp, block in got) == b"".join(chunks)
    stamps = [stamp for stamp, _block in got]
    assert stamps == sorted(stamps) and all(stamp <= time.perf_counter() for stamp in stamps)
    assert len(tries) == len(made) and all(made)  # every read found bytes
    assert arrivals.woken <= 2 + len(made) // 3  # the first bytes, each third read after, the end


def test_a_read_that_fails_or_a_close_ends_the_stream_after_what_was_read_before_it():
    from gevent import socket as gevent_socket

    a, b = gevent_socket.socketpair()
    with a, b:
        arrivals = _chunked_reader(a)
        arrivals.start()
        b.sendall(_framed(b"first"))
        assert [block for _stamp, block in arrivals.take()] == [b"first"]
        b.sendall(_framed(b"second") + b"zz\r\n")  # a chunk, and framing llhttp refuses in the same read
        with pytest.raises(HTTPParseError):  # that read's bytes are no measurement (as before this reader)
            arrivals.take()
        assert arrivals.ended and arrivals.take() == []
        arrivals.stop()

    a, b = gevent_socket.socketpair()
    with a, b:
        arrivals = _chunked_reader(a)
        arrivals.start()
        b.sendall(_framed(b"first"))
        b.sendall(_framed(b"second"))
        b.close()  # the server gone before the body's end
        assert b"".join(block for _stamp, block in arrivals.take()) == b"firstsecond"
        with pytest.raises(EOFError):
            arrivals.take()
        arrivals.stop()


def test_a_reader_stopped_while_it_waits_still_takes_every_read_made_before():
    # Ctrl-C or a phase's end kills the user mid-stream: the reads its reader was not yet woken for are its partial
    # measurement all the same, then the stop goes on.
    import gevent
    from gevent import socket as gevent_socket
    from greenlet import GreenletExit

    a, b = gevent_socket.socketpair()
    with a, b:
        arrivals = _chunked_reader(a)
        arrivals.start()

        def read() -> tuple[list[bytes], str]:
            got = []
            try:
                while taken := arrivals.take():
                    got += [block for _stamp, block in taken]
            except GreenletExit:
                return got, "stopped"
            return got, "ended"

        reader = gevent.spawn(read)
        for data in (b"one", b"two", b"three"):  # the first wakes the reader; the next two are read, not woken for
            b.sendall(_framed(data))
            gevent.sleep(0.02)
        reader.kill()
        arrivals.stop()
    assert reader.value == ([b"one", b"two", b"three"], "stopped")


def _sse(delta_or_event: str) -> bytes:
    event = f"data: {delta_or_event}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(event), event)


def _holds_after(*events: str, sent: threading.Event | None = None):
    """An SSE answer of these events, one write each, then neither the HTTP body's end nor a close for a minute;
    `sent` is set once the last event is written."""

    def handle(server, conn, request, index) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for event in events:
            conn.sendall(_sse(event))
            time.sleep(0.05)
        if sent is not None:
            sent.set()
        server._stop.wait(60)
        return False

    return handle


ROLE = '{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}'
CONTENT = '{"choices": [{"index": 0, "delta": {"content": "a"}}]}'


def test_a_stream_whose_server_holds_the_body_open_after_done_ends_at_done():
    # The reader is woken for a read holding [DONE], not only every few reads or at the HTTP body's end: the request
    # ends there (and its connection is dropped after DRAIN_S), not at the network timeout.
    from tests.doubles.hostile_http import Hostile

    with Hostile({"/v1/chat/completions": _holds_after(ROLE, CONTENT, CONTENT, "[DONE]")}) as s:
        m = chat(s.url, "geventhttpclient", timeout=30.0)
    assert m.ok and m.finished and len(m.content_times) == 2, m.error
    assert m.elapsed_s < 20  # DRAIN_S after [DONE], where the timeout is 30 s


def test_a_stop_that_comes_while_the_streams_end_waits_unread_is_not_swallowed():
    # The reader is woken for its first reads and then every few: content and an engine's error event read while it
    # waits stay in its buffer. A stop then hands it those reads first; the error ends the stream and the reader never asks
    # again, so the stop must come from closing the response, or the user would go on sending after its phase ended.
    import gevent
    from greenlet import GreenletExit

    from tests.doubles.hostile_http import Hostile

    error = '{"error": {"message": "engine went away", "code": 500}}'
    sent = threading.Event()
    with Hostile(
        {"/v1/chat/completions": _holds_after(ROLE, CONTENT, CONTENT, CONTENT, CONTENT, error, sent=sent)}
    ) as s:
        t = llm.make_transport("geventhttpclient", s.url, timeout=5.0)
        holder: list[llm.Measurement] = []
        try:
            payload = llm.chat_payload("openai", "synthetic/model", "hi", 4, 0.0, True)
            user = gevent.spawn(llm.stream_chat, t, "/v1/chat/completions", "openai", payload, into=holder)
            # The stop comes once the server wrote its last event (an ordering, not a time: a busy host may hold its
            # thread past any fixed sleep), and two turns of the event loop later, in which the client read it.
            deadline = time.monotonic() + 10
            while not sent.is_set() and time.monotonic() < deadline:
                gevent.sleep(0.01)
            gevent.sleep(0.05)
            gevent.sleep(0.05)
            user.kill()
        finally:
            t.close()
    assert isinstance(user.value, GreenletExit)  # the stop went on
    assert holder and "engine went away" in (holder[0].error or "") and len(holder[0].content_times) == 4


def test_a_geventhttpclient_without_an_internal_is_named_in_one_line(monkeypatch):
    from geventhttpclient.connectionpool import ConnectionPool

    monkeypatch.delattr(ConnectionPool, "_is_socket_alive")
    with pytest.raises(llm.HttpClientError) as caught:
        llm.check_geventhttpclient()
    assert "ConnectionPool._is_socket_alive" in str(caught.value) and "\n" not in str(caught.value)


def test_the_cli_stops_at_start_up_with_one_line_when_an_internal_is_gone(tmp_path):
    script = (
        "import sys\n"
        "from loadgen import cli\n"
        "from geventhttpclient.response import HTTPResponse\n"
        "HTTPResponse.__init__ = lambda self, *a, **k: None  # a version whose response keeps no _body_buffer\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    proc = run_python(
        "-c", script, "burst", "--engine", "vllm=http://127.0.0.1:9", "--results", str(tmp_path), timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "HTTPResponse._body_buffer" in proc.stderr
    assert "Traceback" not in proc.stderr and not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ConnectionRefusedError(111, "refused"), llm.ErrorKind.CONNECTION_REFUSED),
        (TimeoutError("timed out"), llm.ErrorKind.TIMEOUT),
        (ConnectionResetError(104, "reset"), llm.ErrorKind.STREAM_CUT),
        (BrokenPipeError(32, "pipe"), llm.ErrorKind.STREAM_CUT),
        (EOFError("closed"), llm.ErrorKind.STREAM_CUT),
        # The words alone decide nothing: a message that says "refused" or "timed out" is not that kind.
        (ValueError("connection refused, timed out, closed, reset"), llm.ErrorKind.OTHER),
    ],
)
def test_failures_are_classified_by_exception_type_not_by_message(exc, kind):
    assert llm.classify(exc) is kind


def test_a_wrapped_exception_is_classified_by_what_it_was_raised_from():
    class LibraryError(Exception):
        pass

    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as inner:
            raise LibraryError("HTTPConnectionPool(host='x'): Max retries exceeded") from inner
    except LibraryError as outer:
        assert llm.classify(outer) is llm.ErrorKind.CONNECTION_REFUSED


def test_the_outcome_label_is_the_records_kind_never_its_text():
    from prometheus_client import CollectorRegistry

    from loadgen.client_metrics import ClientMetrics
    from servescope.contracts import series
    from servescope.contracts.runfolder import RequestRecord
    from servescope.judgements import slo

    metrics = ClientMetrics(CollectorRegistry(), spec=slo.resolve())
    base = dict(engine="vllm", instance="vllm", scenario="burst", phase="burst-1", api="openai", model="m")
    base |= dict(prompt_set="s", prompt_set_sha256="h", prompt_id="p", max_tokens=4, started_at=0.0, status=0)
    metrics.observe(RequestRecord(**base, ok=True))
    metrics.observe(RequestRecord(**base, ok=False, error="timeout after 3 content chunks", error_kind="timeout"))
    metrics.observe(RequestRecord(**base, ok=False, error="anything at all: refused, timeout"))
    value = metrics.registry.get_sample_value
    name = series.CLIENT_REQUESTS
    labels = {"engine": "vllm", "scenario": "burst"}
    assert value(name, {**labels, "outcome": "ok"}) == 1
    assert value(name, {**labels, "outcome": "timeout"}) == 1
    assert value(name, {**labels, "outcome": "other_error"}) == 1


class _Sock:
    """A socket whose reads carry kernel receive stamps (SO_TIMESTAMPNS ancillary data), as recvmsg returns them."""

    def __init__(self, reads: list[tuple[bytes, float]]):
        self.reads = reads  # (bytes, receive time on the perf_counter clock)

    def recvmsg(self, size, ancsize):
        data, at = self.reads.pop(0)
        wall = at + (time.time() - time.perf_counter())
        sec = int(wall)
        return data, [(socket.SOL_SOCKET, SO_TIMESTAMPNS, TIMESPEC.pack(sec, int((wall - sec) * 1e9)))], 0, None


class _Response(HTTPResponse):
    """geventhttpclient's response as the client reads it: its headers parsed with the body bytes that came with them,
    the rest from the socket (`length`: the whole body's)."""

    def __init__(self, with_headers: bytes, sock: _Sock, length: int):
        super().__init__()
        self.feed(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % length + with_headers)
        self._sock = sock

    def release(self) -> None:
        pass


@pytest.mark.skipif(llm.SO_TIMESTAMPNS is None or llm.CMSG_SIZE == 0, reason="no kernel receive stamps on this OS")
def test_stamps_never_go_back_when_the_next_reads_kernel_stamp_precedes_the_parsed_headers():
    # A starved client: the headers (with the first event) are parsed at 'now', while the kernel had already
    # received the next two events 30 ms and 20 ms earlier. Before the fix their gaps came out negative and the
    # run-folder reader refused the whole record ("itl_s: a value out of range").
    now = time.perf_counter()
    sock = _Sock([(b"data: 2\n\n", now - 0.030), (b"data: 3\n\n", now - 0.020)])
    response = _Response(b"data: 1\n\n", sock, length=27)
    blocks = list(llm._GeventResponse(response, kernel_stamps=True).blocks(time.perf_counter))
    stamps = [t for t, _ in blocks]
    assert [b for _, b in blocks] == [b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n"]
    assert stamps == sorted(stamps), stamps


BUSY_S = 0.3  # the busy spell the kernel-stamp test puts the client in


@pytest.mark.skipif(llm.SO_TIMESTAMPNS is None or llm.CMSG_SIZE == 0, reason="no kernel receive stamps on this OS")
def test_content_that_came_with_the_headers_to_a_busy_client_keeps_the_kernels_stamp():
    # A client busy elsewhere (another greenlet holding the process BUSY_S) reads the headers late, and with them the
    # first content chunks the server had sent meanwhile: stamped when parsed, their TTFT had the busy spell in it.
    # No bound on the machine's speed: the stamp is held against the spell's own end, read on the client's clock. A
    # chunk the whole answer of which was written before the spell ended cannot be read before it ended; stamped
    # when read or parsed, it comes after that end, however fast or slow the host. (A fixed TTFT < 0.05 s, a bound
    # on how soon a busy host answers rather than on where the stamp comes from, failed at 0.150 s on a 2-core one.)
    import gevent
    from gevent import monkey

    real_sleep = monkey.get_original("time", "sleep")  # blocks the hub, and the process, even where Locust patched it
    with SyntheticServer(ttft=0.0, itl=0.0, tokens=3) as s:
        # The try this test is about: the client went into its spell before the server had even read the request
        # (so it read none of the answer before the spell), and the server had written all of it (the stream is
        # filed after its last write) before the spell ended. A host too busy to answer within the spell makes no
        # such try: try again.
        def busy(spell: dict, filed: int) -> None:
            spell["began"] = time.monotonic()  # the server's stamps are on time.monotonic
            real_sleep(BUSY_S)
            # Asked before the end is stamped: the server runs in a thread of this process, and between the two it
            # may take the GIL and write its whole answer after the end (seen in CI: filed, yet stamped 0.1 ms late).
            spell["answered"] = len(s.stats.streams) > filed
            spell["ended"] = time.perf_counter()  # the client's stamps are on time.perf_counter

        for _ in range(10):
            spell: dict = {}
            transport = llm.make_transport("geventhttpclient", s.url, timeout=5.0)
            try:
                transport.connect()
                greenlet = gevent.spawn(busy, spell, len(s.stats.streams))
                m = llm.stream_chat(
                    transport, "/v1/chat/completions", "openai", llm.chat_payload("openai", "m", "hi", 3, 0.0, True)
                )
                greenlet.join()
            finally:
                transport.close()
            if spell["answered"] and spell["began"] < s.stats.streams[-1]["t_request_line"]:
                break
        else:
            pytest.fail(f"in 10 tries the server never wrote its whole answer within the client's {BUSY_S} s spell")
    assert m.ok, m.error
    assert m.content_times and m.t_end > spell["ended"]  # the client was late: it read after the busy spell
    # Yet the first content chunk is stamped when it reached the socket: before the spell ended (and after the send).
    assert m.t_send < m.content_times[0] < spell["ended"], (m.content_times[0] - m.t_send, spell["ended"] - m.t_send)


@pytest.mark.skipif(llm.SO_TIMESTAMPNS is None or llm.CMSG_SIZE == 0, reason="no kernel receive stamps on this OS")
def test_the_send_is_stamped_as_the_request_goes_to_the_socket_not_before_it_is_built(monkeypatch):
    # Whatever the HTTP client does before the bytes go out (building the request, checking the pooled socket; here a
    # stall of stall_s) is not the server's time: it must not be in the TTFT.
    from geventhttpclient import HTTPClient

    stall_s = 0.2
    real = HTTPClient._build_request

    def slow_build(self, *args, **kwargs):
        time.sleep(stall_s)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(HTTPClient, "_build_request", slow_build)
    with SyntheticServer(ttft=0.02, itl=0.0, tokens=2) as s:
        before = time.perf_counter()
        m = chat(s.url, "geventhttpclient", max_tokens=2)
        # The server files the stream just after its last write: the client may be first.
        deadline = time.monotonic() + 10
        while not s.stats.streams and time.monotonic() < deadline:
            time.sleep(0.01)
        (stream,) = s.stats.streams
    assert m.ok, m.error
    assert m.t_send - before >= stall_s  # stamped after the stall
    # The TTFT less the server's own time to its first write (from the kernel's stamp of the request's arrival):
    # what is left is the client's own error. A send stamped before the build leaves the whole stall in it; a busy
    # host that delays the server's write moves both alike. The bounds are fractions of the stall the test injects,
    # not of the machine's speed (a fixed TTFT < 0.05 s left a busy host 30 ms for the server's own lateness).
    served = stream["writes"][0] - stream["t_arrival"]
    assert 0.02 <= m.ttft_s and m.ttft_s - served < stall_s / 2, (m.ttft_s, served)
    # The two stamps of the send (epoch, perf_counter) together: the epoch one taken before the build would be
    # a stall apart.
    assert abs((m.started_at - time.time()) - (m.t_send - time.perf_counter())) < stall_s / 2
