"""The workload kinds as prompt sets (servescope/workloads/): what each file shape reads as, one-line refusals, conversations' turn order."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import gevent
import pytest

from servescope import workloads
from servescope.workloads import generate, prompts
from servescope.workloads.conversation import ConversationSet
from servescope.workloads.prompts import PromptSetError
from servescope.workloads.sessions import Sessions
from servescope.workloads.trace import TraceSet, TraceTurns


def write(tmp_path: Path, name: str, lines: list) -> str:
    path = tmp_path / name
    if name.endswith(".json"):
        path.write_text(json.dumps(lines))
    else:
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


# --- conversation


def test_the_three_conversation_shapes_read_the_same(tmp_path):
    messages = write(
        tmp_path,
        "m.jsonl",
        [
            {
                "id": "a",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "one two"},
                    {"role": "assistant", "content": "w " * 7},
                    {"role": "user", "content": "three"},
                ],
            }
        ],
    )
    sharegpt = write(
        tmp_path,
        "s.json",
        [
            {
                "id": "a",
                "conversations": [
                    {"from": "system", "value": "be brief"},
                    {"from": "human", "value": "one two"},
                    {"from": "gpt", "value": "w " * 7},
                    {"from": "human", "value": "three"},
                ],
            }
        ],
    )
    a, b = prompts.load(f"conversation:{messages}"), prompts.load(f"conversation:{sharegpt}")
    assert isinstance(a, ConversationSet) and a.sha256 == b.sha256
    (conv,) = a.conversations
    assert conv.system == "be brief" and [t.text for t in conv.turns] == ["one two", "three"]
    # The recorded answer is never replayed: its length (7 words) is the first turn's output length.
    assert [t.max_tokens for t in conv.turns] == [7, None]
    assert [p.id for p in a.prompts] == ["a#1", "a#2"]
    turns = prompts.load(f"conversation:{write(tmp_path, 't.jsonl', [{'turns': ['one two', 'three']}])}")
    assert [t.text for t in turns.conversations[0].turns] == ["one two", "three"]


def test_where_a_conversation_ends_is_part_of_its_hash(tmp_path):
    one = write(tmp_path, "one.jsonl", [{"turns": ["a", "b"]}])
    two = write(tmp_path, "two.jsonl", [{"turns": ["a"]}, {"turns": ["b"]}])
    assert prompts.load(f"conversation:{one}").sha256 != prompts.load(f"conversation:{two}").sha256


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"messages": [{"role": "bing", "content": "x"}]}, "unknown role 'bing'"),
        ({"conversations": [{"from": "narrator", "value": "x"}]}, "unknown role 'narrator'"),
        ({"messages": [{"role": ["user"], "content": "x"}]}, "unknown role ['user']"),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}]},
            "a system message only comes first",
        ),
        ({"messages": [{"role": "assistant", "content": "x"}]}, "an assistant message before any user message"),
        ({"messages": [{"role": "system", "content": "x"}]}, "has no user message"),
        ({"messages": [{"role": "user", "content": "  "}]}, "has no text"),
        ({"text": "x"}, 'expected "messages", "conversations" (ShareGPT) or "turns"'),
        ("just a string", "expected a conversation object"),
    ],
)
def test_a_bad_conversation_is_one_line_naming_its_line(tmp_path, item, message):
    path = write(tmp_path, "c.jsonl", [{"turns": ["fine"]}, item])
    with pytest.raises(PromptSetError) as err:
        prompts.load(f"conversation:{path}")
    assert message in str(err.value) and f"{path}:2" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"turns": ["a"]}\n{"turns": \n', "c.jsonl:2: not JSON"),
        ('[{"turns": ["a"]}, ', "not valid JSON"),
        ("", "no conversations in it"),
        ("\n\n", "no conversations in it"),
        ("[]", "no conversations in it"),
    ],
)
def test_malformed_or_empty_conversation_files(tmp_path, text, message):
    (tmp_path / "c.jsonl").write_text(text)
    with pytest.raises(PromptSetError, match=message.replace("(", r"\(")):
        prompts.load(f"conversation:{tmp_path / 'c.jsonl'}")


def test_a_name_that_is_neither_shipped_nor_a_file():
    with pytest.raises(PromptSetError, match="no set of that name in .* and no such file"):
        prompts.load("conversation:no-such-set")


# --- the conversations' order: closed loop, open loop, a burst's rounds


def answer(ok: bool = True, text: str = "fine", prompt_tokens: int | None = 10, output_tokens: int | None = 3):
    return SimpleNamespace(ok=ok, text=text, prompt_tokens=prompt_tokens, output_tokens=output_tokens)


def two_conversations(tmp_path) -> ConversationSet:
    return prompts.load(
        f"conversation:{write(tmp_path, 'c.jsonl', [{'id': 'a', 'turns': ['a1', 'a2']}, {'id': 'b', 'turns': ['b1', 'b2']}])}"
    )


def test_one_user_plays_the_conversations_one_after_another(tmp_path):
    sessions = Sessions(two_conversations(tmp_path).conversations, live=1)
    seen = []
    for _ in range(5):
        turn = sessions.begin(None, max_tokens=8)
        seen.append((turn.conversation, turn.turn, turn.messages[-1]["content"], turn.history_tokens))
        sessions.end(turn, answer(text=f"answer to {turn.messages[-1]['content']}"))
    assert seen == [
        ("a", 1, "a1", None),
        ("a", 2, "a2", 13),
        ("b", 1, "b1", None),
        ("b", 2, "b2", 13),
        ("a~2", 1, "a1", None),
    ]


def test_the_engines_own_answer_joins_the_history(tmp_path):
    sessions = Sessions(two_conversations(tmp_path).conversations, live=1)
    first = sessions.begin(None, max_tokens=8)
    assert first.keep_answer and first.history_messages == 0
    sessions.end(first, answer(text="the engine said this"))
    second = sessions.begin(None, max_tokens=8)
    assert second.messages == [
        {"role": "user", "content": "a1"},
        {"role": "assistant", "content": "the engine said this"},
        {"role": "user", "content": "a2"},
    ]
    assert second.history_messages == 2 and second.max_tokens == 8


def test_a_failed_turn_ends_its_conversation(tmp_path):
    sessions = Sessions(two_conversations(tmp_path).conversations, live=1)
    sessions.end(sessions.begin(None, 8), answer(ok=False, text=None))
    assert sessions.begin(None, 8).conversation == "b"


def test_a_burst_of_two_plays_two_conversations_one_turn_per_round(tmp_path):
    sessions = Sessions(two_conversations(tmp_path).conversations, live=2)
    round_1 = [sessions.begin(None, 8) for _ in range(2)]
    for turn in round_1:
        sessions.end(turn, answer())
    round_2 = [sessions.begin(None, 8) for _ in range(2)]
    assert [(t.conversation, t.turn) for t in round_1] == [("a", 1), ("b", 1)]
    assert sorted((t.conversation, t.turn) for t in round_2) == [("a", 2), ("b", 2)]


def test_open_loop_continues_a_conversation_only_once_its_think_time_is_over(tmp_path):
    conversations = two_conversations(tmp_path).conversations
    waiting = Sessions(conversations, live=None, think_s=3600.0)
    waiting.end(waiting.begin(None, 8), answer())
    assert waiting.begin(None, 8).conversation == "b"  # a is thinking: the arrival starts the next one
    ready = Sessions(conversations, live=None, think_s=0.0)
    ready.end(ready.begin(None, 8), answer())
    assert (t := ready.begin(None, 8)).conversation == "a" and t.turn == 2


def test_closed_loop_waits_for_the_think_time_of_its_one_conversation(tmp_path):
    sessions = Sessions(two_conversations(tmp_path).conversations, live=1, think_s=0.05)
    sessions.end(sessions.begin(None, 8), answer())
    waiter = gevent.spawn(sessions.begin, None, 8)
    gevent.sleep(0)  # the waiter runs until it parks on the think time
    assert not waiter.ready()
    assert waiter.get(timeout=10).turn == 2  # then it sends the second turn, never a new conversation


# --- shared prefixes


def test_shared_prefix_prompts_take_turns_over_the_prefixes():
    s = prompts.load("shared-prefix:3,20,2,5")
    assert len(s) == 6 and s.name == "shared-prefix-3x20-2x5"
    texts = [p.text for p in s.prompts]
    heads = [t.split("\n\n")[0] for t in texts]
    assert heads[:3] == heads[3:] and len(set(heads[:3])) == 3  # k and k+P share the prefix; prefixes differ
    assert all(len(h.split()) == 20 for h in heads) and all(len(t.split("\n\n")[1].split()) == 5 for t in texts)
    assert len({t.split()[0] for t in heads}) == 3  # prefixes differ from their first word
    assert s.describe()["reuse_ceiling"] == pytest.approx(1 / 2 * 20 / 25)
    assert prompts.load("shared-prefix:3,20,2,5").sha256 == s.sha256  # seeded: the same spec, the same set
    assert len(prompts.load("shared-prefix")) == 32


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("shared-prefix:1,2", "expected shared-prefix:PREFIXES,PREFIX_TOKENS,SUFFIXES"),
        ("shared-prefix:a,b,c", "expected shared-prefix:PREFIXES"),
        ("shared-prefix:0,10,2", "PREFIXES x SUFFIXES from 1"),
        ("shared-prefix:1,0,2", "PREFIX_TOKENS and SUFFIX_TOKENS from 1"),
        ("shared-prefix:1000,100000,40", "at most 4000000 words"),
    ],
)
def test_bad_shared_prefix_specs(spec, message):
    with pytest.raises(PromptSetError, match=message):
        prompts.load(spec)


# --- datasets


def test_the_shipped_sharegpt_like_dataset_takes_each_first_question_and_its_answer_length():
    data = prompts.load("dataset")
    raw = json.loads((prompts.DATA_DIR / "sharegpt-like.json").read_text())
    assert len(data) == len(raw) == data.describe()["records"]
    first = raw[0]["conversations"]
    assert data.prompts[0].text == first[0]["value"] and data.prompts[0].max_tokens == len(first[1]["value"].split())


def test_dataset_filters_and_seeded_sampling(tmp_path):
    rows = [{"prompt": " ".join(["w"] * n), "output_tokens": n} for n in range(1, 101)]
    path = write(tmp_path, "d.jsonl", rows)
    kept = prompts.load(f"dataset:{path},input=10-20,output=12-")
    assert [p.max_tokens for p in kept.prompts] == list(range(12, 21))
    a = prompts.load(f"dataset:{path},sample=10,seed=7")
    again = prompts.load(f"dataset:{path},sample=10,seed=7")
    other = prompts.load(f"dataset:{path},sample=10,seed=8")
    assert len(a) == 10 and a.sha256 == again.sha256 != other.sha256
    lengths = [p.max_tokens for p in a.prompts]
    assert lengths == sorted(lengths)  # drawn at random, kept in file order
    assert prompts.load(f"dataset:{path},sample=1000").sha256 == prompts.load(f"dataset:{path}").sha256


def test_dataset_records_of_every_shape(tmp_path):
    path = write(
        tmp_path,
        "d.jsonl",
        [
            "plain string",
            {"text": "a text"},
            {"turns": ["first", "second"]},
            {"id": "x", "prompt": "p", "max_tokens": 3},
        ],
    )
    data = prompts.load(f"dataset:{path}")
    assert [(p.text, p.max_tokens) for p in data.prompts] == [
        ("plain string", None),
        ("a text", None),
        ("first", None),
        ("p", 3),
    ]
    assert data.prompts[3].id == "x"


@pytest.mark.parametrize(
    ("content", "spec", "message"),
    [
        ("", "", "no records in it (an empty dataset)"),
        ("[]", "", "no records in it (an empty dataset)"),
        ('{"prompt": "x"}\n{"prompt": \n', "", "d.jsonl:2: not JSON"),
        ('[{"prompt": "x"},', "", "not valid JSON"),
        ('{"prompt": "x", "output_tokens": 5}\n', ",input=3-", "none of its 1 prompts passes the filters"),
        ('{"prompt": "x", "output_tokens": 0}\n', "", "output_tokens must be a whole number"),
        ('{"prompt": 5}\n', "", 'expected {"prompt": "..."} with some text'),
        ('{"prompt": "x"}\n', ",sample=0", "sample=: expected a whole number from 1"),
        ('{"prompt": "x"}\n', ",shuffle=1", "expected FILE then comma-separated"),
        ('{"prompt": "x"}\n', ",input=9-3", "expected 0 <= MIN <= MAX"),
    ],
)
def test_bad_datasets_are_one_line(tmp_path, content, spec, message):
    (tmp_path / "d.jsonl").write_text(content)
    with pytest.raises(PromptSetError) as err:
        prompts.load(f"dataset:{tmp_path / 'd.jsonl'}{spec}")
    assert message in str(err.value) and "\n" not in str(err.value)


# --- traces


def test_the_shipped_trace_reads_with_its_conversations():
    trace = prompts.load("trace")
    assert isinstance(trace, TraceSet) and len(trace) == len(trace.rows) == trace.describe()["requests"]
    offsets = [r.offset_s for r in trace.rows]
    assert offsets == sorted(offsets) and offsets[0] == 0.0
    assert trace.describe()["conversations"] == 5
    assert all(p.max_tokens for p in trace.prompts)
    first = trace.prompts[0]
    assert (
        len(first.text.split())
        == json.loads((prompts.DATA_DIR / "trace-small.jsonl").open().readline())["input_tokens"]
    )


def test_mooncake_traces_keep_their_shared_blocks(tmp_path):
    path = write(
        tmp_path,
        "m.jsonl",
        [
            {"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]},
            {"timestamp": 1500, "input_length": 700, "output_length": 4, "hash_ids": [1, 3]},
        ],
    )
    trace = prompts.load(f"trace:{path}")
    a, b = (p.text.split() for p in trace.prompts)
    assert [r.offset_s for r in trace.rows] == [0.0, 1.5]  # milliseconds, as Mooncake writes them
    assert len(a) == 600 and len(b) == 700
    assert a[:512] == b[:512] and a[512:600] != b[512:600]  # block 1 shared, then their own


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"offset_s": -1, "input_tokens": 5, "output_tokens": 5}], "negative offset -1"),
        (
            [
                {"offset_s": 2, "input_tokens": 5, "output_tokens": 5},
                {"offset_s": 1, "input_tokens": 5, "output_tokens": 5},
            ],
            "offset 1 s comes before the previous request's 2 s: a trace is sorted by time",
        ),
        ([{"input_tokens": 5, "output_tokens": 5}], 'no time: expected "offset_s"'),
        ([{"offset_s": "soon", "input_tokens": 5, "output_tokens": 5}], "the time must be a number"),
        ([{"offset_s": 0, "input_tokens": 0, "output_tokens": 5}], "input_tokens must be a whole number from 1"),
        ([{"offset_s": 0, "input_tokens": 5}], "output_tokens must be a whole number from 1"),
        ([{"offset_s": 0, "input_tokens": 5, "output_tokens": 5, "hash_ids": "abc"}], "hash_ids must be a list"),
        (["not an object"], 'expected {"offset_s"'),
        ([], "no requests in it (an empty trace)"),
    ],
)
def test_bad_traces_are_one_line(tmp_path, rows, message):
    path = write(tmp_path, "t.jsonl", rows)
    with pytest.raises(PromptSetError) as err:
        prompts.load(f"trace:{path}")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_replayed_conversation_turn_waits_for_the_previous_answer(tmp_path):
    path = write(
        tmp_path,
        "t.jsonl",
        [
            {"offset_s": 0, "input_tokens": 3, "output_tokens": 2, "conversation_id": "c"},
            {"offset_s": 0.1, "input_tokens": 3, "output_tokens": 2},
            {"offset_s": 0.2, "input_tokens": 3, "output_tokens": 2, "conversation_id": "c"},
        ],
    )
    trace = prompts.load(f"trace:{path}")
    source = TraceTurns(trace)

    def work(i):
        return SimpleNamespace(prompt=trace.prompts[i], arrival_index=i)

    first = source.begin(work(0), 99)
    alone = source.begin(work(1), 99)
    assert (first.turn, first.max_tokens, alone.conversation) == (1, 2, None)
    second = gevent.spawn(source.begin, work(2), 99)
    gevent.sleep(0)
    assert not second.ready()  # its prompt needs the first turn's answer
    source.end(first, answer(text="first answer"))
    turn = second.get(timeout=10)
    assert turn.turn == 2 and turn.messages[1] == {"role": "assistant", "content": "first answer"}
    assert turn.history_tokens == 13


# --- which scenario takes which set


def test_replay_needs_a_trace_and_compare_plays_one_round_of_conversations():
    with pytest.raises(PromptSetError, match="the replay scenario sends each request at a trace's own time"):
        workloads.check("replay", prompts.load("seed3"))
    with pytest.raises(PromptSetError, match="compare with a conversation set: --bursts must be 1"):
        workloads.check("compare", prompts.load("conversation"), bursts=2)
    workloads.check("compare", prompts.load("conversation"), bursts=1)
    workloads.check("replay", prompts.load("trace"))
    workloads.check("burst", prompts.load("trace"))


def test_the_warm_up_shares_nothing_with_a_workload_that_measures_reuse():
    for spec in ("conversation", "shared-prefix", "trace", "dataset"):
        data = prompts.load(spec)
        warm = data.warmup_text(0)
        assert all(not p.text.startswith(warm.split()[0]) for p in data.prompts), spec
    assert prompts.load("seed3").warmup_text(1) == prompts.load("seed3").prompts[1].text  # plain sets: as before


def test_plain_prompt_sets_keep_their_hash():
    """A run before the workloads must still match a run after them (the reference page's matched-set rule reads the hash)."""
    assert prompts.load("mixed").sha256 == "58281e3b0f2a33b361b0e3fc9135331af7182191a92d803e6e26dbb410318291"
    assert prompts.synthetic(64, 3).sha256 == "cd346e4c7e031fdc4fd855b764f26d13600827ec219f1e8f6db30060e884677f"
    # The hashes run folders recorded for seed3 and seed4, before the sets were renamed burst3 and sequential4.
    assert prompts.load("burst3").sha256 == "2d4322c1a76d13b985d932dc4dbe99153a8418f6f3180bc3accff4ba9946dfeb"
    assert prompts.load("sequential4").sha256 == "df16591aa004d0bb982d3a94a5b99b1b4a2b07280c41dfe58b6a30519956aafc"


def test_the_shipped_sets_and_their_readme_table_are_up_to_date():
    assert generate.main(["--check"]) == 0
    readme = generate.README.read_text()
    assert generate.readme_table() in readme


def test_a_fresh_set_without_a_seed_gets_one_of_its_run_and_every_other_set_is_left_as_asked():
    """Two knees with one seed send the same prompts, and an engine that keeps its cache across runs serves the
    second's first requests from the first's (llama.cpp: 256 of 257 prompt tokens cached)."""
    assert prompts.for_this_run("synthetic:256", seed=7) == "synthetic:256,seed=7"
    for asked in ("synthetic:256,seed=3", "synthetic:256x16", "seed3", "shared-prefix"):
        assert prompts.for_this_run(asked) == asked
    one, two = prompts.for_this_run("synthetic:64"), prompts.for_this_run("synthetic:64")
    assert one != two and one.startswith("synthetic:64,seed=")
    a, b = prompts.load(one), prompts.load(two)
    assert a.prompt(0, "knee-c1-1").text != b.prompt(0, "knee-c1-1").text and a.sha256 != b.sha256
    assert (
        prompts.load("synthetic:64,seed=5").prompt(3, "x").text
        == prompts.load("synthetic:64,seed=5").prompt(3, "x").text
    )


@pytest.mark.parametrize("spec", ["synthetic:16x64", "synthetic:32", "shared-prefix:3,20,2,5"])
def test_a_sets_hash_is_taken_once_not_for_every_request_that_carries_it(monkeypatch, spec):
    # Every record carries its set's hash: taken per request, a dataset's or conversations' million words were
    # serialised and hashed again for each one (per-run work on the per-request path).
    s = prompts.load(spec)
    first = s.sha256
    monkeypatch.setattr(type(s), "canonical", lambda self: pytest.fail("the set was hashed again"))
    assert s.sha256 == first
