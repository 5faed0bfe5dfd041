"""The conversations one phase holds open: which turn goes next, each conversation's history, the think time between turns.

Closed loop (`live` = the phase's users): each user holds one conversation open and a finished one
is replaced by the next in the set (cycling; a second pass is `ID~2`), so a sequential run plays
the conversations one after another and a burst of N plays N of them, one turn per round. Open
loop (`live` None): an arrival continues the conversation that has waited longest once its think
time is over, else starts the next one. A failed turn ends its conversation: there is no answer to
carry on from. Each phase (a ramp step, a sweep level, the next engine) starts the set afresh.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import gevent
from gevent.event import Event

from servescope.workloads.base import Conversation
from servescope.workloads.turns import Answer, Turn


@dataclass
class _Session:
    """One conversation a phase holds open: its history so far, the turn that goes next, and when it may go."""

    id: str
    conversation: Conversation
    history: list[dict[str, str]] = field(default_factory=list)
    next_turn: int = 0  # index into conversation.turns
    history_tokens: int | None = None  # the last turn's prompt + output tokens (engine's count)
    ready_at: float = 0.0  # time.monotonic() when the think time after the last answer is over


class Sessions:
    def __init__(self, conversations: tuple[Conversation, ...], live: int | None, think_s: float = 0.0):
        self.conversations = conversations
        self.live = live
        self.think_s = think_s
        self.idle: list[_Session] = []  # open, waiting for their next turn
        self.open = 0  # conversations started and not yet finished (idle or with a turn in flight)
        self.started = 0
        self.changed = Event()

    def begin(self, work, max_tokens: int) -> Turn:
        """The next turn to send; in a closed loop it may wait for a conversation's think time (never in a burst)."""
        while True:
            now = time.monotonic()
            ready = [s for s in self.idle if s.ready_at <= now]
            if self.live is None:
                session = min(ready, key=lambda s: s.ready_at) if ready else self._start()
            elif self.open < self.live:
                session = self._start()
            elif ready:
                session = min(ready, key=lambda s: s.ready_at)
            elif self.idle:
                gevent.sleep(min(s.ready_at for s in self.idle) - now)
                continue
            else:  # every open conversation has a turn in flight (more users than the phase holds open)
                self.changed.wait(1.0)
                continue
            break
        if session in self.idle:
            self.idle.remove(session)
        prompt = session.conversation.turns[session.next_turn]
        return Turn(
            prompt_id=prompt.id,
            messages=[*session.history, {"role": "user", "content": prompt.text}],
            max_tokens=prompt.max_tokens or max_tokens,
            conversation=session.id,
            turn=session.next_turn + 1,
            history_tokens=session.history_tokens,
            keep_answer=True,
            handle=session,
        )

    def end(self, turn: Turn, answer: Answer) -> None:
        session: _Session = turn.handle
        session.next_turn += 1
        if answer.ok and session.next_turn < len(session.conversation.turns):
            session.history = [*turn.messages, {"role": "assistant", "content": answer.text or ""}]
            known = answer.prompt_tokens is not None and answer.output_tokens is not None
            session.history_tokens = answer.prompt_tokens + answer.output_tokens if known else None
            session.ready_at = time.monotonic() + self.think_s
            self.idle.append(session)
        else:
            self.open -= 1
        changed, self.changed = self.changed, Event()
        changed.set()

    def _start(self) -> _Session:
        conversation = self.conversations[self.started % len(self.conversations)]
        passes = self.started // len(self.conversations)
        self.started += 1
        self.open += 1
        session_id = conversation.id if passes == 0 else f"{conversation.id}~{passes + 1}"
        history = [{"role": "system", "content": conversation.system}] if conversation.system else []
        return _Session(session_id, conversation, history)
