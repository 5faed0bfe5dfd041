"""Workload sources beyond a list of prompts, as `--prompts` kinds: conversations, shared prefixes, datasets, traces.

  conversation[:NAME|FILE]           multi-turn chats; each turn carries the conversation so far, the engine's
                                     own answers included (conversation.py, sessions.py)
  shared-prefix[:P,L,S[,Q]]          P prefixes of L tokens x S suffixes of Q tokens: a system prompt or a
                                     document many questions share (shared_prefix.py)
  dataset[:NAME|FILE[,OPTION=...]]   a ShareGPT JSON or a JSONL of prompts or conversations, one request per
                                     prompt, with length filters and seeded sampling (dataset.py)
  trace[:NAME|FILE]                  timestamped requests (offset, input and output length, conversation id),
                                     replayed open loop by the `replay` scenario (trace.py)

NAME is a set shipped in servescope/workloads/prompts/ (its README states their length distributions; nothing is
downloaded); the bare kind takes the default one. Every kind is named and hashed in the manifest like
the plain prompt sets, and works with every scenario.
"""

from __future__ import annotations

KINDS = ("conversation", "shared-prefix", "dataset", "trace")


def is_workload(spec: str) -> bool:
    return spec.partition(":")[0] in KINDS


def load(spec: str):
    """The prompt set a workload spec names; a bad spec or file raises PromptSetError with one line."""
    kind, _, arg = spec.partition(":")
    if kind == "conversation":
        from servescope.workloads import conversation

        return conversation.load(arg)
    if kind == "shared-prefix":
        from servescope.workloads import shared_prefix

        return shared_prefix.load(arg)
    if kind == "dataset":
        from servescope.workloads import dataset

        return dataset.load(arg)
    from servescope.workloads import trace

    return trace.load(arg)


def check(scenario: str, prompt_set, bursts: int = 1) -> None:
    """Refuse, in one line and before anything runs, a scenario that cannot run this set as asked."""
    from servescope.workloads.base import PromptSetError
    from servescope.workloads.conversation import ConversationSet
    from servescope.workloads.trace import TraceSet

    if scenario == "replay" and not isinstance(prompt_set, TraceSet):
        raise PromptSetError(
            f"the replay scenario sends each request at a trace's own time: give --prompts trace[:NAME|FILE] "
            f"(got {prompt_set.name})"
        )
    if scenario == "compare" and isinstance(prompt_set, ConversationSet) and bursts > 1:
        raise PromptSetError(
            "compare with a conversation set: --bursts must be 1 (the sequential pass sends the first turns a "
            "burst sends; later rounds would send later turns with nothing to match them: use "
            "`burst --bursts K` to play K turns)"
        )
