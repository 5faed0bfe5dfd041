"""The knee's answer in words, one rule for quick, the knee command and the report: a load, or while the search is
unsettled the range its measurements allow (never a single number from an unsettled search)."""

from __future__ import annotations

import math
from typing import Any

from servescope.text import words


def capacity_range(knee: dict[str, Any]) -> tuple[float | None, float | None] | None:
    """(lowest, highest) capacity the measurements allow when the search stopped unsettled, else None.

    None at an end means open: no load below the knee held for sure ("at most"), or the failing load may yet hold
    ("at least"). knee.json written before the range was recorded: the knee's own level may fail on a repeat, so
    the range runs from the highest other load that held.
    """
    if knee.get("status") != "found" or not knee.get("unsettled"):
        return None
    if isinstance(knee.get("capacity_range"), list) and len(knee["capacity_range"]) == 2:
        low, high = knee["capacity_range"]
        return low, high
    k = knee["knee"]
    low = max((row["level"] for row in knee.get("levels", []) if row.get("meets") and row["level"] < k), default=None)
    return low, k


def span(knee: dict[str, Any]) -> str:
    """ "3 users", or "3 to 4 users" / "at least 3 users" / "at most 4 users" while unsettled."""
    unit = knee["unit"]
    found = capacity_range(knee)
    if found is None:
        return words.load(knee["knee"], unit)
    low, high = found
    if low is not None and high is not None:
        return words.load(low, unit) if low == high else f"{low:g} to {words.load(high, unit)}"
    if low is not None:
        return f"at least {words.load(low, unit)}"
    return f"at most {words.load(high, unit)}" if high is not None else "undecided"


def unsettled_words(knee: dict[str, Any]) -> str:
    """ "not settled: about 2 more measurements (about 1 min) would settle it", or "" when settled."""
    more = knee.get("unsettled") or 0
    if not more or knee.get("status") != "found":
        return ""
    each = knee.get("measurement_s")
    took = f" (about {math.ceil(more * each / 60)} min)" if isinstance(each, (int, float)) and each > 0 else ""
    return f"not settled: about {words.count(more, 'more measurement')}{took} would settle it"
