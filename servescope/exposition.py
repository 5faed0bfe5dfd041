"""Prometheus text exposition, read once: the exporter reads engines' /metrics pages with it, the run's sampler the exporter's."""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_exposition(text: str, wanted: frozenset[str]) -> Samples:
    """Sample name -> [(labels, value)] for the `wanted` samples of a Prometheus text page.

    Only the wanted sample lines are handed to prometheus_client's parser; ValueError when one of
    them is malformed or when the page has none of them (an HTML error page, another server).
    """
    prefixes = tuple(wanted)  # str.startswith with a tuple: the per-line test stays in C
    lines = []
    for line in text.splitlines():
        if line.startswith(prefixes):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in wanted:
                lines.append(line)
    if not lines:
        raise ValueError(f"none of {', '.join(sorted(wanted))} on the page")
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            samples[sample.name].append((sample.labels, float(sample.value)))
    return samples
