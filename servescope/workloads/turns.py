"""What one piece of a phase's work becomes on the wire: the messages, the output length, its place in a conversation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Turn:
    """One request to send, as a workload source made it from a phase's work."""

    prompt_id: str
    messages: list[dict[str, str]]  # what the chat request carries: the conversation so far, then the new user message
    max_tokens: int  # the output length asked for: the prompt's own (a dataset's, a trace's), else --max-tokens
    conversation: str | None = None  # the conversation (session) it belongs to; None for a single-turn prompt
    turn: int | None = None  # 1-based place in its conversation
    history_tokens: int | None = None  # the previous turn's prompt + output tokens, as the engine counted them
    keep_answer: bool = False  # the engine's answer joins the conversation: the client keeps the text
    handle: Any = field(default=None, repr=False)  # the source's own bookkeeping

    @property
    def history_messages(self) -> int | None:
        """Messages sent before this turn's user message (a system prompt, earlier questions and answers)."""
        return len(self.messages) - 1 if self.conversation is not None else None


class Answer(Protocol):
    """What a source learns from a finished request (loadgen.client.Measurement has these)."""

    ok: bool
    text: str | None
    prompt_tokens: int | None
    output_tokens: int | None


class SingleTurn:
    """Each prompt on its own: one user message, with the prompt's own output length or the run's."""

    def begin(self, work, max_tokens: int) -> Turn:
        prompt = work.prompt
        return Turn(prompt.id, [{"role": "user", "content": prompt.text}], prompt.max_tokens or max_tokens)

    def end(self, turn: Turn, answer: Answer) -> None:
        """Nothing to carry over between single prompts."""
