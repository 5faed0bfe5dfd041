"""Text from another service (or a user) made safe to show: one line, no control characters, no credentials, bounded.

What a server sends is echoed in terminal lines, logs, run records and reports: its error words, its version, a
header. Raw, it can move the cursor or recolour the terminal (escape sequences), forge a line of the tool's own
("0.32.0\\nok: everything is fine"), reorder what follows (bidirectional overrides) or fill the screen. `line()`
is the one rule for all of it.
"""

from __future__ import annotations

import re

from servescope.contracts.urls import redact

MAX_CHARS = 200  # what one echoed phrase may take of a terminal line
ELLIPSIS = "…"
# C0 and C1 controls (escape sequences start with one), DEL, and the invisible format characters that reorder or
# hide text: zero-width marks, bidirectional embeddings, overrides and isolates, line and paragraph separators, BOM.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2028\u2029\u2060-\u2069\ufeff\ufff9-\ufffb]")


def line(text: object, limit: int = MAX_CHARS) -> str:
    """`text` as one safe line: credentials masked, whitespace runs one space, other control or format characters gone,
    at most `limit` characters (an ellipsis says some were cut)."""
    # Whitespace of any kind (newlines, the separators Python counts as such) one space; the other controls gone,
    # so an escape sequence's remains are inert text; masked before cut: a cut through a URL's userinfo would
    # leave the password without the "@" redact() needs.
    shown = " ".join(redact(_UNSAFE.sub("", " ".join(str(text).split()))).split())
    return shown if len(shown) <= limit else shown[: max(0, limit - 1)] + ELLIPSIS
