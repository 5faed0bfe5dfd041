"""Engine URLs: what makes one usable (scheme, host, port in range), and credentials never shown or stored."""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit, urlunsplit

REDACTED = "***"
# scheme://userinfo@ in free text; greedy up to the authority's last "@" (a password may hold an unescaped "@").
_USERINFO_IN_TEXT = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]*(?:@[^/\s@]*)*@")


def redact_userinfo(url: str) -> str:
    """The URL with its user:password@ (if any) replaced by ***@, for output, logs and stored files."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=f"{REDACTED}@{parts.netloc.rpartition('@')[2]}"))


def redact_text(text: str) -> str:
    """Every scheme://user:password@ in a line of text (a command line, an error message) redacted."""
    return _USERINFO_IN_TEXT.sub(rf"\1{REDACTED}@", text)


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
