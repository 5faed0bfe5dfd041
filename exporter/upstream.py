"""HTTP GETs against one engine instance over kept-alive connections, each bounded as a whole by the scrape's deadline.

The transport is servescope/host/bounded_http.py's, the one every reader of another service uses (why raw sockets and
llhttp rather than http.client or requests: see there; a call also costs less CPU than with requests, see
bench/exporter_scrape.py). What is the exporter's own here: an engine's 404/501 is MISSING (a feature switched off),
401/403 is Unauthorized (an API key wanted), any other status but 200 an error, and a large body read is noted so
the collector gives the heap back once it is done with the page. Redirects are not followed: an engine answers
its endpoints where it serves them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from exporter.heap import LARGE_BODY_BYTES
from servescope.host.bounded_http import Origin, ServiceError, parse_json


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


# What get_*(missing_ok=True) returns when the engine says the endpoint is off (404/501); distinct
# from a JSON `null` body, which is a malformed answer.
MISSING: Any = _Missing()


class UpstreamError(ServiceError):
    """The engine could not be read: down, too slow, an HTTP error status, or a malformed payload."""


class Unauthorized(UpstreamError):
    """The engine answered 401/403: it wants an API key the exporter lacks or got wrong."""


class Upstream(Origin):
    """One engine's base URL plus the connections, clock and deadline handling used to read it.

    `deadline` arguments are absolute times on `clock`; every fetch stops there, so a slow engine
    costs at most the configured timeout however many endpoints a collector reads. `api_key` is sent
    as `Authorization: Bearer` (vLLM's and llama-server's --api-key); without one, a user:password in
    the URL is sent as Basic authentication.
    """

    def __init__(self, base_url: str, *, api_key: str = "", clock: Callable[[], float] = time.monotonic):
        super().__init__(base_url, api_key=api_key, clock=clock, user_agent="servescope-exporter", error=UpstreamError)
        self.large_read = False  # a body of LARGE_BODY_BYTES or more was read since the collector last looked

    def get_bytes(self, path: str, deadline: float, *, missing_ok: bool = False) -> Any:
        """The body of GET base_url+path; MISSING when missing_ok and the engine says 404/501 (feature off)."""
        answer = self.get(path, deadline)
        if missing_ok and answer.status in (404, 501):
            return MISSING
        if answer.status in (401, 403):
            raise Unauthorized(
                f"GET {answer.url}: HTTP {answer.status} (an API key is needed, or the one given is wrong)"
            )
        if answer.status != 200:
            raise UpstreamError(f"GET {answer.url}: HTTP {answer.status}")
        if len(answer.body) >= LARGE_BODY_BYTES:
            self.large_read = True  # the collector gives the heap back once it is done with the page
        return answer.body

    def get_text(self, path: str, deadline: float, *, missing_ok: bool = False) -> Any:
        body = self.get_bytes(path, deadline, missing_ok=missing_ok)
        if body is MISSING:
            return MISSING
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            raise UpstreamError(f"GET {self.shown_url}{path}: body is not UTF-8") from None

    def get_json(self, path: str, deadline: float, *, missing_ok: bool = False) -> Any:
        body = self.get_bytes(path, deadline, missing_ok=missing_ok)
        if body is MISSING:
            return MISSING
        return parse_json(body, f"GET {self.shown_url}{path}: malformed JSON", error=UpstreamError)
