"""Prompt sets: the shipped data files (seed4, seed3, mixed), synthetic prompts of a target length, a user's txt/JSONL file.

The workload kinds (conversation, shared-prefix, dataset, trace) are prompt sets too: `load` hands
their specs to loadgen/workloads/.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.workloads.turns import SingleTurn

DATA_DIR = Path(__file__).resolve().parent / "prompts"
SHIPPED = ("seed4", "seed3", "mixed")
SYNTHETIC = re.compile(r"^synthetic:(\d{1,12})(?:x(\d{1,12}))?$")
# Synthetic sets are built in memory up front: bounded so a typo cannot take the machine's memory.
MAX_SYNTHETIC_TOKENS = 131_072  # longer than any context the engines here serve
MAX_SYNTHETIC_COUNT = 100_000
MAX_SYNTHETIC_WORDS = 4_000_000  # TOKENS x COUNT: about 30 MB of prompt text

# Plain words for synthetic prompts: about one token each for the usual BPE vocabularies.
_WORDS = (
    "cache block batch token model server request queue memory page table sequence prompt answer engine "
    "latency throughput slot worker thread kernel tensor layer weight vector scheduler budget limit window "
    "stream chunk metric gauge counter label scrape rule alert panel report run phase burst ramp sweep rate"
).split()


class PromptSetError(ValueError):
    """A prompt set that cannot be used: its message is one line for the terminal."""


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    max_tokens: int | None = None  # the output length this prompt asks for (a dataset's, a trace's); None: --max-tokens

    def canonical(self) -> Any:
        """What the set's hash covers: the text, and the output length when the prompt sets one."""
        return self.text if self.max_tokens is None else [self.text, self.max_tokens]


@dataclass(frozen=True)
class PromptSet:
    name: str
    prompts: tuple[Prompt, ...]

    @property
    def sha256(self) -> str:
        """Content hash: two runs used the same set exactly when this matches (ids don't count)."""
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

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> Prompt:
        return self.prompts[index % len(self.prompts)]


def load(spec: str) -> PromptSet:
    """seed4 | seed3 | mixed | synthetic:TOKENS[xCOUNT] | path/to/file.txt | path/to/file.jsonl | a workload kind

    Workload kinds (loadgen/workloads/): conversation[:NAME|FILE], shared-prefix[:P,L,S[,Q]],
    dataset[:NAME|FILE[,options]], trace[:NAME|FILE].
    """
    from loadgen import workloads

    if workloads.is_workload(spec):
        return workloads.load(spec)
    if spec.startswith("synthetic:") and not SYNTHETIC.match(spec):
        raise PromptSetError(f"prompt set {spec!r}: expected synthetic:TOKENS[xCOUNT], e.g. synthetic:256x16")
    if spec in SHIPPED:
        path = next(DATA_DIR.glob(f"{spec}.*"))
        return _from_file(path, name=spec)
    match = SYNTHETIC.match(spec)
    if match:
        return synthetic(int(match.group(1)), int(match.group(2) or 8))
    from loadgen.workloads import files

    path = files.expand(spec, "prompt set")
    if not path.is_file():
        raise PromptSetError(
            f"prompt set {spec!r}: not one of {', '.join(SHIPPED)}, synthetic:TOKENS[xCOUNT], "
            f"{', '.join(workloads.KINDS)}[:...], or a readable file"
        )
    return _from_file(path, name=path.stem)


def synthetic(tokens: int, count: int = 8, seed: int = 0) -> PromptSet:
    """COUNT prompts of about TOKENS input tokens each (deterministic, so the hash is stable)."""
    if not (1 <= tokens <= MAX_SYNTHETIC_TOKENS and 1 <= count <= MAX_SYNTHETIC_COUNT):
        raise PromptSetError(
            f"synthetic:{tokens}x{count}: TOKENS from 1 to {MAX_SYNTHETIC_TOKENS}, COUNT from 1 to {MAX_SYNTHETIC_COUNT}"
        )
    if tokens * count > MAX_SYNTHETIC_WORDS:
        raise PromptSetError(
            f"synthetic:{tokens}x{count}: at most {MAX_SYNTHETIC_WORDS} words in all (TOKENS x COUNT), "
            f"got {tokens * count}"
        )
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        # The instruction sits in front so every prompt asks for an answer of the same kind.
        text = " ".join(filter(None, ("Summarise:", filler(tokens - 1, rng))))
        prompts.append(Prompt(id=f"synthetic-{tokens}-{i + 1}", text=text))
    return PromptSet(name=f"synthetic-{tokens}x{count}", prompts=tuple(prompts))


def filler(words: int, rng: random.Random) -> str:
    """WORDS plain words drawn with `rng`: about one token each (the synthetic sets' and the workloads' text)."""
    return " ".join(rng.choice(_WORDS) for _ in range(max(0, words)))


def _from_file(path: Path, name: str) -> PromptSet:
    """A txt file (a prompt a line) or a JSONL one, streamed: lines bounded by WORKLOAD_MAX_LINE_MB, the set by
    MAX_SYNTHETIC_COUNT prompts and MAX_SYNTHETIC_WORDS words, the bounds every set held in memory has."""
    from loadgen.workloads import files

    prompts: list[Prompt] = []
    words = 0
    try:
        with open(path, encoding="utf-8") as fh:
            for lineno, line in files.lines(path, fh):
                if not line.strip():
                    continue
                if path.suffix == ".jsonl":
                    try:
                        item = files.loads(line, f"{path}:{lineno}")
                    except json.JSONDecodeError:
                        raise PromptSetError(f"{path}:{lineno}: not JSON") from None
                    if isinstance(item, str):
                        item = {"prompt": item}
                    prompt = item.get("prompt", item.get("text")) if isinstance(item, dict) else None
                    if not isinstance(prompt, str) or not prompt.strip():
                        raise PromptSetError(f'{path}:{lineno}: expected {{"id": ..., "prompt": "..."}}')
                    prompt_id = item.get("id")
                    if isinstance(prompt_id, (dict, list)):
                        prompt_id = None
                    prompts.append(Prompt(id=str(prompt_id or f"{name}-{len(prompts) + 1}"), text=prompt))
                else:
                    prompts.append(Prompt(id=f"{name}-{len(prompts) + 1}", text=line.strip()))
                words += len(prompts[-1].text.split())
                if len(prompts) > MAX_SYNTHETIC_COUNT or words > MAX_SYNTHETIC_WORDS:
                    raise PromptSetError(
                        f"prompt set {path}: more than {MAX_SYNTHETIC_COUNT} prompts or {MAX_SYNTHETIC_WORDS} words "
                        f"(line {lineno}): use a smaller file"
                    )
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptSetError(f"prompt set {path}: cannot read ({exc})") from None
    if not prompts:
        raise PromptSetError(f"prompt set {path}: no prompts in it")
    return PromptSet(name=name, prompts=tuple(prompts))
