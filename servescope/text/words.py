"""Counts in words: "1 phase", "3 phases", "1 user", "0.5 req/s" (one rule for every line servescope prints)."""

from __future__ import annotations

UNCOUNTED = frozenset({"req/s", "tokens/s", "s", "ms", "GiB", "%"})  # units: the same after any number


def plural(noun: str) -> str:
    if noun in UNCOUNTED or noun.endswith("/s"):
        return noun
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def count(n: float, noun: str, many: str | None = None) -> str:
    """n and the noun, singular for exactly one: count(1, "phase") = "1 phase", count(2, "phase") = "2 phases"."""
    return f"{n:g} {noun if n == 1 else (many or plural(noun))}"


def noun(n: float, singular: str, many: str | None = None) -> str:
    """The noun alone, agreeing with n (for a count written elsewhere in the line)."""
    return singular if n == 1 else (many or plural(singular))


def load(value: float, unit: str) -> str:
    """A load level in its unit as knee.json names it ("users" or "req/s"): "1 user", "3 users", "0.5 req/s"."""
    if unit in UNCOUNTED or unit.endswith("/s"):
        return f"{value:g} {unit}"
    singular = unit[:-1] if unit.endswith("s") else unit
    return count(value, singular)
