"""Engine URLs, in one place: what makes one usable (scheme, host, port in range), and how one is shown without its credentials."""

from __future__ import annotations

import re
from urllib.parse import SplitResult, unquote, urlsplit

REDACTED = "***"
# scheme://userinfo@ anywhere in a text (a URL alone, a command line, an error message); greedy up to the
# authority's last "@", since a password may hold an unescaped "@".
_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]*(?:@[^/\s@]*)*@")


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
    problem = host_problem(parts.hostname)
    if problem is not None:
        raise ValueError(problem)
    return parts


MAX_HOST_NAME = 253  # DNS: a name's whole length; each dot-separated label 1 to 63 (what IDNA encoding refuses past)
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")  # `_`: Compose's service names have them


def host_problem(hostname: str) -> str | None:
    """Why a URL's host cannot be connected to (one short line, the name not echoed whole), or None: an IP address,
    or a DNS name (IDNA-encodable, 253 characters at most, labels of 1 to 63). A 1 MB host once passed here and every
    request of a run failed in the HTTP client with an idna traceback."""
    import ipaddress

    try:
        ipaddress.ip_address(hostname)
        return None
    except ValueError:
        pass
    if len(hostname) > MAX_HOST_NAME:
        return f"the host name is {len(hostname):,} characters: a DNS name has at most {MAX_HOST_NAME}"
    try:
        ascii_name = hostname.encode("idna").decode("ascii")
    except UnicodeError:
        ascii_name = ""
    labels = ascii_name.removesuffix(".").split(".")
    if not ascii_name or not all(_LABEL.fullmatch(label) for label in labels):
        return "the host is not a DNS name or an IP address (letters, digits and '-', dot-separated parts of 1 to 63)"
    return None


def redact(text: str) -> str:
    """`text` with the userinfo of every URL in it replaced by `***`: http://***@host:8000/v1. The one rule for
    whatever is shown or stored: logs, landing pages, terminal lines, manifests, error messages."""
    return _USERINFO.sub(rf"\1{REDACTED}@", text)


def redact_address(text: str) -> str:
    """redact() for an address as a user typed it, with or without its scheme: `bob:pw@host:8000` and
    `vllm=bob:pw@host:8000` become `***@host:8000` and `vllm=***@host:8000` (a bare text has no scheme for
    redact()'s rule to find; here the whole text is known to be one address)."""
    if "://" in text:
        return redact(text)
    kind, eq, address = text.partition("=")
    if not eq or "@" in kind or ":" in kind:  # `bob:p=w@host`: a password with "=", never a kind; safe over exact
        kind, eq, address = "", "", text
    authority, slash, path = address.partition("/")
    _, at, host = authority.rpartition("@")  # a password may hold "@": the host follows the last one
    if not at:
        return text
    return f"{kind}{eq}{REDACTED}@{host}{slash}{path}"


def credentials(url: str) -> tuple[str, str] | None:
    """(user, password) from a URL's userinfo, percent-decoded; None when it has none."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return None
    return unquote(parts.username or ""), unquote(parts.password or "")


def default_prometheus_url(port: str) -> str:
    """The stack's Prometheus on this machine at `port` (PROMETHEUS_PORT's text): where the report, the plan and the
    fleet-mode sampler ask when not told; its usual port when the knob holds no number."""
    try:
        return f"http://127.0.0.1:{int(port)}"
    except ValueError:
        return "http://127.0.0.1:9090"
