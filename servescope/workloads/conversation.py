"""`conversation[:NAME|FILE]`: multi-turn chats whose requests carry the conversation so far, the engine's own answers included.

A conversation file is JSONL (one conversation a line) or a JSON array, each conversation one of:

  {"id": "c1", "messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}, ...]}
  {"id": "c1", "conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}  (ShareGPT)
  {"id": "c1", "turns": ["first question", "second question"]}

Roles: system (first only), user / human, assistant / gpt; any other role is refused. Each user
message is one turn. A recorded assistant answer is not replayed: the engine's own answer takes its
place in the history (so what a prefix cache can reuse is what the engine itself produced), and the
recorded answer's length in words becomes that turn's output length (as `vllm bench serve` does with
ShareGPT); turns without one ask for --max-tokens.

How turns go out (servescope/workloads/sessions.py): in a closed loop (sequential, burst, ramp, sweep)
each user holds one conversation open and sends its turns in order, `--think-time` seconds apart (a
burst's rounds are its turns: the pause between bursts stands in for think time); in an open loop
(rate) an arrival continues a conversation whose think time is over, else starts the next one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servescope.workloads import files, lengths
from servescope.workloads.base import Conversation, Prompt, PromptSet, PromptSetError, warmup_text

DEFAULT = "chat4"
ROLES = {"system": "system", "user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant"}
MAX_CONVERSATIONS = 100_000
MAX_WORDS = 4_000_000  # the same bound as a synthetic set's: every turn is held in memory (and in the manifest)


@dataclass(frozen=True)
class ConversationSet(PromptSet):
    """A prompt set of multi-turn conversations: each turn is sent with the conversation so far."""

    conversations: tuple[Conversation, ...] = ()
    asked_reuse = 1.0  # each turn carries the conversation so far: reusing it is what the workload measures

    def canonical(self) -> Any:
        # Where a conversation starts and ends is part of the workload, not only the turns' text.
        return [[c.system, [t.canonical() for t in c.turns]] for c in self.conversations]

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "conversation",
            "conversations": len(self.conversations),
            "turns_per_conversation": lengths.summary([len(c.turns) for c in self.conversations]),
            "words_per_turn": lengths.summary([lengths.words(t.text) for t in self.prompts]),
            "system_prompts": sum(c.system is not None for c in self.conversations),
        }

    def source(self, phase):
        from servescope.workloads.sessions import Sessions

        # A burst's rounds are its turns: the pause between bursts is the think time.
        think_s = 0.0 if phase.scenario == "burst" else phase.settings.think_s
        return Sessions(self.conversations, live=phase.sessions, think_s=think_s)

    def warmup_text(self, index: int) -> str:
        return warmup_text(index)


def load(arg: str) -> ConversationSet:
    path, name = files.resolve("conversation", arg, DEFAULT)
    conversations: list[Conversation] = []
    total_words = 0
    for where, item in files.records(path):
        conversation = parse(item, where, default_id=f"{name}-{len(conversations) + 1}")
        total_words += sum(lengths.words(t.text) for t in conversation.turns)
        if len(conversations) >= MAX_CONVERSATIONS or total_words > MAX_WORDS:
            raise PromptSetError(
                f"{path}: more than {MAX_CONVERSATIONS} conversations or {MAX_WORDS} words: use a smaller file"
            )
        conversations.append(conversation)
    if not conversations:
        raise PromptSetError(f"{path}: no conversations in it")
    prompts = tuple(t for c in conversations for t in c.turns)
    return ConversationSet(name=f"conversation-{name}", prompts=prompts, conversations=tuple(conversations))


def parse(item: Any, where: str, default_id: str) -> Conversation:
    """One conversation record in any of the three shapes; a bad one is one line naming where it is."""
    if not isinstance(item, dict):
        raise PromptSetError(f'{where}: expected a conversation object ({{"messages": [...]}}), got {_type(item)}')
    conv_id = str(item.get("id") or default_id)
    if isinstance(item.get("turns"), list):
        messages = [("user", text, i) for i, text in enumerate(item["turns"])]
    elif isinstance(item.get("messages"), list):
        messages = [_message(m, where, i, "role", "content") for i, m in enumerate(item["messages"])]
    elif isinstance(item.get("conversations"), list):
        messages = [_message(m, where, i, "from", "value") for i, m in enumerate(item["conversations"])]
    else:
        raise PromptSetError(f'{where}: expected "messages", "conversations" (ShareGPT) or "turns" as a list')
    system: str | None = None
    turns: list[tuple[str, int | None]] = []
    for role, text, index in messages:
        if not isinstance(text, str) or not text.strip():
            raise PromptSetError(f"{where}: message {index + 1} of conversation {conv_id!r} has no text")
        if role == "system":
            if turns or system is not None:
                raise PromptSetError(f"{where}: conversation {conv_id!r}: a system message only comes first")
            system = text
        elif role == "user":
            turns.append((text, None))
        elif not turns:
            raise PromptSetError(f"{where}: conversation {conv_id!r}: an assistant message before any user message")
        elif turns[-1][1] is None:
            turns[-1] = (turns[-1][0], max(1, lengths.words(text)))  # the recorded answer's length
    if not turns:
        raise PromptSetError(f"{where}: conversation {conv_id!r} has no user message")
    return Conversation(
        conv_id,
        system,
        tuple(Prompt(f"{conv_id}#{k + 1}", text, max_tokens) for k, (text, max_tokens) in enumerate(turns)),
    )


def _message(message: Any, where: str, index: int, role_key: str, text_key: str) -> tuple[str, Any, int]:
    if not isinstance(message, dict):
        raise PromptSetError(f"{where}: message {index + 1}: expected an object, got {_type(message)}")
    role = message.get(role_key)
    if not isinstance(role, str) or role not in ROLES:
        raise PromptSetError(
            f"{where}: message {index + 1}: unknown role {role!r} (expected system, user/human or assistant/gpt)"
        )
    return ROLES[role], message.get(text_key), index


def _type(value: Any) -> str:
    return {str: "a string", list: "a list", int: "a number", float: "a number", bool: "true/false"}.get(
        type(value), "null" if value is None else type(value).__name__
    )
