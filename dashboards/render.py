"""A dashboard's panels as PNGs, from the very queries Grafana runs (Prometheus query_range + matplotlib).

    python -m dashboards.render --prometheus http://127.0.0.1:9090 --out DIR [--dashboard engine-comparison]
        [--start EPOCH --end EPOCH | --last 30m] [--var engine=vllm ...]

The report calls `render_dashboard()` for a run's time window.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from dashboards.build import DASHBOARDS, SCRAPE_INTERVAL
from servescope import engines
from servescope.prometheus.sampler import split_at_gaps
from servescope.text import numbers

# Grafana asks for at most about this many points per series; so do we.
MAX_POINTS = 300
VARIABLE = re.compile(r"\$\{?(\w+)\}?")


class RenderError(Exception):
    """Prometheus unreachable or refusing a query: the one line to print."""


@dataclass
class Series:
    """One line of a panel: its legend and the points its query_range returned."""

    legend: str
    times: list[float]
    values: list[float]


@dataclass
class PanelData:
    """One panel's data as its queries returned it: the series to draw, or the errors to print instead."""

    title: str
    unit: str
    kind: str  # timeseries or stat
    series: list[Series] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    value_text: dict[str, str] = field(default_factory=dict)  # Grafana value mappings, e.g. "1" -> "up"

    @property
    def has_data(self) -> bool:
        return any(any(not math.isnan(v) for v in s.values) for s in self.series)


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", duration)
    if not match:
        raise ValueError(f"duration {duration!r} is not like 30s, 5m or 1h")
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    return float(match.group(1)) * scale


def step_for(start: float, end: float, scrape_interval: str = SCRAPE_INTERVAL) -> float:
    """Grafana's $__interval: the window over MAX_POINTS, never below the scrape interval."""
    return max(_seconds(scrape_interval), math.ceil((end - start) / MAX_POINTS))


def rate_interval_for(step: float, scrape_interval: str = SCRAPE_INTERVAL) -> str:
    """Grafana's $__rate_interval: max($__interval + scrape interval, 4 x scrape interval)."""
    scrape = _seconds(scrape_interval)
    return f"{int(math.ceil(max(step + scrape, 4 * scrape)))}s"


def substitute(expr: str, variables: dict[str, str], *, step: float, rate_interval: str) -> str:
    """Replace dashboard variables the way Grafana would; unset variables mean All (regex .*)."""
    builtins = {"__rate_interval": rate_interval, "__interval": f"{int(step)}s", "__range": f"{int(step)}s"}

    def value(match: re.Match) -> str:
        name = match.group(1)
        if name in builtins:
            return builtins[name]
        return variables.get(name, ".*")

    return VARIABLE.sub(value, expr)


def panel_variables(board: dict, overrides: dict[str, str]) -> dict[str, str]:
    """Constant variables of the dashboard (e.g. engine=vllm on the vLLM dashboard), then the caller's."""
    found = {}
    for var in board.get("templating", {}).get("list", []):
        if var.get("type") == "constant":
            found[var["name"]] = var["query"]
    found.update(overrides)
    return found


def legend_text(template: str, labels: dict[str, str]) -> str:
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template or "")
    return " ".join(text.split()) or ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"


def query_range(prometheus: str, expr: str, start: float, end: float, step: float, timeout: float = 15) -> list[dict]:
    try:
        resp = requests.post(
            f"{prometheus.rstrip('/')}/api/v1/query_range",
            data={"query": expr, "start": start, "end": end, "step": step},
            timeout=timeout,
        )
    except requests.RequestException as exc:
        raise RenderError(f"Prometheus at {prometheus} unreachable: {type(exc).__name__}") from None
    try:
        payload = resp.json()
    except ValueError:
        raise RenderError(f"Prometheus at {prometheus}: HTTP {resp.status_code}, not JSON") from None
    if payload.get("status") != "success":
        raise RenderError(f"query refused ({payload.get('errorType')}: {payload.get('error')}): {expr}")
    return payload["data"]["result"]


def panel_data(
    board: dict, prometheus: str, start: float, end: float, variables: dict[str, str] | None = None
) -> list[PanelData]:
    """Every data panel of a dashboard with its series over [start, end]."""
    step = step_for(start, end)
    rate_interval = rate_interval_for(step)
    values = panel_variables(board, variables or {})
    panels = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        defaults = panel["fieldConfig"]["defaults"]
        data = PanelData(panel["title"], defaults.get("unit", "short"), panel["type"])
        for mapping in defaults.get("mappings", []):
            if mapping.get("type") == "value":
                data.value_text.update({key: opt["text"] for key, opt in mapping["options"].items()})
        for target in panel["targets"]:
            expr = substitute(target["expr"], values, step=step, rate_interval=rate_interval)
            try:
                result = query_range(prometheus, expr, start, end, step)
            except RenderError as exc:
                if "unreachable" in str(exc):
                    raise
                data.errors.append(str(exc))
                continue
            for item in result:
                # Steps with no sample (a stack that was down, a target that stopped answering) are gaps, as in
                # Grafana: a NaN where two points are more than a step or so apart, never a line across.
                points = split_at_gaps([(float(t), float(v)) for t, v in item["values"]], step)
                data.series.append(
                    Series(
                        legend_text(target.get("legendFormat", ""), item["metric"]),
                        [p[0] for p in points],
                        [math.nan if p[1] is None else p[1] for p in points],
                    )
                )
        panels.append(data)
    return panels


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _formatter(unit: str):
    from matplotlib.ticker import FuncFormatter

    def tick(value: float, _pos=None) -> str:
        """An axis tick in the panel's Grafana unit."""
        if unit == "percentunit":
            return numbers.percent_significant(value)
        if unit == "s":
            return numbers.duration(value, by_magnitude=True)
        if unit == "bytes":
            return numbers.binary_size(value)
        if unit == "reqps":
            return f"{numbers.significant(value)} req/s"
        if unit.startswith("suffix:"):
            return f"{numbers.grouped(value)}{unit[len('suffix:') :]}"
        return numbers.grouped(value)

    return FuncFormatter(tick)


# The same engine keeps its colour on every panel (instances named like vllm-b share their kind's).
ENGINE_COLOURS = {kind.name: kind.colour for kind in engines.ENGINES.values() if kind.colour}
# Legend suffixes that name a variant of one engine's series (build.py's legends).
VARIANTS = {"p50", "p95", "p99", "used", "limit"}
DASHED = {"p95", "p99", "limit"}


def draw(panel: PanelData, ax, start: float | None = None, end: float | None = None) -> None:
    import matplotlib.dates as mdates

    ax.set_title(panel.title, fontsize=10, loc="left")
    drawn = 0
    highest = 0.0
    colours: dict[str, str] = {}
    palette = [f"C{i}" for i in range(3, 10)]
    for s in panel.series:
        # NaN stays in: matplotlib breaks the line there, so a gap is drawn as a gap.
        points = [(dt.datetime.fromtimestamp(t), v) for t, v in zip(s.times, s.values, strict=True)]
        finite = [v for _, v in points if not math.isnan(v)]
        if not finite:
            continue
        # One colour per engine/instance; its p95 or its limit dashed beside its p50 or its use.
        base, _, variant = s.legend.rpartition(" ")
        if variant not in VARIANTS:
            base, variant = s.legend, ""
        kind = next((k for k in ENGINE_COLOURS if base == k or base.startswith((k + "-", k + ":", k + " "))), None)
        colour = colours.setdefault(base, ENGINE_COLOURS[kind] if kind else palette[len(colours) % len(palette)])
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            label=s.legend,
            linewidth=1.5,
            color=colour,
            linestyle="--" if variant in DASHED else "-",
            drawstyle="steps-post" if panel.kind == "stat" else "default",
        )
        highest = max(highest, max(finite))
        drawn += 1
    if drawn == 0:
        reason = panel.errors[0] if panel.errors else "no data in this window"
        ax.text(0.5, 0.5, reason[:80], ha="center", va="center", transform=ax.transAxes, color="grey", fontsize=8)
        ax.set_yticks([])
    elif panel.kind == "stat":
        # A stat panel's point is its last value: print it (with Grafana's value mapping) over the line.
        lasts = []
        for s in panel.series:
            finite = [v for v in s.values if not math.isnan(v)]
            if finite:
                raw = f"{finite[-1]:g}"
                lasts.append(f"{s.legend}: {panel.value_text.get(raw, _formatter(panel.unit)(finite[-1]))}")
        ax.text(
            0.98,
            0.5,
            "\n".join(lasts),
            ha="right",
            va="center",
            transform=ax.transAxes,
            fontsize=11,
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"},
        )
    ax.yaxis.set_major_formatter(_formatter(panel.unit))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    if start is not None and end is not None:
        # The run's window, whatever the data covers: panels side by side share a time axis.
        ax.set_xlim(dt.datetime.fromtimestamp(start), dt.datetime.fromtimestamp(end))
    ax.tick_params(labelsize=7)
    ax.grid(True, alpha=0.3)
    # Counts, rates and durations start at 0; a ratio shows its whole 0..100% range; an all-zero
    # series (no errors) sits on the floor of a 0..1 axis instead of in the middle of -0.05..0.05.
    top = highest * 1.1 if highest > 0 else 1.0
    if panel.unit == "percentunit":
        top = max(top, 1.0)
    ax.set_ylim(0, top)
    if drawn:
        ax.legend(fontsize=7, loc="upper left", framealpha=0.7)


def render_dashboard(
    prometheus: str,
    start: float,
    end: float,
    out_dir: Path,
    *,
    dashboard: str = "engine-comparison",
    variables: dict[str, str] | None = None,
    overview: bool = True,
) -> list[Path]:
    """Write one PNG per data panel (NN-title.png) and, when asked, all of them on one page; return the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if dashboard not in DASHBOARDS:
        raise RenderError(f"unknown dashboard {dashboard!r}: expected one of {', '.join(DASHBOARDS)}")
    board = DASHBOARDS[dashboard]()
    panels = panel_data(board, prometheus, start, end, variables)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for index, panel in enumerate(panels, start=1):
        fig, ax = plt.subplots(figsize=(7, 3.2), dpi=110)
        draw(panel, ax, start, end)
        fig.autofmt_xdate()
        fig.tight_layout()
        path = out_dir / f"{dashboard}-{index:02d}-{_slug(panel.title)}.png"
        fig.savefig(path, pil_kwargs={"compress_level": 3})
        plt.close(fig)
        written.append(path)
    if overview and panels:
        cols = 3
        rows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3 * rows), dpi=90, squeeze=False)
        for ax, panel in zip(axes.flat, panels, strict=False):
            draw(panel, ax, start, end)
        for ax in list(axes.flat)[len(panels) :]:
            ax.axis("off")
        stamp = f"{dt.datetime.fromtimestamp(start):%Y-%m-%d %H:%M:%S} – {dt.datetime.fromtimestamp(end):%H:%M:%S}"
        fig.suptitle(f"{board['title']}   ({stamp})", fontsize=12)
        fig.tight_layout(rect=(0, 0, 1, 0.97))
        path = out_dir / f"{dashboard}.png"
        fig.savefig(path, pil_kwargs={"compress_level": 3})
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.render", description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090")
    parser.add_argument("--dashboard", default="engine-comparison", choices=sorted(DASHBOARDS))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--start", type=float, help="epoch seconds (default: --last before now)")
    parser.add_argument("--end", type=float, help="epoch seconds (default: now)")
    parser.add_argument("--last", default="30m", help="window length when --start is not given (default 30m)")
    parser.add_argument(
        "--var",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a dashboard variable as a regex, e.g. engine=vllm|ollama (default: All)",
    )
    args = parser.parse_args(argv)
    end = args.end or time.time()
    try:
        start = args.start or end - _seconds(args.last)
        variables = dict(item.split("=", 1) for item in args.var)
    except ValueError as exc:
        print(f"render: {exc}" if "duration" in str(exc) else "render: --var must be NAME=VALUE", file=sys.stderr)
        return 2
    try:
        paths = render_dashboard(args.prometheus, start, end, args.out, dashboard=args.dashboard, variables=variables)
    except RenderError as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
