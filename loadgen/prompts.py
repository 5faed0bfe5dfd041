"""Prompt sets: the shipped data files (seed4, seed3, mixed), synthetic prompts of a target length, a user's txt/JSONL file."""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True)
class PromptSet:
    name: str
    prompts: tuple[Prompt, ...]

    @property
    def sha256(self) -> str:
        """Content hash: two runs used the same set exactly when this matches (ids don't count)."""
        canonical = json.dumps([p.text for p in self.prompts], ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> Prompt:
        return self.prompts[index % len(self.prompts)]


def load(spec: str) -> PromptSet:
    """seed4 | seed3 | mixed | synthetic:TOKENS[xCOUNT] | path/to/file.txt | path/to/file.jsonl"""
    if spec.startswith("synthetic:") and not SYNTHETIC.match(spec):
        raise PromptSetError(f"prompt set {spec!r}: expected synthetic:TOKENS[xCOUNT], e.g. synthetic:256x16")
    if spec in SHIPPED:
        path = next(DATA_DIR.glob(f"{spec}.*"))
        return _from_file(path, name=spec)
    match = SYNTHETIC.match(spec)
    if match:
        return synthetic(int(match.group(1)), int(match.group(2) or 8))
    path = Path(spec).expanduser()
    if not path.is_file():
        raise PromptSetError(
            f"prompt set {spec!r}: not one of {', '.join(SHIPPED)}, synthetic:TOKENS[xCOUNT], or a readable file"
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
        words = ["Summarise:"] + [rng.choice(_WORDS) for _ in range(max(0, tokens - 1))]
        prompts.append(Prompt(id=f"synthetic-{tokens}-{i + 1}", text=" ".join(words)))
    return PromptSet(name=f"synthetic-{tokens}x{count}", prompts=tuple(prompts))


def _from_file(path: Path, name: str) -> PromptSet:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptSetError(f"prompt set {path}: cannot read ({exc})") from None
    prompts: list[Prompt] = []
    if path.suffix == ".jsonl":
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                raise PromptSetError(f"{path}:{lineno}: not JSON") from None
            if isinstance(item, str):
                item = {"prompt": item}
            prompt = item.get("prompt", item.get("text")) if isinstance(item, dict) else None
            if not isinstance(prompt, str) or not prompt.strip():
                raise PromptSetError(f'{path}:{lineno}: expected {{"id": ..., "prompt": "..."}}')
            prompts.append(Prompt(id=str(item.get("id") or f"{name}-{len(prompts) + 1}"), text=prompt))
    else:
        for line in text.splitlines():
            if line.strip():
                prompts.append(Prompt(id=f"{name}-{len(prompts) + 1}", text=line.strip()))
    if not prompts:
        raise PromptSetError(f"prompt set {path}: no prompts in it")
    return PromptSet(name=name, prompts=tuple(prompts))
