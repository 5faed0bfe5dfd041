"""Prompt sets: the shipped data files (sequential4, burst3, mixed), synthetic prompts of a target length, a user's txt/JSONL file.

`synthetic:TOKENS` draws a fresh prompt for every request (FreshPromptSet): a load that sends the
same few prompts again measures the engine's prefix cache, not the engine (its prompts are served from the
cache at every load after the first, so the knee reads higher than on fresh prompts). `synthetic:TOKENSxCOUNT`
is COUNT prompts sent again and again, as the shipped sets are; such a set says that it repeats.

The workload kinds (conversation, shared-prefix, dataset, trace) are prompt sets too: `load` hands
their specs to servescope/workloads/.
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servescope.workloads.base import (
    DATA_DIR,
    MAX_SYNTHETIC_COUNT,
    MAX_SYNTHETIC_TOKENS,
    MAX_SYNTHETIC_WORDS,
    WORDS,
    Prompt,
    PromptSet,
    PromptSetError,
    filler,
)

SHIPPED = ("sequential4", "burst3", "mixed")
# The shipped sets' first names, from the reference page (the project's seed): still loaded, and recorded under the
# new name. Old run folders keep the old name; the matched-set rule compares content hashes, which the rename kept.
RENAMED = {"seed4": "sequential4", "seed3": "burst3"}
SYNTHETIC = re.compile(r"^synthetic:(\d{1,12})(?:x(\d{1,12}))?(?:,seed=(\d{1,12}))?$")
SYNTHETIC_HELP = "synthetic:TOKENS[xCOUNT][,seed=S] (no COUNT: a fresh prompt per request)"
# The fresh set's text generator: bump it when the words it draws change, so two runs' hashes say whether they
# sent the same prompts.
FRESH_GENERATOR = 1


def load(spec: str) -> PromptSet:
    """sequential4 | burst3 | mixed | synthetic:TOKENS[xCOUNT] | path/to/file.txt | path/to/file.jsonl | a workload kind

    Workload kinds (servescope/workloads/): conversation[:NAME|FILE], shared-prefix[:P,L,S[,Q]],
    dataset[:NAME|FILE[,options]], trace[:NAME|FILE].
    """
    from servescope import workloads

    if workloads.is_workload(spec):
        return workloads.load(spec)
    if spec.startswith("synthetic:") and not SYNTHETIC.match(spec):
        raise PromptSetError(f"prompt set {spec!r}: expected {SYNTHETIC_HELP}, e.g. synthetic:256")
    spec = RENAMED.get(spec, spec)
    if spec in SHIPPED:
        path = next(DATA_DIR.glob(f"{spec}.*"))
        return _from_file(path, name=spec)
    match = SYNTHETIC.match(spec)
    if match:
        seed = int(match.group(3) or 0)
        if match.group(2) is None:
            return fresh(int(match.group(1)), seed)
        return synthetic(int(match.group(1)), int(match.group(2)), seed)
    from servescope.workloads import files

    path = files.expand(spec, "prompt set")
    if not path.is_file():
        raise PromptSetError(
            f"prompt set {spec!r}: not one of {', '.join(SHIPPED)}, {SYNTHETIC_HELP}, "
            f"{', '.join(workloads.KINDS)}[:...], or a readable file"
        )
    return _from_file(path, name=path.stem)


def synthetic(tokens: int, count: int = 8, seed: int = 0) -> PromptSet:
    """COUNT prompts of about TOKENS input tokens each, sent again and again (deterministic, so the hash is stable)."""
    if not (1 <= tokens <= MAX_SYNTHETIC_TOKENS and 1 <= count <= MAX_SYNTHETIC_COUNT):
        raise PromptSetError(
            f"synthetic:{tokens}x{count}: TOKENS from 1 to {MAX_SYNTHETIC_TOKENS}, COUNT from 1 to {MAX_SYNTHETIC_COUNT}"
        )
    name = f"synthetic-{tokens}x{count}" + (f"-seed{seed}" if seed else "")
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
    return PromptSet(name=name, prompts=tuple(prompts))


@dataclass(frozen=True)
class FreshPromptSet(PromptSet):
    """`synthetic:TOKENS`: a prompt no other request of the run shares, for every request.

    Request `index` of phase `key` gets words drawn by a generator seeded with (seed, key, index): the same
    run sends the same prompts again (deterministic, one hash), two requests never share more than chance
    gives (P(the first four words agree) is 1 in 5 million), and every phase of a closed or open loop draws
    its own. TOKENS counts the whole prompt as the engine counts it: once the engine's chat template is
    measured (`template_tokens`, loadgen/targets.calibrate), the words are TOKENS less the template's tokens,
    about one token each. The instruction comes last, so nothing but the chat template precedes the first
    drawn word.
    """

    tokens: int = 256
    seed: int = 0
    repeats = False
    sized_by_engine = True
    PASS = 8  # a sequential "pass" over a set that never ends: this many requests

    def __len__(self) -> int:
        return self.PASS

    def prompt(self, index: int, key: str | None = None, template_tokens: int | None = None) -> Prompt:
        words = max(1, self.tokens - len(INSTRUCTION.split()) - max(0, template_tokens or 0))
        rng = random.Random(f"fresh-{FRESH_GENERATOR}:{self.seed}:{key or ''}:{index}")
        text = f"{' '.join(rng.choices(WORDS, k=words))} {INSTRUCTION}"
        return Prompt(id=f"{self.name}:{key or '-'}:{index + 1}", text=text)

    def __getitem__(self, index: int) -> Prompt:
        return self.prompt(index)

    def warmup_text(self, index: int) -> str:
        return self.prompt(index, "warmup").text

    def canonical(self) -> Any:
        return {"generator": "fresh", "version": FRESH_GENERATOR, "tokens": self.tokens, "seed": self.seed}

    def describe(self) -> dict[str, Any]:
        return {"kind": "fresh", "tokens": self.tokens, "seed": self.seed, "repeats": False}


# The fresh set's last words: an answer of the same kind for every prompt (engines without ignore_eos stop early
# less often when they are asked to write).
INSTRUCTION = "Summarise the text above."


def for_this_run(spec: str, seed: int | None = None) -> str:
    """A fresh set without a seed gets one of this run's (written into the spec, so the manifest and any worker
    process read the same). Its prompts are drawn from (seed, phase, index): with one seed for every run, a second
    knee sends the first's prompts again and an engine that keeps its cache across runs serves them (llama.cpp's
    slots kept 256 of 257 prompt tokens; vLLM's prefix cache until it evicts). A seed given, or any other set, is
    left as asked: `synthetic:256,seed=7` repeats a run's prompts exactly."""
    m = SYNTHETIC.fullmatch(spec.strip())
    if m is None or m.group(2) is not None or m.group(3) is not None:
        return spec
    if seed is None:
        seed = time.time_ns() // 1000 % 10**12  # microseconds: two runs never share one; the spec takes 12 digits
    return f"{spec.strip()},seed={seed}"


def fresh(tokens: int, seed: int = 0) -> FreshPromptSet:
    """A fresh prompt of about TOKENS prompt tokens per request (synthetic:TOKENS)."""
    if not 1 <= tokens <= MAX_SYNTHETIC_TOKENS:
        raise PromptSetError(f"synthetic:{tokens}: TOKENS from 1 to {MAX_SYNTHETIC_TOKENS}")
    name = f"synthetic-{tokens}" + (f"-seed{seed}" if seed else "")
    return FreshPromptSet(name=name, prompts=(), tokens=tokens, seed=seed)


def source_files(spec: str) -> list[Path]:
    """The files a --prompts spec would read, resolved as its loader resolves them (a shipped set's name is its file
    in servescope/workloads/prompts/); none for generated sets (synthetic, shared-prefix). For a caller that must know where a
    spec reads from before reading it (the web UI reads only from the shipped sets and the folder it was told)."""
    from servescope import workloads
    from servescope.workloads import files

    kind, _, arg = spec.partition(":")
    if spec in SHIPPED or SYNTHETIC.match(spec) or kind == "shared-prefix":
        return []
    if workloads.is_workload(spec):
        name = arg.split(",")[0] if kind == "dataset" else arg
        if not name:
            return []  # the kind's default shipped set
        if "/" not in name and "." not in name:
            shipped = sorted(DATA_DIR.glob(f"{name}.json*"))
            if shipped:
                return [shipped[0]]
        return [files.expand(name, f"{kind}:{arg}")]
    return [files.expand(spec, "prompt set")]


def _from_file(path: Path, name: str) -> PromptSet:
    """A txt file (a prompt a line) or a JSONL one, streamed: lines bounded by WORKLOAD_MAX_LINE_MB, the set by
    MAX_SYNTHETIC_COUNT prompts and MAX_SYNTHETIC_WORDS words, the bounds every set held in memory has."""
    from servescope.workloads import files

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
