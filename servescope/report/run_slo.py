"""The SLOs a report judges a run by (the run's recorded ones, another asked for, else the knobs'), and the gap limits
the run reader counts for them while it reads: what a run's terminal summary needs of the report before its table."""

from __future__ import annotations

from typing import Any

from servescope.contracts.settings import SloKnobs
from servescope.judgements import slo


def is_flag(term: slo.Term) -> bool:
    """A percentile-of-ITL term: each request's gaps under its limit are counted as the run is read."""
    return term.metric == "itl" and term.percentile is not None


def gap_limits(spec: slo.SloSpec) -> tuple[float, ...]:
    """The ITL limits whose per-request counts the spec's percentile terms need: counted while the run is read."""
    return tuple(t.limit_s for t in spec.terms if is_flag(t))


def manifest_gap_limits(
    manifest: dict[str, Any], override: str | None = None, knob: SloKnobs | None = None
) -> tuple[float, ...]:
    """gap_limits of the spec a report of this run judges by, for the reader to count while it reads (a bad --slo:
    none; the goodput section says why)."""
    try:
        return gap_limits(spec_of_manifest(manifest, override, knob=knob))
    except slo.SloError:
        return ()


def spec_of_manifest(
    manifest: dict[str, Any], override: str | None = None, strict: bool = False, knob: SloKnobs | None = None
) -> slo.SloSpec:
    """The spec asked for, else the one the run recorded, else the knobs' (`knob`, as the report's entry read them;
    servescope/judgements/slo.resolve). The run folder's SLO record enters the report here.

    A manifest is the run's word, not the user's: one whose SLO cannot be read costs the run its own
    SLO (the knobs' is used), never the report; a bad --slo given here is the user's, and said so.
    strict (a gate: `report check`): a recorded SLO that cannot be read is an SloError naming it, never the knobs'
    in its place (a run recorded with `banana` passed every gate judged by another SLO).
    """
    flags = manifest.get("flags")
    flags = flags if isinstance(flags, dict) else {}
    text, share = flags.get("slo"), flags.get("slo_attainment")
    text = text if isinstance(text, str) and text.strip() else None
    share = share if isinstance(share, (int, float, str)) and not isinstance(share, bool) and share != "" else None
    if override:
        return slo.resolve(override, share, knob)
    try:
        return slo.resolve(text, share, knob)
    except slo.SloError as exc:
        if strict:
            raise slo.SloError(f"the SLO its manifest records ({_shown(text)}) cannot be read: {exc}") from None
        return slo.resolve(knob=knob)


def _shown(text: Any) -> str:
    """A manifest's value in one short line: its repr, cut."""
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."
