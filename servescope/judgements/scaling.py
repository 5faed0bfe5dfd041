"""The reference experiment's scaling factor: matched-set sequential wall / burst wall, refused unless both ran the same work."""

from __future__ import annotations

from servescope.contracts.runfolder import PhaseRecord

SEQUENTIAL, BURST = "sequential", "burst"


def match_sequential(burst: PhaseRecord, sequential: list[PhaseRecord]) -> tuple[PhaseRecord | None, str | None]:
    """The sequential phase that ran the burst's prompts with the burst's max_tokens, or why there is none."""
    if not sequential:
        return (
            None,
            "no sequential pass for this engine: no scaling factor (the reference experiment's matched-set rule)",
        )
    same_set = [p for p in sequential if p.prompt_set_sha256 == burst.prompt_set_sha256]
    if not same_set:
        seen = ", ".join(
            sorted({f"{p.prompt_set or '?'} ({p.prompt_set_sha256[:12] or 'no hash'})" for p in sequential})
        )
        return None, (
            f"refused: the burst ran prompt set {burst.prompt_set or '?'} ({burst.prompt_set_sha256[:12] or 'no hash'}) "
            f"but the sequential pass ran {seen}; the reference experiment's matched-set rule needs the same prompts"
        )
    same_len = [p for p in same_set if p.max_tokens == burst.max_tokens]
    if not same_len:
        seen = ", ".join(str(m) for m in sorted({p.max_tokens for p in same_set}))
        return None, (
            f"refused: max_tokens differ (sequential {seen}, burst {burst.max_tokens}); "
            f"the reference experiment's matched-set rule needs the same generation length"
        )
    # Repeated trials: the sequential pass of the burst's own repetition (interleaved next to it), else the nearest.
    return min(same_len, key=lambda p: (p.repetition != burst.repetition, abs(p.started_at - burst.started_at))), None


def scaling_factor(
    burst: PhaseRecord, phases: list[PhaseRecord]
) -> tuple[float | None, PhaseRecord | None, str | None]:
    """(factor, the matched sequential phase, why refused) for one burst among its engine's phases."""
    partner, why = match_sequential(burst, [p for p in phases if p.scenario == SEQUENTIAL])
    if partner is None:
        return None, None, why
    if burst.wall_s <= 0:
        return None, partner, "refused: the burst has no wall time (no request finished)"
    return partner.wall_s / burst.wall_s, partner, None
