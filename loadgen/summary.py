"""The table a headless run ends with, read back from its run folder as the report reads it.

The reference page's table (medians, CIs, noise flags) for the run's sequential and burst phases, one line per
phase for the others (ramp steps, sweep levels, rate phases).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TextIO

from servescope.contracts.runfolder import RunFolder, read_samples
from servescope.host import hostnoise
from servescope.judgements import prefix_reuse
from servescope.report import load as report_load
from servescope.report import run_slo
from servescope.report import table as report_table


def print_summary(folder: RunFolder, out: TextIO) -> None:
    """One source with `report --table-only`: the same reader, the same table, the same refusals."""
    try:  # the report's SLO gap limits: a run's index, made by this first reading, counts them for the report
        run = report_load.load(folder.path, run_slo.manifest_gap_limits)
    except report_load.RunError:
        return
    others = [p for p in run.phases if not (report_table.is_sequential(p) or report_table.is_burst(p))]
    samples: dict[tuple[str, str | None], list] = defaultdict(list)
    if others:
        print(
            f"\n{'engine':<16} {'phase':<18} {'reqs':>4} {'ok':>3} {'wall s':>8} {'tokens':>6} {'tok/s':>7} "
            f"{'TTFT p50 s':>10} {'cached':>6}  host",
            file=out,
        )
        for sample in read_samples(folder):  # a few reads a second: small beside the requests
            samples[(sample.instance, sample.phase)].append(sample)
    sets = run.manifest.get("prompt_sets") if isinstance(run.manifest.get("prompt_sets"), dict) else {}
    warnings = []
    for p in others:
        # Counted by the engine: a soak's rate phase is a million records, never Python objects here.
        requests, ok, tokens, ttft, cached, prompt, said = run.con.execute(
            "SELECT count(*), count(*) FILTER (ok), coalesce(sum(output_tokens) FILTER (ok), 0), "
            "median(ttft_s) FILTER (ok), sum(cached_tokens) FILTER (ok AND prompt_tokens > 0), "
            "sum(prompt_tokens) FILTER (ok AND cached_tokens IS NOT NULL AND prompt_tokens > 0), "
            "count(*) FILTER (ok AND cached_tokens IS NOT NULL AND prompt_tokens > 0) "
            "FROM requests WHERE instance = ? AND phase = ?",
            [p.instance, p.phase],
        ).fetchone()
        # Within the phase's own window: engines run one after another under the same phase names, and the reads
        # taken while another engine ran this phase would count this one's warm-up.
        window = [s for s in samples.get((p.instance, p.phase), []) if p.started_at - 0.5 <= s.t <= p.ended_at + 0.5]
        server = prefix_reuse.of_phase(window, [])
        reuse = prefix_reuse.Reuse(
            server.server, server.prompt_tokens, cached / prompt if prompt else None, said, requests
        )
        entry = sets.get(p.prompt_set) if isinstance(sets.get(p.prompt_set), dict) else {}
        asked = entry.get("asked_reuse") if isinstance(entry.get("asked_reuse"), int | float) else 0.0
        warning = prefix_reuse.warning(reuse, asked, p.prompt_set)
        if warning:
            warnings.append(f"{p.instance} {p.phase}: {warning}")
        share = "-" if reuse.share is None else f"{reuse.share:.0%}" + ("!" if warning else "")
        noisy = "; ".join(hostnoise.flags(p.noise, p.instance)) or ("ok" if p.noise else "-")
        print(
            f"{p.instance:<16} {p.phase:<18} {requests:>4} {ok:>3} {p.wall_s:>8.3f} {tokens:>6} "
            f"{tokens / p.wall_s if p.wall_s > 0 else 0:>7.1f} {'-' if ttft is None else f'{ttft:.3f}':>10} "
            f"{share:>6}  {noisy}",
            file=out,
        )
    for line in warnings:
        print(f"warning: {line}", file=out)
    repeated = {p.prompt_set for p in others if (sets.get(p.prompt_set) or {}).get("repeats")}
    for name in sorted(repeated - {p.prompt_set for p in others if (sets.get(p.prompt_set) or {}).get("asked_reuse")}):
        print(
            f"note: {name} is a fixed set, sent again in every phase: a prefix-caching engine may serve repeats from "
            f"its cache ('cached'; --prompts synthetic:TOKENS sends a fresh prompt per request)",
            file=out,
        )
    rows = report_table.build(run)
    if rows or not others:  # a knee or a sweep has no sequential-vs-burst table: nothing to say of it
        print(file=out)
        out.write(report_table.render_text(rows, run.run_id))
    print("", file=out, flush=True)
