"""Lengths without a tokenizer: words as the unit (about one token each), ranges and summaries for the manifest.

No tokenizer is loaded: the engines' tokenizers differ from each other, and the server's own count
(`usage.prompt_tokens`, Ollama's `prompt_eval_count`) is what every record keeps. Words are what a
dataset's filters and a generated set's stated distributions count.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def words(text: str) -> int:
    return len(text.split())


def parse_range(text: str, what: str) -> tuple[int, int]:
    """`MIN-MAX` (either side may be left out: `-512`, `16-`) -> (min, max) in words."""
    low, sep, high = text.partition("-")
    try:
        lo = int(low) if low.strip() else 0
        hi = int(high) if sep and high.strip() else (lo if not sep else 10**9)
    except ValueError:
        raise ValueError(f"{what}: expected MIN-MAX in words, e.g. 4-1024, got {text!r}") from None
    if lo < 0 or hi < lo:
        raise ValueError(f"{what}: expected 0 <= MIN <= MAX, got {text!r}")
    return lo, hi


def summary(values: Sequence[int]) -> dict[str, float | int | None]:
    """min / median / p90 / max / mean of a set of lengths: how a set's length distribution is stated."""
    data = sorted(values)
    if not data:
        return {"n": 0, "min": None, "p50": None, "p90": None, "max": None, "mean": None}
    return {
        "n": len(data),
        "min": data[0],
        "p50": statistics.median(data),
        "p90": data[min(len(data) - 1, int(0.9 * len(data)))],
        "max": data[-1],
        "mean": round(statistics.fmean(data), 1),
    }
