"""`trace[:NAME|FILE]`: timestamped requests replayed open loop by the `replay` scenario, at 1x or `--speed` times faster.

One request a line (JSONL, or a JSON array), sorted by time:

  {"offset_s": 0.25, "input_tokens": 120, "output_tokens": 40, "conversation_id": "c7"}

  offset_s          seconds from the trace's start (or `timestamp` in milliseconds, as Mooncake's traces have)
  input_tokens      the prompt's length (or `input_length`): plain words, about one token each
  output_tokens     the output length asked for (or `output_length`); honoured as every --max-tokens is
  conversation_id   optional (or `session_id`): requests with the same id are the turns of one conversation; each
                    carries the earlier turns and the engine's answers, and its input_tokens are the new message
  hash_ids          optional, Mooncake's: the prompt's 512-token blocks, the same id the same text, so prompts
                    that shared a prefix in the original trace share it here

`replay` sends request k at start + offset_k / speed whatever happened to the others (open loop):
each record keeps `scheduled_at` beside `started_at`, and the difference is the schedule lag the
report shows (the client's own delay, or a conversation turn waiting for the previous answer).
Other scenarios use a trace as a list of prompts with their lengths, without its times.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from servescope.contracts.runcontract import MAX_RUN_S
from servescope.judgements import arrivals
from servescope.workloads import files, lengths
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
from servescope.workloads.turns import Answer, SingleTurn, Turn

DEFAULT = "trace-small"
MOONCAKE_BLOCK_TOKENS = 512  # what one of Mooncake's hash_ids stands for
MAX_OFFSET_S = MAX_RUN_S  # a trace longer than a run can last could not be replayed


@dataclass(frozen=True)
class TraceRow:
    """One request of a trace: its offset from the trace's start and the conversation it belongs to."""

    offset_s: float
    conversation: str | None


@dataclass(frozen=True)
class TraceSet(PromptSet):
    """A trace's requests as a prompt set, each with its offset: replayed open loop by the `replay` scenario."""

    rows: tuple[TraceRow, ...] = ()

    def canonical(self) -> Any:
        return [[r.offset_s, r.conversation, p.canonical()] for r, p in zip(self.rows, self.prompts, strict=True)]

    def schedule(self, speed: float = 1.0) -> arrivals.Trace:
        """Its requests' arrival times, SPEED times faster (the replay's --speed)."""
        return arrivals.Trace(tuple(r.offset_s for r in self.rows), speed)

    def describe(self) -> dict[str, Any]:
        duration = self.rows[-1].offset_s if self.rows else 0.0
        return {
            "kind": "trace",
            "requests": len(self.rows),
            "duration_s": duration,
            "mean_rate_rps": round(len(self.rows) / duration, 4) if duration > 0 else None,
            "conversations": len({r.conversation for r in self.rows if r.conversation is not None}),
            "input_words": lengths.summary([lengths.words(p.text) for p in self.prompts]),
            "output_tokens": lengths.summary([p.max_tokens for p in self.prompts if p.max_tokens is not None]),
        }

    def source(self, phase):
        return TraceTurns(self) if phase.scenario == "replay" else SingleTurn()

    def warmup_text(self, index: int) -> str:
        return warmup_text(index)


def load(arg: str) -> TraceSet:
    path, name = files.resolve("trace", arg, DEFAULT)
    rows: list[TraceRow] = []
    prompts: list[Prompt] = []
    blocks: dict[Any, list[str]] = {}
    total = 0
    previous = 0.0
    for where, item in files.records(path):
        if not isinstance(item, dict):
            raise PromptSetError(f'{where}: expected {{"offset_s": ..., "input_tokens": ..., "output_tokens": ...}}')
        offset = _offset(item, where)
        if offset < previous:
            raise PromptSetError(
                f"{where}: offset {offset:g} s comes before the previous request's {previous:g} s: "
                f"a trace is sorted by time"
            )
        previous = offset
        tokens_in = _count(item, where, "input_tokens", "input_length")
        tokens_out = _count(item, where, "output_tokens", "output_length")
        total += tokens_in
        if len(rows) >= MAX_SYNTHETIC_COUNT or total > MAX_SYNTHETIC_WORDS:
            raise PromptSetError(
                f"{path}: more than {MAX_SYNTHETIC_COUNT} requests or {MAX_SYNTHETIC_WORDS} prompt tokens: "
                f"replay a part of it"
            )
        conversation = item.get("conversation_id", item.get("session_id"))
        if conversation is not None and not isinstance(conversation, (str, int)):
            raise PromptSetError(f"{where}: conversation_id must be a string or a number")
        index = len(rows)
        text = _text(item.get("hash_ids"), tokens_in, index, blocks, where)
        rows.append(TraceRow(offset, None if conversation is None else str(conversation)))
        prompts.append(Prompt(f"{name}-{index + 1}", text, tokens_out))
    if not rows:
        raise PromptSetError(f"{path}: no requests in it (an empty trace)")
    return TraceSet(name=f"trace-{name}", prompts=tuple(prompts), rows=tuple(rows))


def _offset(item: dict, where: str) -> float:
    if "offset_s" in item:
        value, unit = item["offset_s"], 1.0
    elif "timestamp" in item:
        value, unit = item["timestamp"], 1000.0
    else:
        raise PromptSetError(f'{where}: no time: expected "offset_s" (seconds) or "timestamp" (milliseconds)')
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PromptSetError(f"{where}: the time must be a number, got {value!r}")
    if value < 0:
        raise PromptSetError(f"{where}: negative offset {value:g}: offsets count from the trace's start")
    if value / unit > MAX_OFFSET_S:
        raise PromptSetError(f"{where}: offset {value / unit:g} s is more than a week into the trace")
    return float(value) / unit


def _count(item: dict, where: str, *names: str) -> int:
    value = next((item[n] for n in names if n in item), None)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SYNTHETIC_TOKENS:
        raise PromptSetError(
            f"{where}: {names[0]} must be a whole number from 1 to {MAX_SYNTHETIC_TOKENS}, got {value!r}"
        )
    return value


def _text(hash_ids: Any, tokens: int, index: int, blocks: dict[Any, list[str]], where: str) -> str:
    """The prompt: Mooncake's blocks when the trace gives them (shared ids, shared text), else text of its own."""
    if hash_ids is None:
        return " ".join(filter(None, (f"Request-{index + 1}:", filler(tokens - 1, random.Random(f"row-{index}")))))
    if not isinstance(hash_ids, list) or not all(
        isinstance(h, (int, str)) and not isinstance(h, bool) for h in hash_ids
    ):
        raise PromptSetError(f"{where}: hash_ids must be a list of block ids")
    words: list[str] = []
    for block in hash_ids:
        if len(words) >= tokens:
            break
        if block not in blocks:
            blocks[block] = filler(MOONCAKE_BLOCK_TOKENS, random.Random(f"block-{block}")).split()
        words += blocks[block]
    if len(words) < tokens:
        words += filler(tokens - len(words), random.Random(f"row-{index}")).split()
    return " ".join(words[:tokens])


class TraceTurns:
    """The replay's source: a conversation's turn waits for the previous answer, which joins its history."""

    def __init__(self, trace: TraceSet):
        self.rows = trace.rows
        self.conversations: dict[str, _TraceConversation] = {}

    def begin(self, work, max_tokens: int) -> Turn:
        prompt = work.prompt
        row = self.rows[work.arrival_index]
        user = {"role": "user", "content": prompt.text}
        if row.conversation is None:
            return Turn(prompt.id, [user], prompt.max_tokens or max_tokens)
        conversation = self.conversations.setdefault(row.conversation, _TraceConversation())
        conversation.wait_idle()
        conversation.busy = True
        conversation.turns += 1
        return Turn(
            prompt.id,
            [*conversation.history, user],
            prompt.max_tokens or max_tokens,
            conversation=row.conversation,
            turn=conversation.turns,
            history_tokens=conversation.history_tokens,
            keep_answer=True,
            handle=conversation,
        )

    def end(self, turn: Turn, answer: Answer) -> None:
        conversation: _TraceConversation | None = turn.handle
        if conversation is None:
            return
        if answer.ok:
            conversation.history = [*turn.messages, {"role": "assistant", "content": answer.text or ""}]
            known = answer.prompt_tokens is not None and answer.output_tokens is not None
            conversation.history_tokens = answer.prompt_tokens + answer.output_tokens if known else None
        conversation.release()


class _TraceConversation:
    def __init__(self) -> None:
        from gevent.event import Event

        self.history: list[dict[str, str]] = []
        self.history_tokens: int | None = None
        self.turns = 0
        self.busy = False
        self.idle = Event()

    def wait_idle(self) -> None:
        # Waiters wake in the order they came (gevent runs an Event's links in order): turns keep the trace's order.
        while self.busy:
            self.idle.clear()
            self.idle.wait()

    def release(self) -> None:
        self.busy = False
        self.idle.set()
