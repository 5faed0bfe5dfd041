"""Which path the engine-neutral series take: through the exporter, or Prometheus' fleet-mode rules (METRICS_MODE)."""

from __future__ import annotations

KNOB = "METRICS_MODE"
EXPORTER = "exporter"  # the exporter reads every engine's page on each scrape and exports all the neutral series
FLEET = "fleet"  # Prometheus scrapes the engines' pages itself; recording rules (prometheus/fleet/) make their series
MODES = (EXPORTER, FLEET)


def parse(value: str, where: str = KNOB) -> str:
    """The mode a setting names; ValueError naming `where` for any other word."""
    mode = value.strip().lower()
    if mode not in MODES:
        raise ValueError(f"{where}={value!r}: expected {' or '.join(MODES)}")
    return mode


def is_fleet(mode: str) -> bool:
    """Whether a setting (METRICS_MODE's text, or a flag's) names the fleet mode; ValueError for any other word."""
    return parse(mode) == FLEET
