"""The table a headless run ends with: per engine and phase, requests, wall, tokens/s, TTFT; the scaling factor."""

from __future__ import annotations

import statistics
from typing import TextIO

from servescope.runfolder import RunFolder
from servescope.scaling import BURST, SEQUENTIAL, scaling_factor


def print_summary(folder: RunFolder, out: TextIO) -> None:
    """The seed's table shape from the raw records: per engine and phase, wall, tokens/s, TTFT; scaling factor."""
    requests = list(folder.requests())
    phases = list(folder.phases())
    if not phases:
        return
    print(
        f"\n{'engine':<16} {'phase':<18} {'reqs':>4} {'ok':>3} {'wall s':>8} {'tokens':>6} {'tok/s':>7} {'TTFT p50 s':>10}",
        file=out,
    )
    for p in phases:
        rs = [r for r in requests if r.instance == p.instance and r.phase == p.phase]
        ok = [r for r in rs if r.ok]
        tokens = sum(r.output_tokens or 0 for r in ok)
        ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
        ttft = f"{statistics.median(ttfts):.3f}" if ttfts else "-"
        print(
            f"{p.instance:<16} {p.phase:<18} {len(rs):>4} {len(ok):>3} {p.wall_s:>8.3f} {tokens:>6} "
            f"{tokens / p.wall_s if p.wall_s > 0 else 0:>7.1f} {ttft:>10}",
            file=out,
        )
    for burst in (p for p in phases if p.scenario == BURST):
        mine = [p for p in phases if p.instance == burst.instance]
        if not any(p.scenario == SEQUENTIAL for p in mine):
            continue  # a burst on its own: nothing to compare it with
        factor, partner, why = scaling_factor(burst, mine)
        if factor is None:
            print(f"scaling factor {burst.instance} {burst.phase}: {why}", file=out)
        else:
            print(
                f"scaling factor {burst.instance} {burst.phase}: matched-set {partner.phase} {partner.wall_s:.3f}s / "
                f"burst {burst.wall_s:.3f}s = {factor:.2f}x",
                file=out,
            )
    print("", file=out, flush=True)
