"""A minimal kept-alive HTTP/1.1 client for benchmarks: stamps a streamed response's first chunk and its end as they arrive."""

from __future__ import annotations

import asyncio
import time

import httptools


class StreamTimer(asyncio.Protocol):
    """One kept-alive connection; `post()` sends a request and returns (seconds to the first body chunk, seconds to the end).

    The stamps are taken inside data_received, before anything else runs on the loop: a benchmark
    client built on aiohttp stamps a chunk only after a task switch, and its own CPU (more than
    the proxy's, per chunk) competes with what is measured on a 2-core machine.
    """

    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future | None = None
        self.started = self.first = self.now = 0.0
        self.status = 0
        self.closed = asyncio.get_running_loop().create_future()

    @classmethod
    async def connect(cls, host: str, port: int) -> StreamTimer:
        _, timer = await asyncio.get_running_loop().create_connection(cls, host, port)
        return timer

    async def post(self, host: str, path: str, body: bytes) -> tuple[float, float]:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionError("the connection was closed")
        self.waiter = asyncio.get_running_loop().create_future()
        self.parser = httptools.HttpResponseParser(self)
        self.first = 0.0
        request = (
            b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (path.encode(), host.encode(), len(body))
        ) + body
        self.started = time.perf_counter()
        self.transport.write(request)
        total = await self.waiter
        if self.status != 200:
            raise RuntimeError(f"HTTP {self.status} from {host}{path}")
        return self.first - self.started, total - self.started

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # --- asyncio.Protocol ---
    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.now = time.perf_counter()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"malformed response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError(f"connection lost mid-response: {exc or 'closed by the server'}"))
        if not self.closed.done():
            self.closed.set_result(None)

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
            if self.transport is not None:
                self.transport.abort()

    # --- httptools callbacks ---
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, _body: bytes) -> None:
        if not self.first:
            self.first = self.now

    def on_message_complete(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(self.now)
