"""Malformed run folders: every record is checked against the contract once, bad ones are skipped and counted by
reason, and a report is always written, with a fuzz target over run folders."""

from __future__ import annotations

import json
import math
import re
import shutil
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servescope.contracts.runfolder import PHASE_FIELDS, REQUEST_FIELDS, PhaseRecord, RequestRecord
from servescope.report import cli, render, sections
from servescope.report.load import RunError, load
from tests.paths import RUNS

NO_PROMETHEUS = "http://127.0.0.1:9"  # nothing listens on the discard port


def with_record_changes(src: Path, dst: Path, changes: dict[int, dict]) -> Path:
    """A copy of a fixture run whose requests.jsonl line i (0-based) gets the given fields set (None deletes)."""
    shutil.copytree(src, dst)
    path = dst / "requests.jsonl"
    lines = path.read_text().splitlines()
    for i, change in changes.items():
        record = json.loads(lines[i])
        for key, value in change.items():
            if value is None:
                record.pop(key, None)
            else:
                record[key] = value
        lines[i] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    return dst


def test_the_contract_names_every_record_field():
    assert [f.name for f in REQUEST_FIELDS] == [f.name for f in fields(RequestRecord)]
    assert [f.name for f in PHASE_FIELDS] == [f.name for f in fields(PhaseRecord)]


def test_wrong_typed_fields_are_skipped_and_the_report_is_written(tmp_path, capsys):
    """Regression: each of these made `python -m servescope.report` end in a traceback and write no report."""
    run = with_record_changes(
        RUNS / "seed-vllm-ollama",
        tmp_path / "r",
        {
            0: {"ttft_s": "abc"},
            1: {"output_tokens": "12"},
            2: {"tpot_s": {}},
            3: {"itl_s": [1e308, 1e308]},
            4: {"ttft_s": "abc"},
        },
    )
    assert cli.main(["--run", str(run), "--prometheus", NO_PROMETHEUS]) == 0
    err = capsys.readouterr().err
    expected = [
        "requests.jsonl: 2 records skipped, ttft_s: expected a number, got a string (lines 1, 5)",
        "requests.jsonl: 1 record skipped, output_tokens: expected an integer, got a string (line 2)",
        "requests.jsonl: 1 record skipped, tpot_s: expected a number, got an object (line 3)",
        "requests.jsonl: 1 record skipped, itl_s: a value out of range (0 to 1e+07) (line 4)",
    ]
    for line in expected:
        assert f"report: warning: {line}" in err
    assert "Traceback" not in err
    numbers = json.loads((run / "report.json").read_text())
    assert numbers["run"]["requests"] == 15
    assert numbers["loader_warnings"] == expected
    md = (run / "report.md").read_text()
    assert "Skipped while loading the run folder:" in md and f"- {expected[0]}" in md


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"ok": 1}, "ok: expected true or false, got an integer"),
        ({"output_tokens": 12.5}, "output_tokens: expected an integer, got a number"),
        ({"output_tokens": True}, "output_tokens: expected an integer, got true/false"),
        ({"output_tokens": 10**400}, "output_tokens: expected an integer, got a number"),  # beyond any integer type
        ({"output_tokens": 10**12}, "output_tokens: out of range (0 to 1e+09)"),
        ({"e2e_s": -0.5}, "e2e_s: out of range (0 to 1e+07)"),
        ({"itl_s": [0.1, "0.2"]}, "itl_s: expected a list of numbers, got a list"),
        ({"itl_s": 0.1}, "itl_s: expected a list of numbers, got a number"),
        ({"engine": ["vllm"]}, "engine: expected a string, got a list"),
        ({"engine": None}, "missing engine"),
        (
            {"engine_stats": {"total_duration_ns": 1e300}},
            "engine_stats: holds a number that is not finite or beyond 2^63",
        ),
        ({"started_at": -1}, "started_at: out of range (0 to 1e+11)"),
    ],
)
def test_each_contract_rule_names_its_reason(tmp_path, change, reason):
    run = load(with_record_changes(RUNS / "seed-vllm-ollama", tmp_path / "r", {0: change}))
    assert run.warnings == [f"requests.jsonl: 1 record skipped, {reason} (line 1)"]
    assert run.request_count == 19


def test_nan_and_infinity_literals_are_refused(tmp_path):
    """Python's json writes NaN and Infinity for non-finite floats; no duration can be either."""
    shutil.copytree(RUNS / "seed-vllm-ollama", tmp_path / "r")
    path = tmp_path / "r" / "requests.jsonl"
    lines = path.read_text().splitlines()
    lines[0] = lines[0].replace('"ttft_s":0.25', '"ttft_s":NaN')
    lines[1] = lines[1].replace('"e2e_s":1.896633', '"e2e_s":Infinity')
    path.write_text("\n".join(lines) + "\n")
    run = load(tmp_path / "r")
    assert run.warnings == [
        "requests.jsonl: 1 record skipped, ttft_s: out of range (0 to 1e+07) (line 1)",
        "requests.jsonl: 1 record skipped, e2e_s: out of range (0 to 1e+07) (line 2)",
    ]


@pytest.mark.parametrize(
    "itl",
    [
        '"itl_s":[0.1,"0.2"]',
        '"itl_s":[0.1,true]',
        '"itl_s":[false,0.1]',
        '"itl_s":[0.1,null]',
        '"itl_s":[[0.1],0.2]',
        '"itl_s":[0.1,{"a":1}]',
        '"itl_s" : [0.1,true]',  # the key written with spaces
        '"engine_stats":{"itl_s":[1]},"itl_s":[0.1,true]',  # the key first seen inside engine stats
        '"itl_s":[0.1],"engine_stats":{"itl_s":[2]},"x":[true]',  # a second key after the list: checked, accepted
    ],
)
def test_a_compact_number_list_holding_strings_or_booleans_is_refused(tmp_path, itl):
    """The load generator writes compact JSON, where the reader finds each number list by string search instead of
    the regex: a string or true/false in the list is refused as the full check words it, however the key is placed."""
    shutil.copytree(RUNS / "seed-vllm-ollama", tmp_path / "r")
    path = tmp_path / "r" / "requests.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[0])
    for key in ("itl_s", "engine_stats"):
        record.pop(key, None)
    lines[0] = json.dumps(record, separators=(",", ":"))[:-1] + "," + itl + "}"
    path.write_text("\n".join(lines) + "\n")
    run = load(tmp_path / "r")
    if itl.endswith('"x":[true]'):
        assert run.warnings == [] and run.request_count == 20
    else:
        assert run.warnings == [
            "requests.jsonl: 1 record skipped, itl_s: expected a list of numbers, got a list (line 1)"
        ]
        assert run.request_count == 19


def test_a_phase_that_ends_before_it_starts_is_skipped(tmp_path):
    shutil.copytree(RUNS / "seed-vllm-ollama", tmp_path / "r")
    path = tmp_path / "r" / "phases.jsonl"
    lines = path.read_text().splitlines()
    phase = json.loads(lines[2])
    phase["ended_at"] = phase["started_at"] - 1
    lines[2] = json.dumps(phase)
    path.write_text("\n".join(lines) + "\n")
    run = load(tmp_path / "r")
    assert run.warnings == ["phases.jsonl: 1 record skipped, ended_at: before started_at (line 3)"]
    assert len(run.phases) == 5


def test_a_folder_whose_every_record_is_bad_still_gets_a_report(tmp_path, capsys):
    shutil.copytree(RUNS / "seed-vllm-ollama", tmp_path / "r")
    for name in ("requests.jsonl", "phases.jsonl"):
        (tmp_path / "r" / name).write_text("[1, 2]\n" * 3)
    assert cli.main(["--run", str(tmp_path / "r"), "--prometheus", NO_PROMETHEUS]) == 0
    assert "requests.jsonl: 3 records skipped, not a JSON object (lines 1, 2, 3)" in capsys.readouterr().err
    assert json.loads((tmp_path / "r" / "report.json").read_text())["run"]["requests"] == 0


# ---------------------------------------------------------------- fuzz target: run folders

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([1e308, -1e308, 5e-324, 0.0, -0.0, 2**63, 10**30])
    | st.text(max_size=12)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)
REQUEST_KEYS = [f.name for f in REQUEST_FIELDS]
PHASE_KEYS = [f.name for f in PHASE_FIELDS]
MANIFEST_KEYS = ["run_id", "started_at", "ended_at", "engines", "command", "status", "machine", "flags"]
ENGINE_KEYS = ["kind", "model", "quantization", "weights", "flags", "settings", "ignore_eos", "version", "url"]


@st.composite
def edits(draw, keys: list[str]):
    """One change to one line of a JSONL file: a field set to any JSON value or removed, or the line mangled."""
    line = draw(st.integers(0, 1000))  # taken modulo the file's length
    action = draw(st.sampled_from(["set", "set", "set", "drop", "garbage", "truncate", "not-object"]))
    if action in ("set", "drop"):
        return line, action, draw(st.sampled_from(keys)), draw(JSON_VALUES) if action == "set" else None
    return line, action, None, draw(st.text(max_size=20)) if action == "garbage" else draw(st.integers(0, 400))


def apply(path: Path, changes: list) -> None:
    lines = path.read_text().rstrip("\n").split("\n")  # JSONL lines end at \n only, not at \r or \f
    for line, action, key, value in changes:
        line %= len(lines)
        try:
            record = json.loads(lines[line])
        except ValueError:
            record = None
        if action == "set" and isinstance(record, dict):
            record[key] = value
            lines[line] = json.dumps(record)  # NaN/Infinity written as Python writes them
        elif action == "drop" and isinstance(record, dict):
            record.pop(key, None)
            lines[line] = json.dumps(record)
        elif action == "garbage":
            lines[line] = value
        elif action == "truncate":
            lines[line] = lines[line][:value]
        elif action == "not-object":
            lines[line] = json.dumps([lines[line][:10]])
    path.write_text("\n".join(lines) + "\n")


@st.composite
def run_folders(draw):
    """The live-failures fixture with a few fields of its records, phases and manifest set to anything at all."""
    request_changes = draw(st.lists(edits(REQUEST_KEYS), max_size=6))
    phase_changes = draw(st.lists(edits(PHASE_KEYS), max_size=3))
    manifest_changes = draw(
        st.lists(
            st.tuples(st.sampled_from(MANIFEST_KEYS + [f"engine.{k}" for k in ENGINE_KEYS]), JSON_VALUES), max_size=3
        )
    )
    return request_changes, phase_changes, manifest_changes


def fuzzed_copy(dst: Path, request_changes, phase_changes, manifest_changes) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(RUNS / "live-failures", dst)
    apply(dst / "requests.jsonl", request_changes)
    apply(dst / "phases.jsonl", phase_changes)
    manifest = json.loads((dst / "manifest.json").read_text())
    for key, value in manifest_changes:
        if key.startswith("engine."):
            if isinstance(manifest.get("engines"), dict) and isinstance(manifest["engines"].get("llamacpp"), dict):
                manifest["engines"]["llamacpp"][key.split(".", 1)[1]] = value
        else:
            manifest[key] = value
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def lines_in(path: Path) -> int:
    return sum(1 for line in path.read_text().split("\n") if line.strip())


def check_report(folder: Path) -> None:
    """What must hold for any folder: no exception, every line loaded or counted as skipped, strict JSON out."""
    run = load(folder)
    doc, numbers = sections.build(run, NO_PROMETHEUS, None, figures=False)
    render.write(folder, doc, numbers)
    skipped = {
        name: sum(int(w.split(" ", 2)[1]) for w in run.warnings if w.startswith(f"{name}: ") and " skipped, " in w)
        for name in ("requests.jsonl", "phases.jsonl")
    }
    assert run.request_count + skipped["requests.jsonl"] == lines_in(folder / "requests.jsonl")
    assert all(math.isfinite(r.started_at) for i in run.engines for r in run.requests_of(i))
    json.loads((folder / "report.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in report.json"))


@pytest.mark.parametrize("started_at", [253402300800.0, 6.77680361916768e16])
def test_a_manifest_time_past_the_year_9999_is_said_not_raised(tmp_path, started_at):
    """Regression (found by the fuzzer below): the setup section's date raised ValueError / OSError. Such a time
    is no instant a record could hold (the run folder's epoch bounds): the report dates the run by its records."""
    check_report(fuzzed_copy(tmp_path / "f", [], [], [("started_at", started_at)]))
    text = (tmp_path / "f" / "report.md").read_text()
    assert str(started_at) not in text and str(int(started_at)) not in text
    assert re.search(r"20\d\d-\d\d-\d\d", text)  # a real date, from the records


@pytest.mark.slow
@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,  # a fixed seed: the same 30 folders on every run
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(run_folders())
def test_fuzzed_run_folders_always_get_a_report(tmp_path, changes):
    check_report(fuzzed_copy(tmp_path / "fuzzed", *changes))


@settings(max_examples=2, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(run_folders())
def test_fuzzed_run_folders_through_the_cli_with_plots(tmp_path, changes):
    folder = fuzzed_copy(tmp_path / "fuzzed", *changes)
    assert cli.main(["--run", str(folder), "--prometheus", NO_PROMETHEUS]) == 0
    assert (folder / "report.html").exists()


def test_not_a_run_folder_is_still_one_line(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "manifest.json").write_text("[]")
    with pytest.raises(RunError, match="not a JSON object, and no requests.jsonl"):
        load(tmp_path / "r")


def test_a_line_that_is_not_utf8_costs_only_itself(tmp_path):
    shutil.copytree(RUNS / "seed-vllm-ollama", tmp_path / "r")
    path = tmp_path / "r" / "requests.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[3] = b"\xff\xfe" + lines[3]
    path.write_bytes(b"\n".join(lines))
    run = load(tmp_path / "r")
    assert run.warnings == ["requests.jsonl: 1 record skipped, not UTF-8 text (line 4)"]
    assert run.request_count == 19


def test_a_record_torn_inside_a_character_is_a_torn_record(tmp_path):
    """A run killed mid-write can cut a UTF-8 character in two: still the torn last line, not bad text."""
    shutil.copytree(RUNS / "seed-vllm-ollama", tmp_path / "r")
    with open(tmp_path / "r" / "requests.jsonl", "ab") as fh:
        fh.write('{"engine": "vllm", "error": "caf\u00e9'.encode()[:-1])
    run = load(tmp_path / "r")
    assert run.warnings == ["requests.jsonl: 1 record skipped, torn last record (run killed mid-write?) (line 21)"]


def test_garbage_lines_and_a_torn_last_line_are_told_apart(tmp_path):
    shutil.copytree(RUNS / "seed-vllm-ollama", tmp_path / "r")
    path = tmp_path / "r" / "requests.jsonl"
    lines = path.read_text().splitlines()
    lines[1:4] = ["garbage"] * 3
    path.write_text("\n".join(lines) + "\n" + "garbage" + "\n" + lines[5][:40])
    run = load(tmp_path / "r")
    assert run.warnings == [
        "requests.jsonl: 4 records skipped, not a JSON record (lines 2, 3, 4 and 1 more)",
        "requests.jsonl: 1 record skipped, torn last record (run killed mid-write?) (line 22)",
    ]
