"""Prometheus text exposition, read once: the exporter reads engines' /metrics pages with it, the run's sampler the exporter's."""

from __future__ import annotations

import re
from collections import defaultdict

Samples = dict[str, list[tuple[dict[str, str], float]]]

# A sample line in its plainest form (what the exporter and the engines write): a name, labels without escapes or
# spaces, one space, a value without a timestamp. Read here at a few microseconds a line; any other line goes to
# prometheus_client's parser (ten times slower, per line), whose reading is the rule: the two agree on every line
# this one takes (tests/servescope/prometheus/test_exposition.py holds them to it). The sampler reads a page every 100 ms.
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*"'
_PLAIN = re.compile(rf"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{{((?:{_LABEL},)*(?:{_LABEL})?)\}})? ([^\s_]+)")
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*)"')


def parse_exposition(text: str, wanted: frozenset[str]) -> Samples:
    """Sample name -> [(labels, value)] for the `wanted` samples of a Prometheus text page.

    Only the wanted sample lines are read; ValueError when one of them is malformed or when the page has none of
    them (an HTML error page, another server).
    """
    prefixes = tuple(wanted)  # str.startswith with a tuple: the per-line test stays in C
    samples: Samples = defaultdict(list)
    found = False
    for line in text.splitlines():
        if line.startswith(prefixes):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in wanted:
                found = True
                plain = _plain_sample(line.strip())
                if plain is not None:
                    samples[name].append(plain)
                else:
                    for sample_name, labels, value in prometheus_samples(line):
                        samples[sample_name].append((labels, value))
    if not found:
        raise ValueError(f"none of {', '.join(sorted(wanted))} on the page")
    return samples


def _plain_sample(line: str) -> tuple[dict[str, str], float] | None:
    """(labels, value) of a sample line in the plain form; None for any other line (prometheus_client reads it)."""
    match = _PLAIN.fullmatch(line)
    if match is None:
        return None
    text = match[2]
    if text and (text.startswith("__") or ",__" in text):
        return None  # a reserved label name (or a value that looks like one): prometheus_client says what it is
    pairs = _PAIR.findall(text) if text else []
    labels = dict(pairs)
    if len(labels) != len(pairs):
        return None  # a label twice
    raw = match[3]
    try:
        value = int(raw)  # as prometheus_client reads a value: an integer if it is one, else a float
    except ValueError:
        try:
            value = float(raw)
        except ValueError:
            return None
    return labels, float(value)


def prometheus_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample in `text` as prometheus_client's parser reads it (ValueError when it
    cannot)."""
    from prometheus_client.parser import text_string_to_metric_families  # only for lines not in the plain form

    return [
        (sample.name, sample.labels, float(sample.value))
        for family in text_string_to_metric_families(text + "\n")
        for sample in family.samples
    ]
