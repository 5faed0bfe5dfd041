"""What keeps /metrics bounded and true whatever engines and clients send: label caps, label length, sane values.

- A label value is at most MAX_LABEL_BYTES of UTF-8; a longer one keeps its start plus a short hash
  of the whole (two long names stay two labels). Text that is not valid Unicode is replaced, never
  allowed to break the page's encoding.
- At most MAX_MODELS model labels per engine instance come from what the engine lists (its loaded
  and installed models, the model names on its page); the others share OVERFLOW_MODEL.
- A sample value the engine cannot mean (NaN, infinite, a negative count, a ratio outside 0..1) is
  dropped and counted in servescope_engine_invalid_samples_total, never exported as if true.
- The Ollama proxy's labels follow the same caps (exporter/observations.py), whatever model names
  clients send; its running / waiting add one constant label (source="proxy") and exist only for
  labels a relayed request made.

Hence the size of /metrics, whatever clients and engines send: at most 2.5 MB per Ollama instance
with its proxy, 250 KB per vLLM instance, 4 KB per llama.cpp instance, plus 16 KB of the
exporter's own series and HELP text (and four short lines per watched process or container).
tests/behaviour/exporter/test_hardening.py fills every cap at once with names that escape to twice their size
and holds the page under these bounds.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

MAX_LABEL_BYTES = 128
MAX_MODELS = 64
OVERFLOW_MODEL = "other"
_HASH_CHARS = 12


def bounded(value: object) -> str:
    """A label value from engine or client text: valid UTF-8 of at most MAX_LABEL_BYTES bytes."""
    data = str(value).encode("utf-8", "replace")  # lone surrogates become "?"
    if len(data) <= MAX_LABEL_BYTES:
        return data.decode("utf-8")
    digest = hashlib.blake2b(data, digest_size=_HASH_CHARS // 2).hexdigest()
    head = data[: MAX_LABEL_BYTES - _HASH_CHARS - 1].decode("utf-8", "ignore")  # never half a character
    return f"{head}~{digest}"


class ModelLabels:
    """Label values for the model names one engine lists: the first MAX_MODELS by name are their own label
    (bounded), the rest OVERFLOW_MODEL. Sorted, so the same models keep their labels from scrape to scrape."""

    def __init__(self, names: Iterable[str], limit: int = MAX_MODELS):
        distinct = sorted(set(names))
        self.labels = {name: bounded(name) for name in distinct[:limit]}
        self.overflow = len(distinct) - len(self.labels)  # how many share OVERFLOW_MODEL

    def __getitem__(self, name: str) -> str:
        return self.labels.get(name, OVERFLOW_MODEL)


def finite(value: object) -> float | None:
    """Any finite number (seconds until a model unloads may be negative: overdue), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float: JSON allows it
        return None
    return number if math.isfinite(number) else None


def count(value: object) -> float | None:
    """A count or a gauge of things (requests, tokens, bytes, slots): finite and >= 0, else None."""
    number = finite(value)
    return number if number is not None and number >= 0 else None


def ratio(value: object) -> float | None:
    """A fraction 0..1 (KV-cache usage), else None."""
    number = count(value)
    return number if number is not None and number <= 1.0 else None
