"""The table a headless run ends with, read back as the report reads it: the seed's table (medians, CIs, noise flags)
for its sequential and burst phases, one line per phase for the others (ramp steps, sweep levels, rate phases)."""

from __future__ import annotations

from typing import TextIO

from report import load as report_load
from report import table as report_table
from servescope import hostnoise
from servescope.runfolder import RunFolder


def print_summary(folder: RunFolder, out: TextIO) -> None:
    """One source with `report --table-only`: the same reader, the same table, the same refusals."""
    from report import goodput  # the report's SLO limits: the run's index, made by this first reading, counts them

    try:
        run = report_load.load(folder.path, goodput.manifest_gap_limits)
    except report_load.RunError:
        return
    others = [p for p in run.phases if not (report_table.is_sequential(p) or report_table.is_burst(p))]
    if others:
        print(
            f"\n{'engine':<16} {'phase':<18} {'reqs':>4} {'ok':>3} {'wall s':>8} {'tokens':>6} {'tok/s':>7} "
            f"{'TTFT p50 s':>10}  host",
            file=out,
        )
    for p in others:
        # Counted by the engine: a soak's rate phase is a million records, never Python objects here.
        requests, ok, tokens, ttft = run.con.execute(
            "SELECT count(*), count(*) FILTER (ok), coalesce(sum(output_tokens) FILTER (ok), 0), "
            "median(ttft_s) FILTER (ok) FROM requests WHERE instance = ? AND phase = ?",
            [p.instance, p.phase],
        ).fetchone()
        noisy = "; ".join(hostnoise.flags(p.noise, p.instance)) or ("ok" if p.noise else "-")
        print(
            f"{p.instance:<16} {p.phase:<18} {requests:>4} {ok:>3} {p.wall_s:>8.3f} {tokens:>6} "
            f"{tokens / p.wall_s if p.wall_s > 0 else 0:>7.1f} {'-' if ttft is None else f'{ttft:.3f}':>10}  {noisy}",
            file=out,
        )
    print(file=out)
    out.write(report_table.render_text(report_table.build(run), run.run_id))
    print("", file=out, flush=True)
