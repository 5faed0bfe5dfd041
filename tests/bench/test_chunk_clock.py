"""The benchmark's stream timer: stamps the first chunk and the end of a streamed response, and fails loudly."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest

from bench.chunk_clock import StreamTimer
from tests.doubles.ollama_simulator import OllamaSimulator

BODY = json.dumps(
    {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 5}}
).encode()


def run(coro):
    return asyncio.run(coro)


def test_first_chunk_and_end_are_stamped_on_one_kept_alive_connection():
    with OllamaSimulator(token_delay=0.02, load_delay=0) as sim:
        host, port = sim.url.removeprefix("http://").split(":")

        async def two():
            timer = await StreamTimer.connect(host, int(port))
            try:
                return [await timer.post(f"{host}:{port}", "/api/chat", BODY) for _ in range(2)]
            finally:
                timer.close()

        for first, total in run(two()):
            # prompt (delay/4) + one token before the first chunk; 5 tokens + the final object before the end
            assert 0.02 <= first < total and total >= 5 * 0.02
            assert total - first >= 4 * 0.02 * 0.9
        assert sim.stats["completed"] == 2


def test_an_error_status_raises():
    with OllamaSimulator(load_delay=0) as sim:
        host, port = sim.url.removeprefix("http://").split(":")

        async def bad():
            timer = await StreamTimer.connect(host, int(port))
            try:
                await timer.post(f"{host}:{port}", "/api/chat", b"{not json")
            finally:
                timer.close()

        with pytest.raises(RuntimeError, match="HTTP 400"):
            run(bad())


def test_a_stream_cut_mid_response_raises_instead_of_returning_a_time():
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{}\n\r\n")
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    port = listener.getsockname()[1]

    async def cut():
        timer = await StreamTimer.connect("127.0.0.1", port)
        await timer.post(f"127.0.0.1:{port}", "/api/chat", BODY)

    with pytest.raises(ConnectionError, match="mid-response"):
        run(cut())
    listener.close()
