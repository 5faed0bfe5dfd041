"""Hostile workload files (plain .txt/.jsonl, conversation:, dataset:, trace:): each is one line naming the file, never a
traceback, a hang or the machine's memory.

The files are made here: 10 GB sparse files (no disk taken), a valid line followed by a 10 GB one, nesting deeper than
Python's JSON reader goes, a home directory that does not exist, two million lines of prompts. They are read in a child
process whose address space is capped (RLIMIT_AS), so a reader that would hold a file whole fails there with
MemoryError instead of taking this shared machine's memory; the child has a generous timeout for the same reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import REPO

TEN_GB = 10 << 30
CHILD_MEMORY = 3 << 30
KINDS = {  # spec prefix -> a good record of that kind (one JSONL line)
    "": {"prompt": "hello there"},  # a plain .jsonl prompt set
    "conversation:": {"turns": ["hello", "and then?"]},
    "dataset:": {"prompt": "hello there", "output_tokens": 4},
    "trace:": {"offset_s": 0, "input_tokens": 4, "output_tokens": 4},
}


def _sparse(path: Path, head: bytes, size: int = TEN_GB) -> Path:
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(size)  # a hole: the rest reads as NUL bytes, one line without end
    return path


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def hostile_files(tmp: Path) -> dict[str, str]:
    """case name -> the --prompts spec that reads the hostile file."""
    cases: dict[str, str] = {}
    for prefix, good in KINDS.items():
        kind = prefix.rstrip(":") or "plain"
        line = (json.dumps(good) + "\n").encode()
        cases[f"{kind}-sparse-10GB"] = prefix + str(_sparse(tmp / f"{kind}-sparse.jsonl", b""))
        cases[f"{kind}-valid-line-then-a-10GB-line"] = prefix + str(_sparse(tmp / f"{kind}-long.jsonl", line))
        deep = tmp / f"{kind}-deep.jsonl"
        deep.write_text(json.dumps(good) + "\n" + _nested(100_000) + "\n")
        cases[f"{kind}-nested-100000-deep"] = prefix + str(deep)
        # Deep enough to pass the JSON reader, deep enough for str() or repr() of it to fail later.
        inner = tmp / f"{kind}-deep-field.jsonl"
        inner.write_text(json.dumps(good)[:-1] + ', "id": ' + _nested(950) + "}\n")
        cases[f"{kind}-nested-950-deep-field"] = prefix + str(inner)
        cases[f"{kind}-no-such-user"] = prefix + "~nosuchuser-servescope/prompts.jsonl"
    cases["dataset-json-array-sparse-10GB"] = "dataset:" + str(_sparse(tmp / "array.json", b"["))
    cases["plain-txt-sparse-10GB"] = str(_sparse(tmp / "sparse.txt", b""))
    cases["plain-txt-valid-line-then-a-10GB-line"] = str(_sparse(tmp / "long.txt", b"a prompt\n"))
    many = tmp / "two-million.txt"
    with open(many, "w") as fh:
        fh.writelines(f"prompt number {i}\n" for i in range(2_000_000))
    cases["plain-txt-2000000-lines"] = str(many)
    cases["plain-txt-no-such-user"] = "~nosuchuser-servescope/prompts.txt"
    return cases


CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
from servescope.workloads import prompts
for name, spec in json.loads(sys.stdin.read()).items():
    try:
        loaded = prompts.load(spec)
        outcome = {{"type": None, "message": f"loaded {{len(loaded)}} prompts"}}
    except BaseException as exc:
        outcome = {{"type": type(exc).__name__, "message": str(exc)}}
    print(json.dumps({{"name": name, **outcome}}), flush=True)
"""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("hostile")
    cases = hostile_files(tmp)
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(limit=CHILD_MEMORY)],
        input=json.dumps(cases),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,  # a hang, not a bound: each case takes well under a second when bounded
    )
    found = {o["name"]: {**o, "spec": cases[o["name"]]} for o in map(json.loads, done.stdout.splitlines())}
    assert set(found) == set(cases), done.stderr[-3000:]
    return found


CASE_NAMES = [
    f"{kind}-{case}"
    for kind in ("plain", "conversation", "dataset", "trace")
    for case in ("sparse-10GB", "valid-line-then-a-10GB-line", "nested-100000-deep", "nested-950-deep-field")
    + ("no-such-user",)
] + [
    "dataset-json-array-sparse-10GB",
    "plain-txt-sparse-10GB",
    "plain-txt-valid-line-then-a-10GB-line",
    "plain-txt-2000000-lines",
    "plain-txt-no-such-user",
]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_a_hostile_workload_file_is_one_line_naming_the_file(outcomes, name):
    outcome = outcomes[name]
    assert outcome["type"] == "PromptSetError", outcome
    message = outcome["message"]
    assert message and "\n" not in message, outcome
    path = outcome["spec"].partition(":")[2] if ":" in outcome["spec"] else outcome["spec"]
    assert path in message, outcome


@pytest.mark.parametrize(
    ("name", "limit"),
    [
        ("plain-sparse-10GB", "WORKLOAD_MAX_LINE_MB"),
        ("conversation-valid-line-then-a-10GB-line", "WORKLOAD_MAX_LINE_MB"),
        ("dataset-sparse-10GB", "WORKLOAD_MAX_LINE_MB"),
        ("trace-valid-line-then-a-10GB-line", "WORKLOAD_MAX_LINE_MB"),
        ("plain-txt-valid-line-then-a-10GB-line", "WORKLOAD_MAX_LINE_MB"),
        ("dataset-json-array-sparse-10GB", "WORKLOAD_MAX_JSON_MB"),
        ("plain-txt-2000000-lines", "100000 prompts"),
    ],
)
def test_a_size_refusal_names_the_limit(outcomes, name, limit):
    assert limit in outcomes[name]["message"], outcomes[name]


def test_the_limits_are_knobs_and_a_bad_one_is_one_line(tmp_path, monkeypatch):
    from servescope.workloads import prompts
    from servescope.workloads.prompts import PromptSetError

    path = tmp_path / "p.txt"
    path.write_text("a" * 3000 + "\n")
    assert len(prompts.load(str(path))) == 1
    monkeypatch.setenv("WORKLOAD_MAX_LINE_MB", "0.001")
    with pytest.raises(PromptSetError, match=rf"^{path}:1: a line longer than WORKLOAD_MAX_LINE_MB=0.001 MB"):
        prompts.load(str(path))
    monkeypatch.setenv("WORKLOAD_MAX_LINE_MB", "lots")
    with pytest.raises(PromptSetError, match=r"^WORKLOAD_MAX_LINE_MB='lots': expected a number of megabytes > 0$"):
        prompts.load(str(path))


def _plan(*argv: str):
    from loadgen.commands import build_parser, prepare
    from loadgen.runplan import RunPlan

    return prepare(RunPlan.from_args(build_parser().parse_args(list(argv))))


def test_a_replay_slower_than_a_run_can_last_is_refused_in_one_line_unless_duration_caps_it():
    from loadgen.commands import USAGE_ERRORS
    from loadgen.options import MAX_RUN_S

    base = ("replay", "--engine", "vllm=http://127.0.0.1:9", "--prompts", "trace")
    with pytest.raises(USAGE_ERRORS) as refused:
        _plan(*base, "--speed", "1e-300")
    assert "\n" not in str(refused.value) and "--speed" in str(refused.value), refused.value
    (phase,) = _plan(*base, "--speed", "1e-300", "--duration", "10").phases  # --duration caps the replay
    assert phase.duration_s == 10
    (phase,) = _plan(*base, "--speed", "2").phases
    assert phase.schedule.offsets_s[-1] / phase.schedule.speed <= MAX_RUN_S


@pytest.mark.parametrize("flag", ["--think-time", "--burst-pause", "--request-timeout"])
def test_seconds_past_what_a_run_can_last_are_refused_in_one_line(flag, capsys):
    with pytest.raises(SystemExit) as refused:
        _plan("burst", "--engine", "vllm=http://127.0.0.1:9", flag, "1e12")
    assert refused.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0], err
