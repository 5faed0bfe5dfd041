"""The report's figures drawn from plain data (servescope/report/figures.py makes it): every plot titled, axes with units, a legend
where there are series. matplotlib, Agg backend; imported by the painter (servescope/report/painter.py), not by the report's
computing side, so its import and its drawing cost the report's reading nothing."""

from __future__ import annotations

import io
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display here, and a report must render the same everywhere

import matplotlib.pyplot as plt  # noqa: E402

from servescope.contracts import series
from servescope.contracts.runfolder import write_file

DPI = 110
COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]
PHASE_SHADES = ("#dbe9f6", "#fde5cc", "#dff0d8", "#eadcf0", "#f9dede", "#e8e8e8")


def _save(fig, path: Path, tight: bool = True) -> Path:
    """The figure as a PNG at `path`, written whole and never through a link at the name (runfolder.write_file)."""
    if tight:
        fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=DPI, format="png")
    plt.close(fig)
    return write_file(path, png.getvalue())


def sequential_burst_table(data: dict, path: Path) -> Path:
    """Wall time per engine and mode, with the scaling factor written over each burst."""
    rows = data["bars"]  # (engine title, mode, wall s, scaling factor or None)
    titles = list(dict.fromkeys(title for title, _, _, _ in rows))
    modes = list(dict.fromkeys(mode for _, mode, _, _ in rows))
    fig, ax = plt.subplots(figsize=(9, 4.2))
    width = 0.8 / max(1, len(modes))
    for m_i, mode in enumerate(modes):
        xs, hs, labels = [], [], []
        for e_i, title in enumerate(titles):
            match = [(wall, factor) for t, m, wall, factor in rows if t == title and m == mode]
            if match:
                wall, factor = match[0]
                xs.append(e_i + (m_i - (len(modes) - 1) / 2) * width)
                hs.append(wall)
                labels.append(f"{factor:.2f}x" if factor is not None else "")
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
    ax.set_title("Sequential vs burst: wall time per mode (bold: scaling factor vs matched-set sequential)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def latency_boxes(data: dict, path: Path) -> Path:
    """One panel per metric (its title, one box per engine and scenario in ms); a missing box is an empty slot."""
    labels = data["labels"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.5))
    for ax, (title, boxes) in zip(axes.flat, data["panels"], strict=True):
        positions = [k for k, box in enumerate(boxes) if box]
        if positions:
            bp = ax.bxp([boxes[k] for k in positions], positions=positions, widths=0.6, patch_artist=True)
            for k, patch in zip(positions, bp["boxes"], strict=True):
                patch.set_facecolor(COLORS[k % len(COLORS)])
                patch.set_alpha(0.6)
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylabel("milliseconds")
        ax.set_title(title + " (box p25-p75, whiskers p5-p95)", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k % len(COLORS)], alpha=0.6) for k in range(len(labels))]
    fig.legend(
        handles, [lb.replace("\n", " / ") for lb in labels], loc="lower center", ncol=min(4, len(labels)), fontsize=8
    )
    fig.suptitle("Client-side latency per engine and scenario, and per load level (successful requests)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return _save(fig, path, tight=False)


DISCRETE_LENGTHS = 12  # up to this many distinct output lengths: a bar at each length, not a histogram's bins


def output_tokens(data: dict, path: Path) -> Path:
    """Requests per output length: {engine title: (lengths, counts)}."""
    return _save(output_tokens_figure(data), path)


def output_tokens_figure(data: dict):
    """A token count is a whole number: a few distinct lengths are bars at those lengths (one length, one bar, its
    tick that length: every request gave 128 tokens reads "128", not a bin from 128.0 to 129.0); many are a histogram
    of whole-token bins. Ticks are whole numbers either way."""
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 3.6))
    lengths = sorted({v for values, _ in data.values() for v in values})
    if len(lengths) <= DISCRETE_LENGTHS:
        width = 0.8 / len(data)
        places = {v: k for k, v in enumerate(lengths)}  # evenly spaced, labelled with the lengths themselves
        for e, (title, (values, counts)) in enumerate(data.items()):
            xs = [places[v] + (e - (len(data) - 1) / 2) * width for v in values]
            bars = ax.bar(xs, counts, width=width * 0.95, label=title, alpha=0.8, color=COLORS[e % len(COLORS)])
            ax.bar_label(bars, fontsize=8)
        ax.set_xticks(range(len(lengths)), [str(v) for v in lengths])
        ax.set_xlim(-1, len(lengths))  # a lone length is a bar with room around it, not the whole plot
        if len(lengths) == 1:
            total = sum(n for _, counts in data.values() for n in counts)
            ax.set_title(f"Output length: every successful request ({total}) gave {lengths[0]} tokens")
        else:
            ax.set_title("Output length per engine (successful requests)")
    else:
        lo, hi = lengths[0], lengths[-1]
        step = max(1, math.ceil((hi - lo + 1) / 60))  # whole-token bins, at most about 60 of them
        edges = [lo - 0.5 + step * k for k in range((hi - lo) // step + 2)]
        ax.hist(
            [v for v, _ in data.values()],
            bins=edges,
            weights=[n for _, n in data.values()],
            label=list(data),
            alpha=0.8,
        )
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title("Output length per engine (successful requests)")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # requests are counted whole too
    ax.set_xlabel("output tokens per request")
    ax.set_ylabel("requests")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return fig


def gauges(data: dict, path: Path) -> Path:
    """One panel per engine (title, trace): running and waiting as steps, KV cache usage on a right axis, phases shaded."""
    return _save(gauges_figure(data), path)


def gauges_figure(data: dict):
    panels = data["panels"]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.2 * len(panels)), squeeze=False, sharex=True)
    for ax, (title, trace) in zip(axes[:, 0], panels, strict=True):
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
        ax.yaxis.get_major_locator().set_params(integer=True)  # running and waiting are counts
        counts = [v for g in (series.REQUESTS_RUNNING, series.REQUESTS_WAITING) for v in trace[g][1] if v == v]
        ax.set_ylim(0, max(1.0, max(counts, default=1.0)) * 1.15)
        xs, ys = trace[series.KV_CACHE_USAGE]
        kv = [v * 100 for v in ys]
        if any(v == v for v in kv):
            ax2 = ax.twinx()
            lines += ax2.plot(xs, kv, color=COLORS[2], linestyle="--", label="KV cache usage")
            ax2.set_ylabel("KV cache usage (%)")
            ax2.set_ylim(0, max(5.0, max(v for v in kv if v == v) * 1.2))
        ax.set_title(title, fontsize=10, pad=38)
        ax.legend(lines, [ln.get_label() for ln in lines], loc="upper right", fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since run start")
    return fig


def ttft_by_arrival(data: dict, path: Path) -> Path:
    """Mean TTFT per arrival index, one line per engine (colour index, title, arrival indexes, TTFTs)."""
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for k, title, xs, ys in data["lines"]:
        ax.plot(xs, ys, marker="o", color=COLORS[k % len(COLORS)], label=title)
    ax.set_xlabel("arrival order within the burst (1 = first released)")
    ax.set_ylabel("TTFT (s), mean over bursts")
    ax.set_title("TTFT by arrival order: flat = served together, staircase = one at a time")
    ax.legend()
    ax.grid(alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)
    return _save(fig, path)


def sweeps(data: dict, path: Path) -> Path:
    """Throughput and E2E latency against concurrency, one colour per sweep, its knee marked."""
    return _save(sweeps_figure(data), path)


def sweeps_figure(data: dict):
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for k, sw in enumerate(data["lines"]):
        color, label, cs = COLORS[k % len(COLORS)], sw["label"], sw["concurrency"]
        ax1.plot(cs, sw["tokens_per_s"], marker="o", color=color, label=label)
        ax2.plot(cs, sw["e2e_p50"], marker="o", color=color, label=f"{label} E2E p50")
        ax2.plot(cs, sw["e2e_p95"], marker="^", linestyle=":", color=color, label=f"{label} E2E p95")
        if sw["knee"] is not None:
            ax1.axvline(sw["knee"], color=color, linestyle="--", alpha=0.6, label=f"saturation knee ({label})")
    ax1.set_xlabel("concurrency (requests in flight)")
    ax1.set_ylabel("output tokens/s (aggregate)")
    ax1.set_title("Throughput vs concurrency")
    ax2.set_xlabel("concurrency (requests in flight)")
    ax2.set_ylabel("E2E latency (s)")
    ax2.set_title("Latency vs concurrency")
    for ax in (ax1, ax2):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)  # users: whole numbers
        ax.set_ylim(bottom=0)  # from zero: a 3% change must not look like a fall
    return fig


def crosscheck(data: dict, path: Path) -> Path:
    """Mean seconds per request by component, stacked per engine, against the client's mean E2E."""
    names = data["names"]
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.9 * len(names)))
    lefts = [0.0] * len(names)
    for k, (comp, widths) in enumerate(data["components"]):
        if any(widths):
            ax.barh(names, widths, left=lefts, color=COLORS[k % len(COLORS)], label=comp)
        lefts = [left + w for left, w in zip(lefts, widths, strict=True)]
    ax.scatter(
        data["client_e2e_mean_s"],
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


def compare(data: dict, path: Path) -> Path:
    """Each delta's percent change of the baseline's median with its CI; red where the CI excludes 0."""
    labels, pct = data["labels"], data["pct"]
    fig, ax = plt.subplots(figsize=(9, 0.8 + 0.32 * len(labels)))
    rows = range(len(labels))
    lo, hi = data["below"], data["above"]
    colors = [COLORS[3] if excludes else COLORS[7] for excludes in data["excludes_zero"]]
    ax.errorbar(pct, rows, xerr=[lo, hi], fmt="none", ecolor="gray", capsize=3)
    ax.scatter(pct, rows, c=colors, zorder=3, label="median delta (red: CI excludes 0)")
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(rows, labels, fontsize=7)
    ax.set_xlabel("change of the median vs baseline (%), bars: 95% bootstrap CI")
    what = data["what"]
    ax.set_title(f"Comparison{': ' + what if what else ''}: per-metric median deltas")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def turns(data: dict, path: Path) -> Path:
    """TTFT (median) and prefix-cache reuse by conversation turn, one line per engine and scenario."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for k, line in enumerate(data["lines"]):
        label, color, xs = line["label"], COLORS[k % len(COLORS)], line["turns"]
        left.plot(xs, [math.nan if v is None else v for v in line["ttft_p50_ms"]], marker="o", color=color, label=label)
        for source, style in (("per request", "-"), ("server", "--")):
            ys = line["reuse"][source]
            if any(y is not None for y in ys):
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


def tune(data: dict, path: Path) -> Path:
    """A `make tune` trajectory: knee per step, and goodput at the judged load (solid: kept, hollow: reverted; bars:
    the change's 95% CI drawn from the old setting's goodput)."""
    steps = data["steps"]
    fig, (ax_knee, ax_good) = plt.subplots(1, 2, figsize=(10, 3.8))
    xs = [s["step"] for s in steps]
    ax_knee.plot(xs, [math.nan if s["knee"] is None else s["knee"] for s in steps], marker="o")
    ax_knee.set_title("Knee: highest load meeting the SLOs")
    ax_knee.set_xlabel("step")
    ax_knee.set_ylabel("load (users or req/s)")
    for s in steps:
        y = s["goodput_rps"]
        if y is None:
            continue
        ax_good.plot([s["step"]], [y], marker="o", color="C1", fillstyle="full" if s["kept"] else "none")
        ax_good.annotate(s["label"], (s["step"], y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        if s["ci"] is not None:
            ax_good.vlines(s["step"], *s["ci"], color="C1", alpha=0.5)
    ax_good.set_title("Goodput at the judged load (bars: 95% CI of the change)")
    ax_good.set_xlabel("step")
    ax_good.set_ylabel("good requests/s")
    for ax in (ax_knee, ax_good):
        ax.set_xticks(xs)
    return _save(fig, path)
