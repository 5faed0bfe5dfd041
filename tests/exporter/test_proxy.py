"""The Ollama proxy against the Ollama simulator over real HTTP: byte-for-byte forwarding, streaming, observation, cancellation."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import requests

from exporter.config import Config, Instance
from exporter.proxy import OllamaTail
from exporter.server import build, run
from servescope.contracts import series
from tests.conftest import free_port, wait_until
from tests.doubles.ollama_simulator import OllamaSimulator
from tests.doubles.recorded_engine import fixture

MODEL = "smollm2-135m:latest"
LABELS = {"engine": "ollama", "instance": "ollama"}


class ExporterThread:
    """The real exporter (collectors, /metrics, proxy) running in a background thread's event loop."""

    loop_factory = staticmethod(asyncio.new_event_loop)

    def __init__(self, upstream_url: str = "", num_parallel: int = 1, *, instances: tuple[Instance, ...] = ()):
        """An Ollama instance with its proxy in front of `upstream_url`, or the `instances` given."""
        self.proxy_port = free_port()
        self.port = free_port()
        config = Config(
            port=self.port,
            instances=instances
            or (
                Instance(
                    kind="ollama",
                    name="ollama",
                    url=upstream_url,
                    proxy_port=self.proxy_port,
                    num_parallel=num_parallel,
                ),
            ),
        )
        self.exporter = build(config)
        self.proxy_url = f"http://127.0.0.1:{self.proxy_port}"
        self.metrics_url = f"http://127.0.0.1:{self.port}/metrics"

    def __enter__(self) -> ExporterThread:
        ready = threading.Event()
        self.loop = self.loop_factory()
        self.stop = asyncio.Event()

        def serve():
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(run(self.exporter, on_ready=ready.set, stop=self.stop))

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        assert ready.wait(10), "exporter did not start"
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(10)
        self.loop.close()

    def value(self, name: str, **labels) -> float | None:
        return self.exporter.registry.get_sample_value(name, {**LABELS, **labels})


@pytest.fixture
def simulator():
    with OllamaSimulator(token_delay=0.005, load_delay=0.02) as sim:
        yield sim


def chat_body(num_predict: int = 5, **extra) -> dict:
    return {
        "model": "smollm2-135m",
        "messages": [{"role": "user", "content": "Explain paged attention"}],
        "options": {"num_predict": num_predict},
        **extra,
    }


def test_forwards_method_path_query_body_and_headers_byte_for_byte(simulator):
    raw = b'{"model":"smollm2-135m",  "messages":[{"role":"user","content":"h\\u00e9llo"}],\n "stream":false}'
    with ExporterThread(simulator.url) as exporter:
        resp = requests.post(
            f"{exporter.proxy_url}/api/chat?trace=1&x=%2F",
            data=raw,
            headers={"Content-Type": "application/json", "X-Request-Id": "abc-123", "Connection": "keep-alive"},
            timeout=10,
        )
    assert resp.status_code == 200 and resp.json()["done"] is True
    seen = simulator.last_request
    assert seen["method"] == "POST" and seen["path"] == "/api/chat"
    assert seen["query_string"] == "trace=1&x=%2F"
    assert seen["body"] == raw
    assert seen["headers"]["X-Request-Id"] == "abc-123"
    assert seen["headers"]["Content-Type"] == "application/json"
    assert seen["headers"]["Host"] == simulator.url.removeprefix("http://")


def test_other_paths_are_forwarded_unobserved(simulator):
    with ExporterThread(simulator.url) as exporter:
        direct = requests.get(f"{simulator.url}/api/tags", timeout=5)
        proxied = requests.get(f"{exporter.proxy_url}/api/tags", timeout=5)
        assert proxied.status_code == 200 and proxied.content == direct.content
        assert proxied.headers["Content-Type"] == direct.headers["Content-Type"]
        assert exporter.value(series.PROXY_REQUESTS, model="", outcome="ok") is None


def test_absolute_uri_requests_go_only_to_the_configured_upstream(simulator):
    decoy = socket.socket()
    decoy.bind(("127.0.0.1", 0))
    decoy.listen()
    decoy.settimeout(0.5)
    decoy_port = decoy.getsockname()[1]
    with (
        ExporterThread(simulator.url) as exporter,
        socket.create_connection(("127.0.0.1", exporter.proxy_port), 5) as conn,
    ):
        conn.sendall(
            f"GET http://127.0.0.1:{decoy_port}/api/version HTTP/1.1\r\nHost: 127.0.0.1:{decoy_port}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        conn.settimeout(5)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200")
    assert b'"version":"0.12.6"' in answer  # the simulator answered
    with pytest.raises(TimeoutError):
        decoy.accept()  # nothing was sent to the host named in the request
    decoy.close()
    assert simulator.last_request["path"] == "/api/version"


def test_connect_is_refused(simulator):
    with (
        ExporterThread(simulator.url) as exporter,
        socket.create_connection(("127.0.0.1", exporter.proxy_port), 5) as conn,
    ):
        conn.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        conn.settimeout(5)
        assert conn.recv(65536).startswith(b"HTTP/1.1 405 ")  # refused, never tunnelled


def test_streams_chunks_as_they_arrive():
    with OllamaSimulator(token_delay=0.15, load_delay=0.0) as sim, ExporterThread(sim.url) as exporter:
        arrivals = []
        with requests.post(
            f"{exporter.proxy_url}/api/chat", json=chat_body(num_predict=6), stream=True, timeout=10
        ) as resp:
            for line in resp.iter_lines():
                if line:
                    arrivals.append(time.monotonic())
    assert len(arrivals) == 7
    # Buffering would deliver every line at the end; streamed, they are spread over the ~0.9 s generation.
    assert arrivals[-1] - arrivals[0] > 0.5


def test_native_final_object_is_observed(simulator):
    with ExporterThread(simulator.url) as exporter:
        lines = requests.post(
            f"{exporter.proxy_url}/api/chat", json=chat_body(num_predict=5), timeout=10
        ).text.splitlines()
        final = json.loads(lines[-1])
        requests.post(
            f"{exporter.proxy_url}/api/generate", json={"model": MODEL, "prompt": "hi", "stream": False}, timeout=10
        )
        assert final["done"] is True and final["eval_count"] == 5
        value = exporter.value
        # Outcomes are counted as the proxy's handler returns, which can be just after the client has the body.
        assert wait_until(lambda: value(series.PROXY_REQUESTS, model=MODEL, outcome="ok") == 2.0)
        generated = final["eval_count"] + simulator.tokens
        assert value(series.GENERATED_TOKENS, model=MODEL) == generated
        assert value(series.PROMPT_TOKENS, model=MODEL) == final["prompt_eval_count"] + 5
        assert value(f"{series.PROXY_GEN_TOKENS_PER_SECOND}_count", model=MODEL) == 2.0
        assert (
            value(f"{series.PROXY_GEN_TOKENS_PER_SECOND}_sum", model=MODEL)
            >= final["eval_count"] / final["eval_duration"] * 1e9
        )
        assert value(f"{series.PROXY_LOAD_SECONDS}_sum", model=MODEL) >= final["load_duration"] / 1e9  # the cold load
        assert value(f"{series.PROXY_PROMPT_EVAL_SECONDS}_count", model=MODEL) == 2.0
        assert value(f"{series.PROXY_FIRST_CHUNK_SECONDS}_count", model=MODEL) == 2.0
        # Ollama's own durations: the time it held each request outside load, prompt eval and generation
        assert value(f"{series.PROXY_QUEUE_SECONDS}_count", model=MODEL) == 2.0
        queue_ns = final["total_duration"] - final["load_duration"] - final["prompt_eval_duration"]
        assert value(f"{series.PROXY_QUEUE_SECONDS}_sum", model=MODEL) >= (queue_ns - final["eval_duration"]) / 1e9
        assert value(series.REQUESTS_RUNNING, model=MODEL, source="proxy") == 0.0


def test_openai_usage_chunk_is_observed(simulator):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "one two three"}],
        "max_tokens": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with ExporterThread(simulator.url) as exporter:
        text = requests.post(f"{exporter.proxy_url}/v1/chat/completions", json=body, timeout=10).text
        usage_events = [
            json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {") and '"usage"' in line
        ]
        usage = usage_events[-1]["usage"]
        assert text.rstrip().endswith("data: [DONE]")
        assert usage["completion_tokens"] == 7
        assert wait_until(lambda: exporter.value(series.GENERATED_TOKENS, model=MODEL) == 7)
        assert exporter.value(series.PROMPT_TOKENS, model=MODEL) == usage["prompt_tokens"]
        requests.post(f"{exporter.proxy_url}/v1/chat/completions", json={**body, "stream": False}, timeout=10)
        assert wait_until(lambda: exporter.value(series.GENERATED_TOKENS, model=MODEL) == 14)


@pytest.mark.parametrize(("ollama_runs", "knob_says"), [(1, 4), (2, 1)])
def test_running_and_waiting_are_what_the_proxy_observed_whatever_the_knob_says(ollama_runs, knob_says):
    """BUG at 7b2f789: running = min(in flight, OLLAMA_NUM_PARALLEL) and waiting the rest, so an
    exporter told 4 where Ollama runs 1 showed 3 running, 0 waiting: the knob's split, not what happened."""
    with (
        OllamaSimulator(num_parallel=ollama_runs, token_delay=0.02, load_delay=0.0) as sim,
        ExporterThread(sim.url, num_parallel=knob_says) as exporter,
    ):
        threads = [
            threading.Thread(
                target=requests.post,
                args=(f"{exporter.proxy_url}/api/chat",),
                kwargs={"json": chat_body(num_predict=50), "timeout": 30},
            )
            for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        running = lambda: exporter.value(series.REQUESTS_RUNNING, model=MODEL, source="proxy")  # noqa: E731
        waiting = lambda: exporter.value(series.REQUESTS_WAITING, model=MODEL, source="proxy")  # noqa: E731
        # Ollama streams `ollama_runs` answers; the others have not had a byte of theirs (queued inside it).
        assert wait_until(lambda: (running(), waiting()) == (ollama_runs, 3 - ollama_runs), timeout=20)
        assert exporter.value(series.PROXY_IN_FLIGHT) == 3.0
        for thread in threads:
            thread.join(30)
        assert sim.stats["max_running"] == ollama_runs
        assert wait_until(lambda: exporter.value(series.PROXY_REQUESTS, model=MODEL, outcome="ok") == 3.0)
        assert (running(), waiting()) == (0.0, 0.0)
        # The requests that waited for a slot say so in Ollama's own durations, seen by the proxy.
        assert exporter.value(f"{series.PROXY_QUEUE_SECONDS}_sum", model=MODEL) > 0.5


def test_nothing_relayed_is_not_observed_and_every_answer_says_it_came_through_the_proxy(simulator):
    """BUG at 7b2f789: with the load on Ollama's own port, the gauges read 0 for every loaded
    model as if observed; and nothing told a client it was talking to the proxy rather than to Ollama."""
    with ExporterThread(simulator.url) as exporter:
        assert requests.post(f"{simulator.url}/api/chat", json=chat_body(), timeout=10).status_code == 200  # direct
        page = requests.get(exporter.metrics_url, timeout=10).text
        assert exporter.value(series.ENGINE_UP) == 1.0 and MODEL in page  # Ollama has the model loaded
        assert f"{series.REQUESTS_RUNNING}{{" not in page and f"{series.REQUESTS_WAITING}{{" not in page
        direct = requests.get(f"{simulator.url}/api/version", timeout=5)
        relayed = requests.get(f"{exporter.proxy_url}/api/version", timeout=5)
        assert "Via" not in direct.headers and relayed.headers["Via"] == "1.1 servescope-ollama-proxy"
        assert relayed.json() == direct.json()
        streamed = requests.post(f"{exporter.proxy_url}/api/chat", json=chat_body(), timeout=10)
        assert streamed.headers["Via"] == "1.1 servescope-ollama-proxy"
        assert wait_until(lambda: exporter.value(series.PROXY_REQUESTS, model=MODEL, outcome="ok") == 1.0)
        assert exporter.value(series.REQUESTS_WAITING, model=MODEL, source="proxy") == 0.0  # observed now


def test_client_disconnect_cancels_the_upstream_request():
    with OllamaSimulator(token_delay=0.05, load_delay=0.0) as sim, ExporterThread(sim.url) as exporter:
        assert exporter.value(series.ENGINE_UP) == 1.0  # a scrape: the proxy knows Ollama's models
        # A raw socket, so the hang-up is ours to make (no HTTP library's internals reached into).
        body = json.dumps(chat_body(num_predict=400)).encode()
        head = (
            f"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1:{exporter.proxy_port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", exporter.proxy_port), timeout=10) as sock:
            sock.sendall(head.encode() + body)
            received = b""
            while b'"message"' not in received:  # the first streamed line: the request is running upstream
                chunk = sock.recv(4096)
                assert chunk, received
                received += chunk
            sock.shutdown(socket.SHUT_RDWR)  # hang up mid-stream, like a killed client
        # One wait for both: the simulator counts the cancel before it releases the slot.
        assert wait_until(lambda: sim.stats["cancelled"] == 1 and sim.stats["running"] == 0), sim.stats
        assert sim.stats["completed"] == 0
        assert wait_until(
            lambda: exporter.value(series.PROXY_REQUESTS, model=MODEL, outcome="client_disconnect") == 1.0
        )
        assert exporter.value(series.PROXY_IN_FLIGHT) == 0.0


def test_queue_full_is_counted_as_rejected():
    with (
        OllamaSimulator(num_parallel=1, max_queue=1, token_delay=0.05, load_delay=0.0) as sim,
        ExporterThread(sim.url) as exporter,
    ):
        assert exporter.value(series.ENGINE_UP) == 1.0  # a scrape: the proxy knows Ollama's models
        statuses: list[int] = []
        # The first runs 2 s (40 tokens, 0.05 s each): the third must reach Ollama while it still runs and the second
        # waits, where 0.4 s left a busy host little time for it.
        threads = [
            threading.Thread(
                target=lambda tokens=tokens: statuses.append(
                    requests.post(
                        f"{exporter.proxy_url}/api/chat", json=chat_body(num_predict=tokens), timeout=20
                    ).status_code
                )
            )
            for tokens in (40, 8, 8)
        ]
        for sent, thread in enumerate(threads, start=1):
            thread.start()
            assert wait_until(lambda sent=sent: sim.stats["requests"] == sent)  # each reaches Ollama in turn
        for thread in threads:
            thread.join(20)
        assert sorted(statuses) == [200, 200, 503]
        assert wait_until(lambda: exporter.value(series.PROXY_REQUESTS, model=MODEL, outcome="ok") == 2.0)
        assert exporter.value(series.PROXY_REQUESTS, model=MODEL, outcome="rejected") == 1.0


def test_unknown_model_is_an_error_outcome_under_other(simulator):
    """BUG at 6364460: names that only ever fail got a label each, around the 64-name cap."""
    with ExporterThread(simulator.url) as exporter:
        assert exporter.value(series.ENGINE_UP) == 1.0  # a scrape: the proxy knows Ollama's models
        resp = requests.post(f"{exporter.proxy_url}/api/chat", json={"model": "nope", "messages": []}, timeout=10)
        assert resp.status_code == 404 and "not found" in resp.json()["error"]
        # The proxy counts the outcome once its handler returns, which can be just after the client has the body.
        assert wait_until(lambda: exporter.value(series.PROXY_REQUESTS, model="other", outcome="error") == 1.0)
        assert "nope" not in requests.get(exporter.metrics_url, timeout=10).text  # no series of its own, ever


def test_upstream_down_is_502_and_counted():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with ExporterThread(gone) as exporter:
        resp = requests.post(f"{exporter.proxy_url}/api/chat", json=chat_body(), timeout=10)
        assert resp.status_code == 502 and "unreachable" in resp.json()["error"]
        assert resp.headers["Via"] == "1.1 servescope-ollama-proxy"  # the proxy's own answer says who gave it
        # Ollama never vouched for the model (it is down): the outcome counts under "other"
        assert wait_until(
            lambda: exporter.value(series.PROXY_REQUESTS, model="other", outcome="upstream_unreachable") == 1.0
        )
        assert exporter.value(series.ENGINE_UP) == 0.0


def test_upstream_dying_mid_stream_is_counted_and_the_client_sees_the_cut(simulator):
    simulator.break_after_tokens = 2
    with ExporterThread(simulator.url) as exporter:
        assert exporter.value(series.ENGINE_UP) == 1.0  # a scrape: the proxy knows Ollama's models
        lines = []
        with pytest.raises(requests.exceptions.ChunkedEncodingError):
            with requests.post(
                f"{exporter.proxy_url}/api/chat", json=chat_body(num_predict=20), stream=True, timeout=10
            ) as resp:
                for line in resp.iter_lines():
                    lines.append(line)
        assert len(lines) == 2
        assert wait_until(lambda: exporter.value(series.PROXY_REQUESTS, model=MODEL, outcome="upstream_broken") == 1.0)
        # the exporter and proxy carry on
        assert requests.post(f"{exporter.proxy_url}/api/chat", json=chat_body(), timeout=10).status_code == 200


@pytest.mark.parametrize("chunk_size", [1, 7, 4096])
def test_response_tail_reads_recorded_streams_in_any_chunking(chunk_size):
    native = fixture("ollama-0.12-chat-stream.ndjson").encode()
    tail = OllamaTail()
    for start in range(0, len(native), chunk_size):
        tail.feed(native[start : start + chunk_size])
    final = tail.final_ndjson()
    assert final["done"] is True and final["eval_count"] == 3 and final["load_duration"] == 301234567
    # a real OpenAI-style stream (vLLM 0.32.0 capture): the usage chunk sits before [DONE]
    sse = fixture("vllm-0.32.0-cpu-chat-stream.sse").encode()
    tail = OllamaTail()
    for start in range(0, len(sse), chunk_size):
        tail.feed(sse[start : start + chunk_size])
    assert tail.openai_usage() == {"prompt_tokens": 33, "total_tokens": 41, "completion_tokens": 8}
