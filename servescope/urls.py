"""URLs as shown to people: the credentials a URL may carry (`user:password@`) are never printed, logged or stored."""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

# `scheme://userinfo@host`: whatever sits between `//` and the first `@` of the authority (no `/`, `?`, `#`
# or blank in between). Applied to free text too, so a URL inside an error message is covered.
_USERINFO = re.compile(r"(?<=//)[^/?#@\s]*@")
MASK = "***@"


def redact(text: str) -> str:
    """`text` with the userinfo of every URL in it replaced by `***`: http://***@host:8000/v1."""
    return _USERINFO.sub(MASK, text)


def credentials(url: str) -> tuple[str, str] | None:
    """(user, password) from a URL's userinfo, percent-decoded; None when it has none."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return None
    return unquote(parts.username or ""), unquote(parts.password or "")
