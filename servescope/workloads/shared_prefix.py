"""`shared-prefix[:P,L,S[,Q]]`: P prefixes of L tokens x S suffixes of Q tokens each: system prompts or documents that many questions share.

Prompt k is prefix k mod P followed by its own suffix, so consecutive requests take turns over the
prefixes (what a cache with fewer slots than prefixes has to hold at once). Text is plain words,
about one token each, drawn from a generator seeded by the prefix's (and suffix's) number: the same
spec always gives the same set and the same hash. A prefix starts with its own number, so two
prefixes share nothing beyond the chat template; a perfect prefix cache reuses at most
(S - 1) / S x L / (L + Q) of the prompt words (the first request of each prefix computes it).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from servescope.workloads.base import (
    MAX_SYNTHETIC_COUNT,
    MAX_SYNTHETIC_TOKENS,
    MAX_SYNTHETIC_WORDS,
    Prompt,
    PromptSet,
    PromptSetError,
    filler,
    warmup_text,
)

DEFAULTS = (4, 256, 8, 16)  # prefixes, prefix tokens, suffixes per prefix, suffix tokens


@dataclass(frozen=True)
class SharedPrefixSet(PromptSet):
    """A shared-prefix prompt set: P prefixes each followed by S suffixes, and the reuse a perfect cache gets."""

    prefixes: int = 1
    prefix_words: int = 1
    suffixes: int = 1
    suffix_words: int = 1

    @property
    def reuse_ceiling(self) -> float:
        """The share of prompt words a perfect prefix cache reuses (chat template aside)."""
        s, length, q = self.suffixes, self.prefix_words, self.suffix_words
        return (s - 1) / s * length / (length + q)

    @property
    def asked_reuse(self) -> float:
        return self.reuse_ceiling

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "shared-prefix",
            "prefixes": self.prefixes,
            "prefix_words": self.prefix_words,
            "suffixes_per_prefix": self.suffixes,
            "suffix_words": self.suffix_words,
            "reuse_ceiling": self.reuse_ceiling,
        }

    def warmup_text(self, index: int) -> str:
        return warmup_text(index)


def load(arg: str) -> SharedPrefixSet:
    what = f"shared-prefix:{arg}"
    parts = [x.strip() for x in arg.split(",")] if arg else []
    if len(parts) not in (0, 3, 4) or not all(x.isdigit() and len(x) <= 12 for x in parts):
        raise PromptSetError(f"{what}: expected shared-prefix:PREFIXES,PREFIX_TOKENS,SUFFIXES[,SUFFIX_TOKENS]")
    p, length, s, q = (*map(int, parts), *DEFAULTS[len(parts) :]) if parts else DEFAULTS
    if not (p >= 1 and s >= 1 and p * s <= MAX_SYNTHETIC_COUNT):
        raise PromptSetError(f"{what}: PREFIXES x SUFFIXES from 1 to {MAX_SYNTHETIC_COUNT}")
    if not (1 <= length <= MAX_SYNTHETIC_TOKENS and 1 <= q <= MAX_SYNTHETIC_TOKENS):
        raise PromptSetError(f"{what}: PREFIX_TOKENS and SUFFIX_TOKENS from 1 to {MAX_SYNTHETIC_TOKENS}")
    if p * s * (length + q) > MAX_SYNTHETIC_WORDS:
        raise PromptSetError(f"{what}: at most {MAX_SYNTHETIC_WORDS} words in all, got {p * s * (length + q)}")
    heads = [_words(f"Document-{i + 1}:", length, f"prefix-{i}") for i in range(p)]
    prompts = tuple(
        Prompt(
            f"prefix{i + 1}-q{j + 1}",
            heads[i] + "\n\n" + _words(f"Question-{j + 1}:", q, f"suffix-{i}-{j}"),
        )
        for j in range(s)
        for i in range(p)
    )
    return SharedPrefixSet(
        name=f"shared-prefix-{p}x{length}-{s}x{q}",
        prompts=prompts,
        prefixes=p,
        prefix_words=length,
        suffixes=s,
        suffix_words=q,
    )


def _words(head: str, count: int, seed: str) -> str:
    """COUNT words: HEAD, then plain words from a generator seeded by SEED (a string seed: stable across runs)."""
    return " ".join(filter(None, (head, filler(count - 1, random.Random(seed)))))
