"""What the dashboards chart and say of one engine, as data: dashboards/build.py writes the PromQL and the Grafana JSON.

An adapter fills a `Dashboard`: its own dashboard's panels (each a few queries: which series, what is done with
them, by which labels), and the words the shared dashboards (comparison, fleet) use for its gauges.
"""

from __future__ import annotations

from dataclasses import dataclass

# Which labels select a query's series (the dashboard variables they honour).
RAW = "raw"  # the engine's own page: instance, and the model under the label its page uses
ENGINE = "engine"  # servescope's series of this engine: engine and instance
MODEL = "model"  # the same with the model
PROXY = "proxy"  # the same with source="proxy": what the exporter's proxy observed

# What a query does with its series (a rename: each of its names, joined with `or`).
GAUGE = "gauge"  # the series as they are
SUM = "sum"  # summed by the query's labels
MAX = "max"  # the largest by them
COUNT = "count"  # how many series there are by them
RATE = "rate"  # per second, summed by them
RATIO = "ratio"  # per second, over another's per second (`per`)
MEAN = "mean"  # a histogram's mean over the window: rate of its _sum / rate of its _count
P95 = "p95"  # a histogram's 95th percentile
QUANTILES = "quantiles"  # a histogram's median and 95th percentile: two lines, "<legend> p50" and "<legend> p95"


@dataclass(frozen=True)
class Query:
    """One line of a panel (two for QUANTILES)."""

    how: str
    names: tuple[str, ...]
    legend: str
    of: str = RAW
    by: tuple[str, ...] = ("instance",)
    per: tuple[str, ...] = ()  # RATIO: the series it is divided by


def query(how: str, names: str | tuple[str, ...], legend: str = "{{instance}}", **rest) -> Query:
    return Query(how, (names,) if isinstance(names, str) else tuple(names), legend, **rest)


# A unit Grafana has no name for.
TOKENS_PER_S = "suffix: tok/s"

# Kinds of panel.
ROW = "row"
TIMESERIES = "timeseries"
STAT = "stat"


@dataclass(frozen=True)
class Panel:
    """One panel of the engine's own dashboard; width and height 0: the kind's own size."""

    kind: str
    title: str
    description: str = ""
    unit: str = ""
    queries: tuple[Query, ...] = ()
    width: int = 0
    height: int = 0
    stack: bool = False  # timeseries: the lines stacked
    up: bool = False  # stat: 0/1 read as down/up (red, green)


def row(title: str) -> Panel:
    return Panel(ROW, title)


def timeseries(title: str, description: str, unit: str, *queries: Query, **rest) -> Panel:
    return Panel(TIMESERIES, title, description, unit, queries, **rest)


def stat(title: str, description: str, unit: str, *queries: Query, **rest) -> Panel:
    return Panel(STAT, title, description, unit, queries, **rest)


@dataclass(frozen=True)
class Dashboard:
    """The engine on the dashboards: its own (servescope-<name>), and the words of the shared ones."""

    about: str = ""  # its own dashboard's description
    panels: tuple[Panel, ...] = ()  # its own dashboard's panels; (): it has none
    # The comparison dashboard's words for it ("": it says nothing of the engine there):
    named: str = ""  # its name in the description's list of what is compared
    running: str = ""  # what its running requests are
    running_note: str = ""  # a sentence after them (what a flat line means on it)
    waiting: str = ""  # what its waiting requests mean, in sentences
    cached: str = ""  # the name of its own count of cached prompt tokens
