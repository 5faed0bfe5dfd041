"""Whether a server is up: one GET answered 200 within the timeout (not answering, or any other status, is "no").

The GET goes through servescope/host/bounded_http.py: the timeout bounds it as a whole (a server dripping its head a
byte a second is "no" at the timeout, not never), only its head is read, and a redirect to another origin is not
followed (it is "no").
"""

from __future__ import annotations

from servescope.host import bounded_http


def is_up(url: str, timeout: float = 2.0) -> bool:
    try:
        return bounded_http.get(url, timeout, head_only=True).status == 200
    except (bounded_http.ServiceError, ValueError):
        return False
