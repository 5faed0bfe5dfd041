"""Prefix-cache reuse of one load phase: the share of its prompt tokens the engine took from its cache, by the engine's counters and by the requests' own counts.

Two sources, as the engines give them: the counters every sample carries (servescope_prompt_tokens_cached_total
over servescope_prompt_tokens_total, the engine's whole traffic between the phase's first and last sample) and
each request's `cached_tokens` (llama.cpp's timings.cache_n; vLLM's usage.prompt_tokens_details when it is
started with --enable-prompt-tokens-details). A load that was not meant to repeat (a fresh prompt per request)
but shows reuse above thresholds.PREFIX_REUSE_UNASKED measured the cache: `unasked` says so, the one rule the
knee, the sweep's summary and the report apply.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from servescope.contracts import series, thresholds
from servescope.contracts.runfolder import RequestRecord, SampleRecord


@dataclass(frozen=True)
class Reuse:
    """One phase's prefix-cache reuse: the engine counters' share, the requests' own share, and how many said."""

    server: float | None  # cached / prompt tokens by the engine's counters over the phase; None: not reported
    prompt_tokens: float | None  # the counters' prompt tokens over the phase
    per_request: float | None  # the requests' own cached / prompt tokens; None: no request said
    reporting: int  # requests that said
    requests: int = 0  # requests of the phase (what the counters' cached tokens are shared among)

    @property
    def cached_per_request(self) -> float | None:
        """Prompt tokens taken from the cache per request, by the counters (else the requests' own shares)."""
        if self.server is not None and self.prompt_tokens and self.requests:
            return self.server * self.prompt_tokens / self.requests
        return None

    @property
    def share(self) -> float | None:
        """The engine's counters where it has them (every request, the warm-up excluded), else the requests'."""
        return self.server if self.server is not None else self.per_request

    def text(self) -> str:
        if self.share is None:
            return "prefix-cache reuse not reported"
        source = "engine counters" if self.server is not None else f"{self.reporting} requests' own counts"
        return f"{self.share:.0%} of prompt tokens from the prefix cache ({source})"


def of_phase(samples: Iterable[SampleRecord], records: Iterable[RequestRecord]) -> Reuse:
    prompt, cached = _counter_deltas(samples)
    server = cached / prompt if prompt else None
    records = list(records)
    per_request, reporting = from_records(records)
    return Reuse(server, prompt, per_request, reporting, len(records))


def from_records(records: Iterable[RequestRecord]) -> tuple[float | None, int]:
    """(cached / prompt tokens over the requests that said both, how many said)."""
    both = [r for r in records if r.ok and r.cached_tokens is not None and r.prompt_tokens]
    prompt = sum(r.prompt_tokens for r in both)
    return (sum(r.cached_tokens for r in both) / prompt if prompt else None), len(both)


def _counter_deltas(samples: Iterable[SampleRecord]) -> tuple[float | None, float | None]:
    """The prompt and cached token counters' growth from the first to the last sample that has both."""
    both = [
        s
        for s in samples
        if not s.missing and series.PROMPT_TOKENS in s.values and series.PROMPT_CACHED_TOKENS in s.values
    ]
    if len(both) < 2:
        return None, None
    first, last = min(both, key=lambda s: s.t), max(both, key=lambda s: s.t)
    prompt = last.values[series.PROMPT_TOKENS] - first.values[series.PROMPT_TOKENS]
    cached = last.values[series.PROMPT_CACHED_TOKENS] - first.values[series.PROMPT_CACHED_TOKENS]
    if prompt < 0 or cached < 0:  # the engine restarted inside the phase: its counters began again
        return None, None
    return prompt, cached


def unasked(reuse: Reuse, asked: float = 0.0) -> bool:
    """More reuse than the workload asked for (a fresh set asks none; shared prefixes their ceiling), beyond what
    every chat request shares anyway: its chat template (at most thresholds.TEMPLATE_TOKENS a request, so short
    prompts of a few words, mostly template, are not flagged for it)."""
    share = reuse.share
    if share is None or share <= max(thresholds.PREFIX_REUSE_UNASKED, asked):
        return False
    per_request = reuse.cached_per_request
    return per_request is None or per_request > thresholds.TEMPLATE_TOKENS


def warning(reuse: Reuse, asked: float, prompt_set: str) -> str | None:
    """The one line to show when a phase measured the cache rather than the engine."""
    if not unasked(reuse, asked):
        return None
    return (
        f"{reuse.text()}, more than {prompt_set} asks for ({max(thresholds.PREFIX_REUSE_UNASKED, asked):.0%}): "
        f"the engine served repeats from its cache, so this load's latency is the cache's (a fresh prompt per "
        f"request: --prompts synthetic:TOKENS)"
    )
