"""servescope/text/words.py: a count agrees with its noun ("1 user", "2 users"), a rate keeps its unit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.text import words


@pytest.mark.parametrize(
    ("n", "noun", "said"),
    [
        (1, "phase", "1 phase"),
        (0, "phase", "0 phases"),
        (6, "phase", "6 phases"),
        (1, "more repetition", "1 more repetition"),
        (3, "more repetition", "3 more repetitions"),
        (2, "process", "2 processes"),
        (2, "entry", "2 entries"),
        (2, "day", "2 days"),
    ],
)
def test_a_count_agrees_with_its_noun(n, noun, said):
    assert words.count(n, noun) == said


@pytest.mark.parametrize(
    ("value", "unit", "said"),
    [(1, "users", "1 user"), (2, "users", "2 users"), (0.5, "req/s", "0.5 req/s"), (1, "req/s", "1 req/s")],
)
def test_a_load_level_reads_in_its_unit(value, unit, said):
    assert words.load(value, unit) == said


@settings(derandomize=True, max_examples=50)
@given(st.integers(min_value=0, max_value=10_000))
def test_only_exactly_one_is_singular(n):
    assert words.count(n, "user").endswith("users") == (n != 1)
    assert words.noun(n, "it", "them") == ("it" if n == 1 else "them")
