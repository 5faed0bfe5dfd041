"""`dataset[:NAME|FILE[,OPTION=VALUE...]]`: prompts from a ShareGPT JSON or a JSONL the user supplies, one request each.

A record is a string, {"prompt": "...", "output_tokens": N} (also "text", "max_tokens"), or a
conversation in any shape servescope/workloads/conversation.py reads (ShareGPT's included): its first
user message is the prompt and the recorded answer after it gives the output length, in words (as
`vllm bench serve` reads ShareGPT). A prompt without an output length asks for --max-tokens.
Nothing is downloaded: the file is yours (a small generated one ships as `sharegpt-like`).

Options, comma-separated after the file:
  input=MIN-MAX    keep prompts of MIN to MAX words
  output=MIN-MAX   keep prompts whose output length is MIN to MAX words (prompts without one are dropped)
  sample=N         N prompts drawn at random (reservoir sampling: a JSONL file is never held whole), in file order
  seed=S           the sampling's seed (default 0): the same seed draws the same prompts
e.g. `dataset:sharegpt.json,input=4-1024,output=1-512,sample=200,seed=7`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from servescope.workloads import conversation, files, lengths
from servescope.workloads.base import (
    MAX_SYNTHETIC_COUNT,
    MAX_SYNTHETIC_WORDS,
    Prompt,
    PromptSet,
    PromptSetError,
    warmup_text,
)

DEFAULT = "sharegpt-like"
OPTIONS = ("input", "output", "sample", "seed")


@dataclass(frozen=True)
class DatasetSet(PromptSet):
    """A prompt set read from a dataset file, with the file, options and record counts it was drawn with."""

    details: dict[str, Any] = field(default_factory=dict, compare=False)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "dataset",
            **self.details,
            "input_words": lengths.summary([lengths.words(p.text) for p in self.prompts]),
            "output_words": lengths.summary([p.max_tokens for p in self.prompts if p.max_tokens is not None]),
        }

    def warmup_text(self, index: int) -> str:
        return warmup_text(index)


def load(arg: str) -> DatasetSet:
    source, *option_texts = arg.split(",") if arg else [""]
    options = _options(arg, option_texts)
    path, name = files.resolve("dataset", source, DEFAULT)
    try:
        input_range = lengths.parse_range(options["input"], "dataset input=") if "input" in options else None
        output_range = lengths.parse_range(options["output"], "dataset output=") if "output" in options else None
    except ValueError as exc:
        raise PromptSetError(str(exc)) from None
    sample = _whole(options.get("sample"), "sample", low=1, high=MAX_SYNTHETIC_COUNT)
    rng = random.Random(_whole(options.get("seed", "0"), "seed", low=0, high=2**63))

    kept: list[tuple[int, Prompt]] = []  # (position among the kept, prompt): a reservoir when sampling
    read = seen = 0
    for where, item in files.records(path):
        read += 1
        prompt = _prompt(item, where, f"{name}-{read}")
        words = lengths.words(prompt.text)
        if input_range and not input_range[0] <= words <= input_range[1]:
            continue
        if output_range and (prompt.max_tokens is None or not output_range[0] <= prompt.max_tokens <= output_range[1]):
            continue
        seen += 1
        if sample is None:
            if seen > MAX_SYNTHETIC_COUNT:
                raise PromptSetError(f"{path}: more than {MAX_SYNTHETIC_COUNT} prompts: add sample=N")
            kept.append((seen, prompt))
        elif len(kept) < sample:
            kept.append((seen, prompt))
        else:
            slot = rng.randrange(seen)
            if slot < sample:
                kept[slot] = (seen, prompt)
    if read == 0:
        raise PromptSetError(f"{path}: no records in it (an empty dataset)")
    if not kept:
        raise PromptSetError(f"{path}: none of its {read} prompts passes the filters ({arg})")
    prompts = tuple(p for _, p in sorted(kept, key=lambda x: x[0]))
    if sum(lengths.words(p.text) for p in prompts) > MAX_SYNTHETIC_WORDS:
        raise PromptSetError(f"{path}: more than {MAX_SYNTHETIC_WORDS} words of prompts: add sample=N or input=MIN-MAX")
    details = {"file": str(path), "options": options, "records": read, "passing_filters": seen}
    return DatasetSet(name=f"dataset-{name}", prompts=prompts, details=details)


def _options(arg: str, texts: list[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for text in texts:
        key, sep, value = text.partition("=")
        key = key.strip()
        if not sep or key not in OPTIONS or key in options:
            raise PromptSetError(
                f"dataset:{arg}: expected FILE then comma-separated {', '.join(o + '=...' for o in OPTIONS)}, "
                f"each once; got {text!r}"
            )
        options[key] = value.strip()
    return options


def _whole(text: str | None, what: str, low: int, high: int) -> int | None:
    if text is None:
        return None
    if not text.isdigit() or not low <= int(text) <= high:
        raise PromptSetError(f"dataset {what}=: expected a whole number from {low} to {high}, got {text!r}")
    return int(text)


def _prompt(item: Any, where: str, default_id: str) -> Prompt:
    if isinstance(item, str):
        item = {"prompt": item}
    if not isinstance(item, dict):
        raise PromptSetError(f'{where}: expected a string, {{"prompt": "..."}} or a conversation')
    if any(key in item for key in ("messages", "conversations", "turns")):
        first = conversation.parse(item, where, default_id).turns[0]
        return Prompt(str(item.get("id") or default_id), first.text, first.max_tokens)
    text = item.get("prompt", item.get("text"))
    if not isinstance(text, str) or not text.strip():
        raise PromptSetError(f'{where}: expected {{"prompt": "..."}} with some text')
    length = item.get("output_tokens", item.get("max_tokens"))
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= 10**6):
        raise PromptSetError(f"{where}: output_tokens must be a whole number from 1 to 1000000, got {length!r}")
    return Prompt(str(item.get("id") or default_id), text, length)
