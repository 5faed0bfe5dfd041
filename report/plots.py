"""The report's figures (matplotlib, Agg backend): every plot titled, axes with units, a legend where there are series."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display here, and a report must render the same everywhere

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import cbook  # noqa: E402

from report import latency, stats  # noqa: E402
from report.compare import Delta  # noqa: E402
from report.crosscheck import COMPONENTS, CrossCheck  # noqa: E402
from report.gauges import GaugeReport, with_gaps  # noqa: E402
from report.load import Run  # noqa: E402
from report.sweep import BurstDrain, Sweep, mean_ttft_by_arrival  # noqa: E402
from report.table import TableRow  # noqa: E402
from report.workloads import WorkloadReport  # noqa: E402
from servescope import series  # noqa: E402

DPI = 110
COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]
MAX_FLIERS = 2000  # points drawn beyond the whiskers of a box whose values are not all fetched
PHASE_SHADES = ("#dbe9f6", "#fde5cc", "#dff0d8", "#eadcf0", "#f9dede", "#e8e8e8")


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def seed_table(rows: list[TableRow], path: Path) -> Path | None:
    """Wall time per engine and mode, with the scaling factor written over each burst."""
    if not rows:
        return None
    titles = list(dict.fromkeys(r.title for r in rows))
    modes = list(dict.fromkeys(r.mode for r in rows))
    fig, ax = plt.subplots(figsize=(9, 4.2))
    width = 0.8 / max(1, len(modes))
    for m_i, mode in enumerate(modes):
        xs, hs, labels = [], [], []
        for e_i, title in enumerate(titles):
            match = [r for r in rows if r.title == title and r.mode == mode]
            if match:
                xs.append(e_i + (m_i - (len(modes) - 1) / 2) * width)
                hs.append(match[0].wall_s)
                labels.append(f"{match[0].scaling_factor:.2f}x" if match[0].scaling_factor is not None else "")
        bars = ax.bar(xs, hs, width=width * 0.95, label=mode, color=COLORS[m_i % len(COLORS)])
        for bar, text in zip(bars, labels, strict=True):
            if text:
                ax.annotate(
                    text,
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=9,
                    fontweight="bold",
                    xytext=(0, 2),
                    textcoords="offset points",
                )
    ax.set_xticks(range(len(titles)), titles)
    ax.set_ylabel("wall time (s)")
    ax.set_title("The seed's comparison: wall time per mode (bold: scaling factor vs matched-set sequential)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def latency_boxes(run: Run, path: Path) -> Path | None:
    groups = [(i, s) for i, s in latency.groups(run) if _any_ok(run, i, s)]
    if not groups:
        return None
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.5))
    labels = [f"{run.engines[i].title}\n{s}" for i, s in groups]
    for ax, metric in zip(axes.flat, latency.METRICS, strict=True):
        boxes = [_box(run, i, s, metric) for i, s in groups]
        positions = [k for k, box in enumerate(boxes) if box]
        if positions:
            bp = ax.bxp([boxes[k] for k in positions], positions=positions, widths=0.6, patch_artist=True)
            for k, patch in zip(positions, bp["boxes"], strict=True):
                patch.set_facecolor(COLORS[k % len(COLORS)])
                patch.set_alpha(0.6)
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylabel("milliseconds")
        ax.set_title(latency.DEFINITIONS[metric].split(":")[0] + " (box p25-p75, whiskers p5-p95)", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k % len(COLORS)], alpha=0.6) for k in range(len(labels))]
    fig.legend(
        handles, [lb.replace("\n", " / ") for lb in labels], loc="lower center", ncol=min(4, len(labels)), fontsize=8
    )
    fig.suptitle("Client-side latency per engine and scenario (successful requests)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _any_ok(run: Run, instance: str, scenario: str) -> bool:
    sql = f"SELECT count(*) FROM requests WHERE ok AND {latency.GROUP}"
    return bool(run.con.execute(sql, [instance, scenario]).fetchone()[0])


def _box(run: Run, instance: str, scenario: str, metric: str) -> dict | None:
    """One box's statistics in ms, as matplotlib's boxplot(whis=(p5, p95)) computes them (a pool too large to fetch:
    from exact order statistics); every box draws at most MAX_FLIERS fliers, evenly spread."""
    whis = (latency.BOX_QUANTILES[0], latency.BOX_QUANTILES[-1])
    if metric != "itl_s":
        data = latency.samples(run, instance, scenario, metric) * 1000
        return _thin(cbook.boxplot_stats(data, whis=whis)[0]) if len(data) else None
    pool = latency.pool(run, instance, scenario)
    if not pool.n:
        return None
    if pool.whole:
        return _thin(cbook.boxplot_stats(pool.in_order() * 1000, whis=whis)[0])
    # The whiskers are data points: the smallest value >= p5 and the largest <= p95.
    low, high = (pool.percentile(q) for q in whis)
    lo5, hi5, _ = stats.rank_of(pool.n, whis[0])
    lo95, hi95, _ = stats.rank_of(pool.n, whis[1])
    whislo = pool.at(lo5) if pool.at(lo5) >= low else pool.at(hi5)
    whishi = pool.at(hi95) if pool.at(hi95) <= high else pool.at(lo95)
    return {
        "med": pool.percentile(50) * 1000,
        "q1": pool.percentile(25) * 1000,
        "q3": pool.percentile(75) * 1000,
        "whislo": whislo * 1000,
        "whishi": whishi * 1000,
        "mean": pool.total / pool.n * 1000,
        "fliers": pool.outside(whislo, whishi, MAX_FLIERS) * 1000,
    }


def _thin(box: dict) -> dict:
    """At most MAX_FLIERS fliers, evenly spread over them: 50,000 markers per box draw slowly and show no more."""
    fliers = box["fliers"]
    box["fliers"] = fliers[:: -(-len(fliers) // MAX_FLIERS)] if len(fliers) > MAX_FLIERS else fliers
    return box


def output_tokens(run: Run, path: Path) -> Path | None:
    # Counts per length from the engine: the histogram of a million requests without a million numbers.
    data = {}
    for i in run.engines:
        rows = run.con.execute(
            "SELECT output_tokens, count(*) FROM requests WHERE ok AND instance = ? AND output_tokens IS NOT NULL "
            "GROUP BY 1 ORDER BY 1",
            [i],
        ).fetchall()
        if rows:
            data[run.engines[i].title] = ([v for v, _ in rows], [n for _, n in rows])
    if not data:
        return None
    fig, ax = plt.subplots(figsize=(8, 3.6))
    lo, hi = min(v[0][0] for v in data.values()), max(v[0][-1] for v in data.values())
    bins = range(lo, hi + 2) if hi - lo <= 60 else 30
    ax.hist(
        [v for v, _ in data.values()], bins=bins, weights=[n for _, n in data.values()], label=list(data), alpha=0.8
    )
    ax.set_xlabel("output tokens per request")
    ax.set_ylabel("requests")
    ax.set_title("Output length per engine (successful requests)")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def gauge_traces(run: Run, report: GaugeReport) -> dict[str, dict]:
    """What the gauge plot draws, in seconds since the run's start: phase bands and each gauge with its gaps as NaN."""
    if not report.available or report.window is None:
        return {}
    t0 = report.window[0]
    traces = {}
    for eg in report.engines.values():
        if not eg.series:
            continue
        trace = {"bands": [(p.phase, p.started_at - t0, p.ended_at - t0) for p in run.phases_of(eg.instance)]}
        for gauge in (series.REQUESTS_RUNNING, series.REQUESTS_WAITING, series.KV_CACHE_USAGE):
            points = with_gaps(eg.series.get(gauge, []), eg.spacing_s)
            trace[gauge] = ([t - t0 for t, _ in points], [v for _, v in points])
        traces[eg.instance] = trace
    return traces


def gauges(run: Run, report: GaugeReport, path: Path) -> Path | None:
    traces = gauge_traces(run, report)
    if not traces:
        return None
    fig, axes = plt.subplots(len(traces), 1, figsize=(11, 3.2 * len(traces)), squeeze=False, sharex=True)
    for ax, (instance, trace) in zip(axes[:, 0], traces.items(), strict=True):
        for k, (phase, start, end) in enumerate(trace["bands"]):
            ax.axvspan(start, end, color=PHASE_SHADES[k % len(PHASE_SHADES)], zorder=0)
            # Staggered so the labels of short neighbouring phases do not print over each other.
            ax.text(
                (start + end) / 2,
                1.01 + 0.07 * (k % 3),
                phase,
                transform=ax.get_xaxis_transform(),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        lines = []
        for gauge, color, label in (
            (series.REQUESTS_RUNNING, COLORS[0], "running"),
            (series.REQUESTS_WAITING, COLORS[3], "waiting"),
        ):
            xs, ys = trace[gauge]
            if xs:
                # Each read stands until the next one; NaN (a read with no value, or nobody reading) is a gap.
                lines += ax.step(xs, ys, where="post", color=color, label=label)
        ax.set_ylabel("requests")
        counts = [v for g in (series.REQUESTS_RUNNING, series.REQUESTS_WAITING) for v in trace[g][1] if v == v]
        ax.set_ylim(0, max(1.0, max(counts, default=1.0)) * 1.15)
        xs, ys = trace[series.KV_CACHE_USAGE]
        kv = [v * 100 for v in ys]
        if any(v == v for v in kv):
            ax2 = ax.twinx()
            lines += ax2.plot(xs, kv, color=COLORS[2], linestyle="--", label="KV cache usage")
            ax2.set_ylabel("KV cache usage (%)")
            ax2.set_ylim(0, max(5.0, max(v for v in kv if v == v) * 1.2))
        eg = report.engines[instance]
        how = f"samples every {eg.spacing_s * 1000:g} ms" if eg.source == "samples" else "Prometheus"
        ax.set_title(f"{run.engines[instance].title}: lever gauges ({how}; shaded: load phases)", fontsize=10, pad=38)
        ax.legend(lines, [ln.get_label() for ln in lines], loc="upper right", fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since run start")
    return _save(fig, path)


def ttft_by_arrival(run: Run, drains: list[BurstDrain], path: Path) -> Path | None:
    fig, ax = plt.subplots(figsize=(8, 3.8))
    drawn = False
    for k, instance in enumerate(run.engines):
        pts = mean_ttft_by_arrival(drains, instance)
        if pts:
            ax.plot(
                [i + 1 for i, _ in pts],
                [v for _, v in pts],
                marker="o",
                color=COLORS[k % len(COLORS)],
                label=run.engines[instance].title,
            )
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("arrival order within the burst (1 = first released)")
    ax.set_ylabel("TTFT (s), mean over bursts")
    ax.set_title("TTFT by arrival order: flat = served together, staircase = one at a time")
    ax.legend()
    ax.grid(alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)
    return _save(fig, path)


def sweeps(run: Run, sweeps_: list[Sweep], path: Path) -> Path | None:
    if not sweeps_:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for k, sw in enumerate(sweeps_):
        color = COLORS[k % len(COLORS)]
        label = f"{run.engines[sw.instance].title} ({sw.scenario})"
        cs = [lv.concurrency for lv in sw.levels]
        ax1.plot(cs, [lv.tokens_per_s or 0 for lv in sw.levels], marker="o", color=color, label=label)
        ax2.plot(cs, [lv.e2e["p50"] for lv in sw.levels], marker="o", color=color, label=f"{label} E2E p50")
        ax2.plot(
            cs, [lv.e2e["p95"] for lv in sw.levels], marker="^", linestyle=":", color=color, label=f"{label} E2E p95"
        )
        if sw.knee_concurrency is not None:
            ax1.axvline(sw.knee_concurrency, color=color, linestyle="--", alpha=0.6, label=f"knee ({label})")
    ax1.set_xlabel("concurrency (requests in flight)")
    ax1.set_ylabel("output tokens/s (aggregate)")
    ax1.set_title("Throughput vs concurrency")
    ax2.set_xlabel("concurrency (requests in flight)")
    ax2.set_ylabel("E2E latency (s)")
    ax2.set_title("Latency vs concurrency")
    for ax in (ax1, ax2):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    return _save(fig, path)


def crosscheck(run: Run, checks: list[CrossCheck], path: Path) -> Path | None:
    checks = [c for c in checks if c.available and c.components_mean_s]
    if not checks:
        return None
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.9 * len(checks)))
    names = [run.engines[c.instance].title for c in checks]
    for k, comp in enumerate(COMPONENTS):
        widths = [c.components_mean_s.get(comp, 0.0) for c in checks]
        if not any(widths):
            continue
        lefts = [sum(c.components_mean_s.get(x, 0.0) for x in COMPONENTS[:k]) for c in checks]
        ax.barh(names, widths, left=lefts, color=COLORS[k % len(COLORS)], label=comp)
    ax.scatter(
        [c.client_e2e_mean_s for c in checks],
        names,
        marker="|",
        s=400,
        color="black",
        label="client E2E (mean)",
        zorder=3,
    )
    ax.set_xlabel("seconds per request (mean)")
    ax.set_title("Where each request's time went: engine-side timings vs the client's E2E")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def compare(deltas: list[Delta], path: Path, what: str = "") -> Path | None:
    rows = [d for d in deltas if d.delta is not None and d.median_baseline]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.8 + 0.32 * len(rows)))
    # Run ids are in the table next to the plot; the instance names are enough to tell rows apart.
    labels = [
        f"{d.current.rsplit('/', 1)[-1]} vs {d.baseline.rsplit('/', 1)[-1]}, {d.scenario}: "
        f"{latency.METRIC_TITLES.get(d.metric, d.metric)}"
        for d in rows
    ]
    pct = [100 * d.delta / d.median_baseline for d in rows]
    # An interval from a subsample may not hold the exact delta: draw what it holds on each side, never less than 0.
    lo = [max(0.0, 100 * (d.delta - d.ci_low) / d.median_baseline) for d in rows]
    hi = [max(0.0, 100 * (d.ci_high - d.delta) / d.median_baseline) for d in rows]
    colors = [COLORS[3] if d.excludes_zero else COLORS[7] for d in rows]
    ax.errorbar(pct, range(len(rows)), xerr=[lo, hi], fmt="none", ecolor="gray", capsize=3)
    ax.scatter(pct, range(len(rows)), c=colors, zorder=3, label="median delta (red: CI excludes 0)")
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.set_xlabel("change of the median vs baseline (%), bars: 95% bootstrap CI")
    ax.set_title(f"Comparison{': ' + what if what else ''}: per-metric median deltas")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def turns(run: Run, report: WorkloadReport, path: Path) -> Path | None:
    """TTFT (median) and prefix-cache reuse by conversation turn, one line per engine and scenario."""
    groups: dict[tuple[str, str], list] = {}
    for row in report.turns:
        groups.setdefault((row.instance, row.scenario), []).append(row)
    if not groups:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for k, ((instance, scenario), rows) in enumerate(groups.items()):
        label = f"{run.engines[instance].title if instance in run.engines else instance} {scenario}"
        color = COLORS[k % len(COLORS)]
        xs = [r.turn for r in rows]
        left.plot(xs, [(r.ttft["p50"] or math.nan) * 1000 for r in rows], marker="o", color=color, label=label)
        for attr, style in (("reuse_per_request", "-"), ("reuse_server", "--")):
            ys = [getattr(r, attr) for r in rows]
            if any(y is not None for y in ys):
                source = "per request" if attr == "reuse_per_request" else "server"
                right.plot(
                    xs,
                    [math.nan if y is None else y for y in ys],
                    style,
                    marker="o",
                    color=color,
                    label=f"{label} ({source})",
                )
    left.set_xlabel("turn")
    left.set_ylabel("TTFT p50 (ms)")
    left.set_title("TTFT by turn")
    right.set_xlabel("turn")
    right.set_ylabel("cached / prompt tokens")
    right.set_ylim(0, 1.05)
    right.set_title("Prefix-cache reuse by turn")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return _save(fig, path)
