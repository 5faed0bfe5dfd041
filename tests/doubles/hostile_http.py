"""A service that answers each path as a test scripts it: whole bytes, a drip, a body that claims 10 GB (issue 42's attacks).

Raw sockets (tests/exporter/test_proxy_http.py's RawUpstream): what is sent is exactly what the test wrote, framing
errors and all. A path not scripted answers 404.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from tests.exporter.test_proxy_http import RawUpstream

TEN_GB = 10 * 1024**3


def reply(body: bytes | str | Any, status: int = 200, headers: dict[str, str] | None = None) -> bytes:
    """A whole response; a body that is not bytes or text is sent as JSON."""
    if not isinstance(body, bytes | str):
        body = json.dumps(body)
    data = body.encode() if isinstance(body, str) else body
    head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(data)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return head.encode() + b"\r\n" + data


def drip(head: bytes, every_s: float = 1.0, *, byte: bytes = b"x", for_s: float = 120.0):
    """A script: `head` at once, then one `byte` every `every_s` (a server dripping 1 byte/s), for `for_s` at most."""

    def script(server: RawUpstream, conn, request, index) -> bool:
        conn.sendall(head)
        ends = time.monotonic() + for_s
        while time.monotonic() < ends and not server._stop.is_set():
            conn.sendall(byte)
            time.sleep(every_s)
        return False

    return script


def huge(content_type: str = "application/json", *, announced: int = TEN_GB, chunk: bytes = b"[" * 65536):
    """A script: a 200 announcing `announced` bytes, then as many of `chunk` as the client will take."""

    def script(server: RawUpstream, conn, request, index) -> bool:
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {announced}\r\n\r\n".encode())
        sent = 0
        while sent < announced and not server._stop.is_set():
            conn.sendall(chunk)  # the client hanging up ends this (BrokenPipe, caught by RawUpstream)
            sent += len(chunk)
        return False

    return script


class Hostile(RawUpstream):
    """`routes`: path (without its query) -> bytes sent as they are, or a script(server, conn, request, index) ->
    keep the connection open."""

    def __init__(self, routes: dict[str, bytes | Callable]):
        self.routes = routes
        super().__init__(self._answer)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def paths(self) -> list[str]:
        """The paths asked so far, in order."""
        return [r.target.split("?", 1)[0] for r in self.requests]

    @staticmethod
    def _answer(server: Hostile, conn, request, index) -> bool:
        action = server.routes.get(request.target.split("?", 1)[0], reply(b"not here", 404))
        if callable(action):
            return action(server, conn, request, index)
        conn.sendall(action)
        return True
