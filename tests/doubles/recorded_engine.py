"""Stands in for a running vLLM or llama-server: real HTTP replaying the pages recorded from them (tests/fixtures/).

The exporter's tests and bench/exporter_scrape.py use it where a test needs a page the real engine
cannot be made to serve on demand (a recorded burst, a 500, a garbled page, a slow answer, a
401 for an engine started with --api-key).
"""

from __future__ import annotations

import json
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.doubles.serving import ServedInThread
from tests.paths import FIXTURES


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


class RecordedEngine(ServedInThread):
    """Serves `pages[path] = (status, body, content_type)`; `delay[path]` seconds before answering.

    Pages can be changed while it runs; `hits[path]` counts requests (a test can prove that
    something did NOT touch the network). With `api_key` set, the paths in `guarded` answer 401
    without `Authorization: Bearer <api_key>`, as an engine started with --api-key does.
    """

    def __init__(self, pages: dict[str, tuple[int, str | bytes, str]] | None = None):
        self.pages: dict[str, tuple[int, str | bytes, str]] = dict(pages or {})
        self.delay: dict[str, float] = {}
        self.hits: dict[str, int] = {}
        self.api_key: str | None = None
        self.guarded: set[str] = set()
        self._connections: set = set()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms delayed-ACK stall

            def setup(self):
                super().setup()
                engine._connections.add(self.connection)

            def finish(self):
                engine._connections.discard(self.connection)
                super().finish()

            def do_GET(self):  # noqa: N802 -- http.server's naming
                path = self.path.split("?", 1)[0]
                engine.hits[path] = engine.hits.get(path, 0) + 1
                wait = engine.delay.get(path, 0.0)
                if wait:
                    time.sleep(wait)
                status, body, content_type = engine.pages.get(path, (404, "not found\n", "text/plain"))
                if path in engine.guarded and self.headers.get("Authorization") != f"Bearer {engine.api_key}":
                    status, body, content_type = 401, '{"error": "Unauthorized"}', "application/json"
                data = body.encode(errors="surrogatepass") if isinstance(body, str) else body
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the exporter gave up waiting: that is the point of a slow page

            def log_message(self, *_args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def set_text(self, path: str, text: str, status: int = 200) -> None:
        self.pages[path] = (status, text, "text/plain; version=0.0.4")

    def set_json(self, path: str, value, status: int = 200) -> None:
        self.pages[path] = (status, json.dumps(value), "application/json")

    def stop(self) -> None:
        """Stop like a dying process: the listener AND every kept-alive connection close."""
        super().stop()
        for connection in list(self._connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def vllm_engine(
    metrics_fixture: str = "vllm-0.9.1-cpu-metrics.txt", max_model_len: int | None = 1024
) -> RecordedEngine:
    """A vLLM stand-in: the recorded /metrics page plus /v1/models as vLLM answers it (with max_model_len)."""
    engine = RecordedEngine()
    engine.set_text("/metrics", fixture(metrics_fixture))
    model = {
        "id": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "object": "model",
        "created": 1759311000,
        "owned_by": "vllm",
        "root": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "parent": None,
    }
    if max_model_len is not None:
        model["max_model_len"] = max_model_len
    engine.set_json("/v1/models", {"object": "list", "data": [model]})
    engine.set_json("/version", {"version": "0.9.1"})
    return engine
