"""What every prompt set is made of (prompts, the set, its errors, the text synthetic prompts are drawn from): the
bottom the workload kinds and servescope/workloads/prompts.py's dispatcher both stand on."""

from __future__ import annotations

import functools
import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servescope.workloads.turns import SingleTurn

# The sets shipped beside this package (servescope/workloads/prompts/, the wheel's package data).
DATA_DIR = Path(__file__).resolve().parent / "prompts"
# Synthetic sets are built in memory up front: bounded so a typo cannot take the machine's memory.
MAX_SYNTHETIC_TOKENS = 131_072  # longer than any context the engines here serve
MAX_SYNTHETIC_COUNT = 100_000
MAX_SYNTHETIC_WORDS = 4_000_000  # TOKENS x COUNT: about 30 MB of prompt text

# Plain words for synthetic prompts: about one token each for the usual BPE vocabularies.
WORDS = (
    "cache block batch token model server request queue memory page table sequence prompt answer engine "
    "latency throughput slot worker thread kernel tensor layer weight vector scheduler budget limit window "
    "stream chunk metric gauge counter label scrape rule alert panel report run phase burst ramp sweep rate"
).split()


class PromptSetError(ValueError):
    """A prompt set that cannot be used: its message is one line for the terminal."""


@dataclass(frozen=True)
class Prompt:
    """One prompt of a set: its id, its text, and the output length it asks for, if any."""

    id: str
    text: str
    max_tokens: int | None = None  # the output length this prompt asks for (a dataset's, a trace's); None: --max-tokens

    def canonical(self) -> Any:
        """What the set's hash covers: the text, and the output length when the prompt sets one."""
        return self.text if self.max_tokens is None else [self.text, self.max_tokens]


@dataclass(frozen=True)
class PromptSet:
    """A named set of prompts, what a phase's requests are drawn from; its hash tells two runs' sets apart."""

    name: str
    prompts: tuple[Prompt, ...]

    @functools.cached_property
    def sha256(self) -> str:
        """Content hash: two runs used the same set exactly when this matches (ids don't count). Once per set: every
        record carries it, and a set is frozen (hashing a dataset's or conversations' million words per request was
        most of a request's own CPU)."""
        canonical = json.dumps(self.canonical(), ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def canonical(self) -> Any:
        return [p.canonical() for p in self.prompts]

    def describe(self) -> dict[str, Any]:
        """What the manifest says about the set beside its prompts: its kind and, for generated sets, how it was made."""
        return {"kind": "prompts"}

    def source(self, phase) -> SingleTurn:
        """What turns one phase's work into requests (a conversation set keeps each conversation's history here)."""
        return SingleTurn()

    def warmup_text(self, index: int) -> str:
        """The warm-up's prompt: one of the set's own (a set measuring cache reuse sends one that shares nothing)."""
        return self[index].text

    # A set sends its prompts again once a phase has sent them all (a fresh set never does): the knee, a sweep or a
    # rate run then measures whatever the engine's prefix cache keeps of them.
    repeats = True
    # The share of prompt tokens a prefix cache may reuse because the workload asks for it (shared prefixes, a
    # conversation's history): reuse above it, and above thresholds.PREFIX_REUSE_UNASKED, is flagged.
    asked_reuse = 0.0
    # Its prompts' length is the engine's count, chat template included: measured per engine before the run
    # (loadgen/trials.measure_template) and passed to prompt() as `template_tokens`.
    sized_by_engine = False

    def prompt(self, index: int, key: str | None = None, template_tokens: int | None = None) -> Prompt:
        """The prompt of request `index` of the phase `key` (a fixed set: the index-th, cycling; a fresh set draws
        one for the pair). `template_tokens`: what the engine's chat template adds to every prompt, when known."""
        return self[index]

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> Prompt:
        return self.prompts[index % len(self.prompts)]


@dataclass(frozen=True)
class Conversation:
    """One conversation of a set: loaded by servescope/workloads/conversation.py, played by sessions.py."""

    id: str
    system: str | None  # a system prompt sent before the first turn
    turns: tuple[Prompt, ...]  # the user messages, in order; max_tokens: the recorded answer's length in words


def filler(words: int, rng: random.Random) -> str:
    """WORDS plain words drawn with `rng`: about one token each (the synthetic sets' and the workloads' text)."""
    return " ".join(rng.choice(WORDS) for _ in range(max(0, words)))


def warmup_text(index: int) -> str:
    """A warm-up prompt that shares nothing with a workload's prompts: it must not prime the cache the run measures."""
    return f"Warm-up request {index + 1}: reply with one short sentence."
