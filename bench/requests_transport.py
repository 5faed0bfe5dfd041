"""requests + urllib3 behind the load generator's transport interface, measured beside geventhttpclient.

`python -m bench.requests_transport COMMAND ...` is `python -m loadgen COMMAND ...` with this transport
registered, so `--http-client requests` names it; the load generator itself ships geventhttpclient only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

NAME = "requests"


class RequestsTransport:
    """requests + urllib3: the common choice."""

    name = NAME

    def __init__(self, base_url: str, timeout: float, concurrency: int = 1):
        # Imported here: under `python -m bench.requests_transport` Locust's monkey-patching comes first.
        import requests
        from requests.adapters import HTTPAdapter

        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=max(1, concurrency)))
        self.session.headers.update({"Content-Type": "application/json"})

    def connect(self) -> None:
        try:
            pool = self.session.get_adapter(self.base_url).poolmanager.connection_from_url(self.base_url)
            conn = pool._get_conn()
        except Exception:  # noqa: BLE001 - warming is best effort: the request reports its own failure
            return
        try:
            if conn.sock is None:
                conn.connect()
        except OSError:
            conn.close()
        finally:
            pool._put_conn(conn)

    def post(self, path: str, body: bytes) -> _RequestsResponse:
        return _RequestsResponse(
            self.session.post(
                self.base_url + path, data=body, stream=True, timeout=(min(self.timeout, 10.0), self.timeout)
            )
        )

    def close(self) -> None:
        self.session.close()


class _RequestsResponse:
    def __init__(self, response):
        self.response = response
        self.status = response.status_code

    def blocks(self, clock: Callable[[], float]) -> Iterator[tuple[float, bytes]]:
        from requests.exceptions import ChunkedEncodingError

        # chunk_size=None: each piece as the socket delivers it, never waiting to fill a buffer.
        try:
            for piece in self.response.iter_content(chunk_size=None):
                yield clock(), piece
        except ChunkedEncodingError as exc:
            # The body ended before its last chunk: the transport contract's type for a cut stream.
            raise EOFError("connection closed mid-stream") from exc

    def body_text(self) -> str:
        return self.response.text

    def close(self, complete: bool = False) -> None:
        self.response.close()


def register() -> None:
    """Make `--http-client requests` (and loadgen.client.make_transport("requests", ...)) name this transport."""
    from loadgen import client

    client.TRANSPORTS[NAME] = RequestsTransport


if __name__ == "__main__":
    from loadgen import cli  # Locust first: gevent's monkey-patching before requests is imported

    register()
    sys.exit(cli.main())
