"""Writes the small generated workload sets shipped in servescope/workloads/prompts/ and the README table of their lengths: `python -m servescope.workloads.generate [--check]`.

Deterministic (seeded): the files in git are exactly what this writes, and `--check` (run by the
tests) fails when they are stale. Text is built from a few sentence templates about serving LLMs
and plain words: it reads like a question, is about one token a word, and shares nothing between
two conversations beyond the system prompt.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

from servescope.workloads.base import DATA_DIR

README = DATA_DIR / "README.md"
BEGIN, END = "<!-- begin generated: python -m servescope.workloads.generate -->", "<!-- end generated -->"

SYSTEM = "You are a concise assistant for a team that runs LLM serving engines. Answer plainly."
_ENGINES = ("vLLM", "llama.cpp", "Ollama", "the CPU server", "the staging engine")
_METRICS = ("time to first token", "inter-token latency", "queue length", "KV cache usage", "tokens per second")
_CHANGES = ("raised max-num-seqs", "lowered the context length", "doubled the slots", "turned on prefix caching")
_NOTES = (
    "{engine} served {n} requests in a burst and the {metric} stayed near {v} milliseconds.",
    "After we {change} on {engine}, the {metric} moved from {v} to {w}.",
    "The dashboard showed {n} requests waiting while {metric} was flat for {v} seconds.",
    "{engine} restarted once during the run and the first request after it took {w} milliseconds.",
    "With {n} users the {metric} doubled, but with half of them it was steady.",
)
_FOLLOW_UPS = (
    "Which of these matters most for latency?",
    "Expand on the second point.",
    "What should we change first, and why?",
    "Is the queue or the cache the real limit here?",
    "How would you test that change safely?",
    "Explain that to someone new to the team.",
    "What would you measure next?",
    "Could this be noise rather than a real effect?",
)


def _sentence(rng: random.Random) -> str:
    return rng.choice(_NOTES).format(
        engine=rng.choice(_ENGINES),
        metric=rng.choice(_METRICS),
        change=rng.choice(_CHANGES),
        n=rng.randint(2, 64),
        v=rng.randint(5, 900),
        w=rng.randint(5, 900),
    )


def _notes(rng: random.Random, words: int) -> str:
    out: list[str] = []
    while sum(len(s.split()) for s in out) < words:
        out.append(_sentence(rng))
    return " ".join(out)


def _lognormal(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return max(low, min(high, round(rng.lognormvariate(math.log(median), sigma))))


def chat4() -> list[dict]:
    """8 conversations x 4 turns: a long first message (notes to summarise), then short follow-ups."""
    rng = random.Random("chat4")
    conversations = []
    for c in range(8):
        opener = (
            f"Here are my notes from load test {c + 1}. {_notes(rng, rng.randint(260, 300))} "
            f"Summarise them in three short points."
        )
        turns = [opener]
        for question in rng.sample(_FOLLOW_UPS, 3):
            context = _notes(rng, rng.randint(0, 24)) if rng.random() < 0.5 else ""
            turns.append(f"{context} {question}".strip())
        conversations.append(
            {"id": f"chat4-{c + 1}", "messages": [{"role": "system", "content": SYSTEM}] + _users(turns)}
        )
    return conversations


def _users(turns: list[str]) -> list[dict]:
    return [{"role": "user", "content": t} for t in turns]


def sharegpt_like() -> list[dict]:
    """64 ShareGPT-format conversations of 1 to 3 exchanges, prompt and answer lengths long-tailed (lognormal)."""
    rng = random.Random("sharegpt-like")
    out = []
    for c in range(64):
        exchanges = rng.choice((1, 1, 1, 2, 2, 3))
        messages = []
        for _ in range(exchanges):
            asked = _lognormal(rng, 40, 0.9, 4, 600)
            answered = _lognormal(rng, 80, 0.7, 8, 400)
            question = rng.choice(_FOLLOW_UPS)
            messages.append({"from": "human", "value": f"{_notes(rng, asked - len(question.split()))} {question}"})
            messages.append({"from": "gpt", "value": _notes(rng, answered)})
        out.append({"id": f"sharegpt-like-{c + 1}", "conversations": messages})
    return out


def trace_small() -> list[dict]:
    """About 60 s of arrivals: Poisson at 1/s, a burst of 10 at 30 s, 5 conversations of 2-3 turns among them."""
    rng = random.Random("trace-small")
    times: list[float] = []
    t = 0.0
    while t < 60.0:
        times.append(round(t, 3))
        t += rng.expovariate(1.0)
    times += [round(30.0 + 0.05 * k, 3) for k in range(10)]
    rows = [
        {
            "offset_s": at,
            "input_tokens": _lognormal(rng, 64, 0.8, 8, 512),
            "output_tokens": _lognormal(rng, 32, 0.6, 4, 128),
        }
        for at in sorted(times)
    ]
    for c in range(5):
        start = rng.uniform(0, 40)
        at = start
        for _ in range(rng.choice((2, 3))):
            rows.append(
                {
                    "offset_s": round(at, 3),
                    "input_tokens": _lognormal(rng, 24, 0.5, 4, 96),
                    "output_tokens": _lognormal(rng, 32, 0.6, 4, 128),
                    "conversation_id": f"conversation-{c + 1}",
                }
            )
            at += rng.uniform(3.0, 8.0)
    return sorted(rows, key=lambda r: r["offset_s"])


def files() -> dict[Path, str]:
    """Every shipped file's path and text."""
    jsonl = lambda items: "".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items)  # noqa: E731
    return {
        DATA_DIR / "chat4.jsonl": jsonl(chat4()),
        DATA_DIR / "sharegpt-like.json": json.dumps(sharegpt_like(), indent=1, ensure_ascii=False) + "\n",
        DATA_DIR / "trace-small.jsonl": jsonl(trace_small()),
    }


def readme_table() -> str:
    """The README's generated part: each shipped workload's length distribution, as its loader reads it."""
    from servescope.workloads import prompts

    def cell(summary: dict) -> str:
        return f"{summary['min']} / {summary['p50']} / {summary['p90']} / {summary['max']} (mean {summary['mean']})"

    chat = prompts.load("conversation:chat4").describe()
    data = prompts.load("dataset:sharegpt-like").describe()
    trace = prompts.load("trace:trace-small").describe()
    shared = prompts.load("shared-prefix").describe()
    rows = [
        "| spec | what | lengths, in words (min / median / p90 / max) |",
        "|---|---|---|",
        f"| `conversation:chat4` (`chat4.jsonl`) | {chat['conversations']} conversations x "
        f"{chat['turns_per_conversation']['p50']:g} turns, one system prompt shared by all; turn 1 is notes to "
        f"summarise, turns 2-4 short follow-ups | user turns: {cell(chat['words_per_turn'])}; answers: --max-tokens |",
        f"| `dataset:sharegpt-like` (`sharegpt-like.json`, ShareGPT format) | {data['records']} conversations of "
        f"1-3 exchanges; single turn: each one's first question | input: {cell(data['input_words'])}; "
        f"output (the recorded answer's length): {cell(data['output_words'])} |",
        f"| `trace:trace-small` (`trace-small.jsonl`) | {trace['requests']} requests over "
        f"{trace['duration_s']:g} s ({trace['mean_rate_rps']:g}/s: Poisson at 1/s and a burst of 10 at 30 s), "
        f"{trace['conversations']} conversations of 2-3 turns | input: {cell(trace['input_words'])}; "
        f"output tokens: {cell(trace['output_tokens'])} |",
        f"| `shared-prefix` (generated from the spec, no file) | {shared['prefixes']} prefixes of "
        f"{shared['prefix_words']} words x {shared['suffixes_per_prefix']} questions of {shared['suffix_words']} "
        f"words; a perfect prefix cache reuses at most {shared['reuse_ceiling']:.0%} of the prompt words | "
        f"every prompt: {shared['prefix_words'] + shared['suffix_words']} |",
    ]
    return "\n".join(rows) + "\n"


def _readme(current: str) -> str:
    head, sep, rest = current.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"{README}: no {BEGIN} ... {END} block to fill in")
    return f"{head}{BEGIN}\n{readme_table()}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m servescope.workloads.generate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--check", action="store_true", help="fail (exit 1) when a shipped file is stale")
    args = parser.parse_args(argv)
    wanted = files()
    for path, text in wanted.items():
        if args.check:
            continue
        path.write_text(text, encoding="utf-8")
    stale = [p for p, text in wanted.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    readme = README.read_text(encoding="utf-8")
    if _readme(readme) != readme:
        if args.check:
            stale.append(README)
        else:
            README.write_text(_readme(readme), encoding="utf-8")
    if stale:
        print(
            f"stale: {', '.join(str(p) for p in stale)}: run python -m servescope.workloads.generate", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
