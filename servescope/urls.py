"""Engine URLs: what makes one usable (scheme, host, port in range), in one place."""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit


def parse_http_url(url: str) -> SplitResult:
    """An http(s)://HOST[:PORT][/path] URL whose parts a client can use, else ValueError with one line why."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("expected http://HOST:PORT")
    host = parts.netloc.rpartition("@")[2]
    if host.count(":") > 1 and not host.startswith("["):
        raise ValueError("an IPv6 address needs brackets: http://[::1]:PORT")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"the port must be a number from 1 to 65535, got {host.rpartition(':')[2]!r}") from None
    if not parts.hostname:
        raise ValueError("expected http://HOST:PORT (no host)")
    if port == 0:
        raise ValueError("the port must be a number from 1 to 65535, got 0")
    return parts
