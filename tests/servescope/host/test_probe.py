"""servescope/host/probe.py: up only on a 200; any other status, or no server at all, is down and raises nothing."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from servescope.host import probe


class _Status(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # the path is the status to answer: /200, /503
        self.send_response(int(self.path.strip("/")))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Status)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_200_is_up_and_any_other_status_is_not(server):
    assert probe.is_up(f"{server}/200")
    assert not probe.is_up(f"{server}/503")
    assert not probe.is_up(f"{server}/404")


def test_no_server_is_down_without_raising():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the GET: nothing listens there
    assert not probe.is_up(f"http://127.0.0.1:{port}/", timeout=0.5)
