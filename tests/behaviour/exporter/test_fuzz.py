"""Fuzz targets at the exporter's two boundaries, over real sockets: what engines answer, and what clients send the proxy.

Fixed seed (derandomize) and a bounded number of examples: the same inputs every run, a few
seconds each. The invariants are what the exporter promises whatever engines and clients send:
nothing raises, a fetch ends by its deadline, /metrics stays valid and bounded, the proxy reaches
only its upstream and lets go of every connection and buffer.
"""

from __future__ import annotations

import json
import math
import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.bounds import MAX_LABEL_BYTES, MAX_MODELS
from exporter.llamacpp import LlamacppCollector
from exporter.observations import ProxyObservations
from exporter.ollama import OllamaCollector
from exporter.server import Collected
from exporter.upstream import Upstream, UpstreamError
from exporter.vllm import VllmCollector
from servescope.contracts import series
from tests.conftest import wait_until
from tests.doubles.recorded_engine import RecordedEngine, fixture
from tests.exporter.test_proxy import ExporterThread
from tests.exporter.test_proxy_http import RawUpstream, read_response

pytestmark = pytest.mark.timeout(300)

FUZZ = settings(
    derandomize=True,  # a fixed seed: the same examples every run
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# --- what an engine may answer -------------------------------------------------------------------------
tokens = st.sampled_from(["200", "404", "501", "401", "500", "100", "204", "abc", "-1", "999999", ""])
header_names = st.sampled_from(
    ["Content-Length", "Transfer-Encoding", "Connection", "Content-Type", "X-A", "Content-Length ", "\x00X"]
)
header_values = st.sampled_from(
    ["0", "2", "62947", "-5", "two", "chunked", "gzip, chunked", "close", "keep-alive", "a\x00b", "", "1" * 30]
) | st.text(max_size=12)


@st.composite
def http_responses(draw) -> bytes:
    status = draw(tokens)
    head = f"HTTP/{draw(st.sampled_from(['1.1', '1.0', '2', 'x']))} {status} {draw(st.text(max_size=6))}\r\n"
    for name, value in draw(st.lists(st.tuples(header_names, header_values), max_size=5)):
        head += f"{name}: {value}\r\n"
    body = draw(st.binary(max_size=300) | st.just(b"vllm:num_requests_running 1\n" * 50))
    raw = head.encode("utf-8", "surrogatepass") + b"\r\n" + body
    cut = draw(st.integers(0, len(raw)))
    return raw[: cut if draw(st.booleans()) else len(raw)]


@pytest.fixture(scope="module")
def scripted():
    answer = {"raw": b""}

    def script(upstream, conn, request, index):
        conn.sendall(answer["raw"])
        return False  # then close: a body framed by the end of the connection ends here

    with RawUpstream(script) as engine:
        yield engine, answer


@FUZZ
@given(raw=http_responses())
def test_fuzz_engine_http_answers(scripted, raw):
    """Whatever bytes an engine answers, a fetch returns a body or raises UpstreamError, by its deadline."""
    engine, answer = scripted
    answer["raw"] = raw
    upstream = Upstream(engine.url)
    started = time.monotonic()
    try:
        body = upstream.get_bytes("/metrics", started + 0.5, missing_ok=True)
    except UpstreamError as exc:
        assert "\n" not in str(exc)  # one line for the log
        body = None
    finally:
        upstream.close()
    assert time.monotonic() - started < 1.0
    assert body is None or isinstance(body, bytes) or repr(body) == "MISSING"


# --- what an engine's pages may say --------------------------------------------------------------------
names = st.sampled_from(
    [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        "vllm:cache_config_info",
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:tokens_predicted_total",
        "llamacpp:prompt_tokens_total",
    ]
)
values = st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "0", "0.5", "7.5", "1e308", "12"]) | st.floats().map(repr)
label_values = st.text(max_size=20) | st.sampled_from(["None", "16", "-16", "1456", "x" * 300])


@st.composite
def exposition_pages(draw) -> str:
    lines = []
    for name in draw(st.lists(names, min_size=1, max_size=12)):
        labels = draw(
            st.dictionaries(st.sampled_from(["model_name", "engine", "block_size", "num_gpu_blocks"]), label_values)
        )
        escaped = ",".join(
            f'{key}="{value.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34)).replace(chr(10), "n")}"'
            for key, value in labels.items()
        )
        lines.append(f"{name}{{{escaped}}} {draw(values)}")
    return "\n".join(lines) + "\n"


json_leaves = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=30)
model_entries = st.fixed_dictionaries(
    {},
    optional={
        "name": st.text(max_size=40) | st.just("x" * 1000) | st.sampled_from(["smollm2-135m:latest", "qwen"]),
        "size": json_leaves,
        "size_vram": json_leaves,
        "context_length": json_leaves,
        "expires_at": json_leaves | st.sampled_from(["2025-10-01T16:35:00.123456789Z", "next tuesday"]),
        "details": st.dictionaries(st.sampled_from(["family", "parameter_size"]), json_leaves, max_size=2),
    },
)
slots = (
    st.lists(
        st.fixed_dictionaries({}, optional={"n_ctx": json_leaves, "is_processing": json_leaves, "n_past": json_leaves}),
        max_size=6,
    )
    | json_leaves
)


def scrape_once(collector) -> list:
    started = time.monotonic()
    families = list(collector.collect())  # must not raise
    assert time.monotonic() - started < collector.timeout + 0.5
    return families


def check_exposition(families: list) -> None:
    """The page Prometheus would read: parseable, bounded labels, values that can be true."""
    registry = CollectorRegistry()
    registry.register(Collected(families))
    text = generate_latest(registry).decode()
    models = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for key, value in sample.labels.items():
                assert len(value.encode()) <= MAX_LABEL_BYTES, (key, value[:40])
                if key == "model":
                    models.add(value)
            assert math.isfinite(sample.value), sample
            if sample.name == series.KV_CACHE_USAGE:
                assert 0.0 <= sample.value <= 1.0, sample
            if sample.name in (series.REQUESTS_RUNNING, series.REQUESTS_WAITING, series.GENERATED_TOKENS):
                assert sample.value >= 0.0, sample
    assert len(models) <= MAX_MODELS + 1


@pytest.fixture(scope="module")
def engine():
    with RecordedEngine() as served:
        yield served


@FUZZ
@given(page=exposition_pages(), models=st.lists(st.text(max_size=20), max_size=3))
def test_fuzz_vllm_pages(engine, page, models):
    engine.set_text("/metrics", page)
    engine.set_json("/v1/models", {"object": "list", "data": [{"id": m, "max_model_len": 1024} for m in models]})
    check_exposition(scrape_once(VllmCollector("vllm", Upstream(engine.url), timeout=1.0)))


@FUZZ
@given(page=exposition_pages(), slot_list=slots, metrics_on=st.booleans())
def test_fuzz_llamacpp_pages(engine, page, slot_list, metrics_on):
    engine.set_text("/metrics", page, status=200 if metrics_on else 501)
    engine.set_json("/slots", slot_list)
    engine.pages["/props"] = (200, fixture("llamacpp-11434.0.0-props.json"), "application/json")
    check_exposition(scrape_once(LlamacppCollector("llamacpp", Upstream(engine.url), timeout=1.0)))


@FUZZ
@given(loaded=st.lists(model_entries, max_size=8), installed=st.lists(model_entries, max_size=8), many=st.booleans())
def test_fuzz_ollama_lists(engine, loaded, installed, many):
    engine.pages["/api/version"] = (200, fixture("ollama-0.12-version.json"), "application/json")
    if many:  # a list far past the cap
        loaded = loaded + [{"name": f"m{i}", "size": i} for i in range(200)]
    engine.set_json("/api/ps", {"models": loaded})
    engine.set_json("/api/tags", {"models": installed})
    collector = OllamaCollector("ollama", Upstream(engine.url), observations=ProxyObservations(), timeout=1.0)
    families = scrape_once(collector)
    up = next(f for f in families if f.name == series.ENGINE_UP).samples[0].value
    assert up == 1.0  # entries cost themselves, never the engine
    check_exposition(families)


# --- what a client may send the proxy ------------------------------------------------------------------
methods = st.sampled_from(["GET", "POST", "HEAD", "PUT", "DELETE", "CONNECT", "OPTIONS", "G\x00T", "BREW"])
targets = st.sampled_from(
    ["/api/generate", "/api/chat", "/v1/chat/completions", "/api/tags", "*", "http://evil.test:1/api/tags", "/%00"]
) | st.text(alphabet="/abc?=&%:@", max_size=20)
request_headers = st.lists(
    st.tuples(
        st.sampled_from(
            ["Content-Length", "Transfer-Encoding", "Expect", "Connection", "Upgrade", "Host", "X-A", "Te", "Bad Name"]
        ),
        st.sampled_from(["5", "-1", "abc", "chunked", "100-continue", "close", "keep-alive, X-A", "websocket", "x"]),
    ),
    max_size=5,
)


@st.composite
def client_requests(draw) -> tuple[bytes, bool]:
    """(bytes a client sends, whether they end mid-request)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200)), True  # not HTTP at all
    model = draw(st.text(max_size=30) | st.just("y" * 500) | st.just("m"))
    body = draw(st.just(json.dumps({"model": model, "prompt": "hi"}).encode()) | st.binary(max_size=100))
    head = f"{draw(methods)} {draw(targets)} HTTP/{draw(st.sampled_from(['1.1', '1.0', '9']))}\r\nHost: x\r\n"
    headers = draw(request_headers)
    for name, value in headers:
        head += f"{name}: {value}\r\n"
    if not any(name.lower() in ("content-length", "transfer-encoding") for name, _ in headers):
        head += f"Content-Length: {len(body)}\r\n"
    raw = head.encode("utf-8", "surrogatepass") + b"\r\n" + body
    if draw(st.integers(0, 4)) == 0:
        return raw[: draw(st.integers(0, len(raw)))], True
    return raw * draw(st.integers(1, 2)), False


@pytest.fixture(scope="module")
def proxied():
    with RawUpstream() as upstream, ExporterThread(upstream.url) as exporter:
        yield upstream, exporter


def exchange_raw(port: int, raw: bytes, truncated: bool) -> list[bytes]:
    """Send raw bytes on a fresh connection; the status lines of what comes back until the proxy is done."""
    statuses = []
    with socket.create_connection(("127.0.0.1", port), 5) as sock:
        sock.settimeout(1)
        try:
            sock.sendall(raw)
            if truncated:
                sock.shutdown(socket.SHUT_WR)  # the client gives up mid-request
        except OSError:
            return statuses
        reader = sock.makefile("rb")
        try:
            while True:
                statuses.append(read_response(reader).start)
        except (EOFError, OSError, ValueError):
            pass  # closed, reset, or a response to a request whose bytes made no sense
        finally:
            reader.close()
    return statuses


@FUZZ
@given(sent=client_requests())
def test_fuzz_proxy_requests(proxied, sent):
    """Whatever a client sends: answers are HTTP/1.1, only the upstream is reached, and every connection,
    request in flight and body buffer is let go."""
    upstream, exporter = proxied
    raw, truncated = sent
    for start in exchange_raw(exporter.proxy_port, raw, truncated):
        assert start.startswith(b"HTTP/1.1 ") and start[9:12].isdigit(), start
    proxy = exporter.exporter.proxies[0][1]
    assert wait_until(lambda: not proxy.connections and proxy.buffered == 0, 5), (proxy.connections, proxy.buffered)
    assert wait_until(lambda: proxy.observations.in_flight() == 0, 5)
    with upstream.lock:
        hosts = {request.header("Host") for request in upstream.requests}
    assert hosts <= {upstream.url.removeprefix("http://")}


def test_after_fuzzing_the_proxy_metrics_stay_bounded(proxied):
    """Runs after test_fuzz_proxy_requests in this module: whatever the examples sent, the page stays bounded."""
    _, exporter = proxied
    registry = exporter.exporter.registry
    check_exposition(list(registry.collect()))
