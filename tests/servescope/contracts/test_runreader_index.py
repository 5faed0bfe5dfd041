"""The run's index (runfolder.INDEX): made once by the first reader of a run past RUN_INDEX_MIN_MB, opened by the
next ones instead of the JSONL, made again when the files or the reading rules change, and never in the way: a
folder that refuses it, or a broken one, costs one line and the reading goes on from the JSONL."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from servescope.contracts import runfolder, runreader
from servescope.contracts.runcontract import INDEX_SEAL
from servescope.contracts.runfolder import RequestRecord, RunFolder
from servescope.contracts.runreader import RunData
from tests.harness import run_cli
from tests.loadgen.test_cli import _set_writable
from tests.paths import REPO


def record(i: int) -> RequestRecord:
    return RequestRecord(
        "vllm", "vllm", "rate", "rate-1", "openai", "m", "s", "h", f"p{i}", 8, 1e9 + i, True, 200,
        ttft_s=0.01 * (i + 1), e2e_s=0.5, output_tokens=3, itl_s=[0.02, 0.03 * (i % 4), 0.11],
    )  # fmt: skip


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A run of 40 requests with a blank, a refused and a torn line, indexed whatever its size."""
    monkeypatch.setenv("RUN_INDEX_MIN_MB", "0")
    folder = RunFolder.create(tmp_path, "indexed")
    for i in range(40):
        folder.append_request(record(i))
    with open(folder.path / runfolder.REQUESTS, "a") as f:
        f.write('\n{"engine": 3}\n{"engine": "vl')
    return folder.path


def read(path, **kwargs):
    data = RunData(path, files=(runfolder.REQUESTS,), **kwargs)
    try:
        rows = data.con.execute("SELECT seq, ttft_s, itl_s, itl_s_n FROM requests ORDER BY seq").fetchall()
        return rows, data.skips.lines(), data.limits
    finally:
        data.close()


def parses(monkeypatch) -> list[str]:
    """The files parsed from JSON from now on (each table the reader fills from a file)."""
    seen: list[str] = []
    real = runreader._ingest

    def counting(con, view, path, limits):
        if path is not None and path.exists():
            seen.append(f"{view}_lines")
        return real(con, view, path, limits)

    monkeypatch.setattr(runreader, "_ingest", counting)
    return seen


def test_the_first_reader_makes_the_index_and_the_next_reads_it_instead_of_the_json(run, monkeypatch):
    first = read(run, limits=(0.05,))
    index = run / runfolder.INDEX
    assert index.is_file()
    assert sorted(p.name for p in run.iterdir()) == sorted([runfolder.INDEX, INDEX_SEAL, runfolder.REQUESTS])
    made = index.stat()
    seen = parses(monkeypatch)
    again = read(run)  # asks for no limits: gets the ones the index was made with
    assert seen == []
    assert again == first
    assert (index.stat().st_ino, index.stat().st_mtime_ns) == (made.st_ino, made.st_mtime_ns)
    rows, skipped, limits = again
    assert len(rows) == 40 and limits == (0.05,)
    assert skipped == [
        "requests.jsonl: 1 record skipped, engine: expected a string, got an integer (line 42)",
        f"requests.jsonl: 1 record skipped, {runfolder.TORN} (line 43)",
    ]
    monkeypatch.setenv("RUN_INDEX_MIN_MB", "off")
    assert read(run)[:2] == first[:2]  # the JSONL read without an index: the same


def test_a_run_that_grows_or_changes_is_read_again(run, monkeypatch):
    read(run)
    seen = parses(monkeypatch)
    text = (run / runfolder.REQUESTS).read_text()
    (run / runfolder.REQUESTS).write_text(text[: text.rindex("\n") + 1] + json.dumps(record(99).__dict__) + "\n")
    rows, skipped, _ = read(run)
    assert seen == ["requests_lines"]
    assert len(rows) == 41 and rows[-1][1] == pytest.approx(1.0)
    assert skipped == ["requests.jsonl: 1 record skipped, engine: expected a string, got an integer (line 42)"]
    seen.clear()
    (run / runfolder.PHASES).write_text("")  # another file appears: every file is read again (the index holds all)
    read(run)
    assert seen == ["requests_lines", "phases_lines"]


def test_an_index_made_under_other_rules_is_made_again(run, monkeypatch):
    first = read(run)
    seen = parses(monkeypatch)
    monkeypatch.setattr(runreader, "_INDEX_FORMAT", "a later one")
    assert read(run) == first
    assert seen[0] == "requests_lines"
    seen.clear()
    assert read(run) == first and seen == []


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_a_broken_index_is_made_again(run, damage):
    first = read(run)
    index = run / runfolder.INDEX
    body = index.read_bytes()
    index.write_bytes({"garbage": b"not a database" * 100, "truncated": body[: len(body) // 2], "empty": b""}[damage])
    assert read(run) == first
    assert read(run) == first


def test_a_folder_that_refuses_the_index_costs_one_line_and_no_record(run, capsys):
    (run / runfolder.INDEX).mkdir()  # the name is taken: the finished index cannot be put there
    with_refusal = read(run)
    err = capsys.readouterr().err
    assert err == f"run folder {run}: index unreadable (not a regular file): read from the JSONL without it\n", err
    assert len(with_refusal[0]) == 40
    assert sorted(p.name for p in run.iterdir()) == sorted([runfolder.INDEX, runfolder.REQUESTS])


def test_a_small_run_gets_no_index_and_a_bad_threshold_says_so(run, monkeypatch):
    monkeypatch.setenv("RUN_INDEX_MIN_MB", "1")
    read(run)
    assert not (run / runfolder.INDEX).exists()
    monkeypatch.setenv("RUN_INDEX_MIN_MB", "lots")
    with pytest.raises(ValueError, match="RUN_INDEX_MIN_MB='lots': expected megabytes or off"):
        read(run)


def test_the_index_builds_under_the_memory_it_is_given_and_a_bad_limit_says_so(run, monkeypatch):
    from servescope.contracts import runreader

    seen = []
    real = runreader._open_index
    monkeypatch.setattr(runreader, "_open_index", lambda partial, config: seen.append(config) or real(partial, config))
    monkeypatch.setenv("RUN_INDEX_MEMORY_MB", "768")
    read(run)
    assert seen[-1]["memory_limit"] == "768MB" and (run / runfolder.INDEX).exists()
    (run / runfolder.INDEX).unlink()
    monkeypatch.setenv("RUN_INDEX_MEMORY_MB", "")
    read(run)
    assert seen[-1]["memory_limit"] == runreader.INDEX_MEMORY_LIMIT
    (run / runfolder.INDEX).unlink()
    monkeypatch.setenv("RUN_INDEX_MEMORY_MB", "32")
    with pytest.raises(ValueError, match="RUN_INDEX_MEMORY_MB='32': expected whole megabytes, at least 64"):
        read(run)


def test_reading_only_the_phases_of_a_run_makes_no_index(run):
    data = RunData(run, files=(runfolder.PHASES,))
    data.close()
    assert not (run / runfolder.INDEX).exists()


def test_a_folder_that_takes_no_writes_is_read_without_an_index_and_without_a_word(run, monkeypatch, capsys):
    first = read(run)  # made while the folder took writes
    (run / runfolder.INDEX).unlink()
    _set_writable(run, False)
    try:
        assert read(run) == first
        assert capsys.readouterr().err == ""
        assert not (run / runfolder.INDEX).exists()
    finally:
        _set_writable(run, True)
    read(run)
    _set_writable(run, False)  # one made before the folder froze is still opened
    try:
        seen = parses(monkeypatch)
        assert read(run) == first and seen == []
    finally:
        _set_writable(run, True)


# --- a damaged, edited or foreign index: dropped and the JSONL read, in one line ---


def test_flipped_bytes_in_the_index_cost_one_line_and_no_record(run, capsys):
    first = read(run)
    index = run / runfolder.INDEX
    pristine = index.read_bytes()
    capsys.readouterr()
    unreadable = 0
    for position in range(0, len(pristine), len(pristine) // 16 + 1):  # block headers and the data in between
        damaged = bytearray(pristine)
        damaged[position] ^= 0xFF
        index.write_bytes(bytes(damaged))
        assert read(run) == first, position
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) <= 1, (position, err)
        if err:
            assert err[0].startswith(f"run folder {run}: index unreadable (") and err[0].endswith("): rebuilt"), err
            unreadable += 1
        assert read(run) == first and capsys.readouterr().err == ""  # rebuilt (or never damaged): read quietly
    assert unreadable > 0  # the flips reached the data, not only free space


def test_an_index_of_another_database_is_dropped_and_rebuilt(run, capsys):
    import duckdb

    first = read(run)
    index = run / runfolder.INDEX
    index.unlink()
    con = duckdb.connect(str(index))
    con.execute("CREATE TABLE index_meta (name VARCHAR, value VARCHAR)")
    con.execute("CREATE VIEW requests_lines AS SELECT 1 AS x")
    con.close()
    assert read(run) == first
    assert read(run) == first


def test_an_edit_in_place_that_keeps_size_and_time_is_read_again(run):
    """The index checks a hash of each JSONL's head and tail, not only its size and modification time."""
    first = read(run)
    path = run / runfolder.REQUESTS
    before = path.stat()
    text = path.read_text()
    edited = text.replace('"ttft_s":0.01,', '"ttft_s":9.92,', 1)
    assert len(edited) == len(text) and edited != text
    path.write_text(edited)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    rows = read(run)[0]
    assert rows[0][1] == pytest.approx(9.92) and rows[1:] == first[0][1:]


READ_IN_A_CHILD = """
import sys
from servescope.contracts import runfolder
from servescope.contracts.runreader import RunData
try:
    data = RunData(sys.argv[1], files=(runfolder.REQUESTS,))
    print(data.con.execute("SELECT count(*) FROM requests").fetchone()[0])
except ValueError as exc:
    print("refused:", exc)
"""


def read_in_a_child(path) -> subprocess.CompletedProcess:
    """A reader that would open a FIFO waits forever: in a child, with a generous timeout."""
    return subprocess.run(
        [sys.executable, "-c", READ_IN_A_CHILD, str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RUN_INDEX_MIN_MB": "0"},
    )


def test_a_fifo_in_place_of_the_index_is_never_opened(run):
    (run / runfolder.INDEX).unlink(missing_ok=True)
    os.mkfifo(run / runfolder.INDEX)
    done = read_in_a_child(run)
    assert done.stdout.strip() == "40", done.stderr
    assert done.stderr.strip().splitlines() == [f"run folder {run}: index unreadable (not a regular file): rebuilt"]
    assert (run / runfolder.INDEX).is_file()


@pytest.mark.parametrize("name", [runfolder.REQUESTS, runfolder.PHASES])
def test_a_fifo_in_place_of_a_jsonl_is_one_line(run, name):
    (run / name).unlink(missing_ok=True)
    os.mkfifo(run / name)
    done = read_in_a_child(run)
    assert done.stdout.strip() == f"refused: {run / name}: not a regular file: a run's records are files", done.stderr


def test_a_report_on_a_folder_with_fifos_for_records_is_one_line(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    os.mkfifo(folder / runfolder.MANIFEST)
    os.mkfifo(folder / runfolder.REQUESTS)
    done = run_cli(
        *["report", "--run", str(folder), "--prometheus", "http://127.0.0.1:9"],
        timeout=120,  # a reader that opened a FIFO would wait forever
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"report: {folder / runfolder.REQUESTS}: not a regular file: a run's records are files"
    ]


def test_a_runs_index_is_built_under_a_smaller_memory_limit_unless_large_or_the_caller_says(run, monkeypatch):
    duckdb = runreader.engine()  # the module the reader connects through

    limits: dict[str, str] = {}
    real, real_open = duckdb.connect, runreader._open_index
    into_file: list[bool] = []

    def connect(database=":memory:", *args, config=None, **kwargs):
        limits.setdefault("read", (config or {}).get("memory_limit"))
        return real(database, *args, config=config, **kwargs)

    def open_index(partial, config):
        assert str(partial).endswith(".partial")  # the index being built
        limits["build"] = config.get("memory_limit")
        con = real_open(partial, config)
        into_file.append(con.execute("SELECT current_database()").fetchone()[0] == runreader._BUILDING)
        return con

    monkeypatch.setattr(duckdb, "connect", connect)
    monkeypatch.setattr(runreader, "_open_index", open_index)
    rows, _skips, _limits = read(run)
    assert limits == {"read": runreader.MEMORY_LIMIT, "build": runreader.INDEX_MEMORY_LIMIT}
    assert into_file == [True]  # the tables go into the index file, not the connection's memory
    assert len(rows) == 40  # built and read back whole under the smaller limit
    (run / runfolder.INDEX).unlink()
    limits.clear()
    read(run, memory_limit="64MB")
    assert limits == {"read": "64MB", "build": "64MB"}
    (run / runfolder.INDEX).unlink()
    limits.clear()
    monkeypatch.setattr(runreader, "FILE_BACKED_BYTES", 0)  # a run past it: the smaller limit would spill
    read(run)
    assert limits["build"] == runreader.MEMORY_LIMIT


def test_the_index_is_written_in_row_groups_of_its_own_size_and_holds_the_jsonls_rows(tmp_path, monkeypatch):
    """A row group is held whole until written: the index's are INDEX_ROW_GROUP_ROWS, whatever the engine's default,
    and the rows read back from them (each group's row numbers the lines') are those read from the JSONL."""
    import duckdb

    monkeypatch.setenv("RUN_INDEX_MIN_MB", "0")
    monkeypatch.setattr(runreader, "INDEX_ROW_GROUP_ROWS", 2048)  # the engine's smallest (its vector size)
    folder = RunFolder.create(tmp_path, "grouped")
    with open(folder.path / runfolder.REQUESTS, "w") as f:
        f.writelines(record(i).to_json() + "\n" for i in range(5000))
    indexed = read(folder.path)
    con = duckdb.connect(str(folder.path / runfolder.INDEX), read_only=True)
    try:
        sizes = con.execute(
            "SELECT count FROM pragma_storage_info('requests_lines') WHERE column_id = 0 AND segment_type <> 'VALIDITY'"
        ).fetchall()
    finally:
        con.close()
    assert len(sizes) == 3 and max(n for (n,) in sizes) <= 2048
    monkeypatch.setenv("RUN_INDEX_MIN_MB", "off")
    assert read(folder.path) == indexed and len(indexed[0]) == 5000


def test_flipped_bytes_that_keep_the_files_size_and_times_cost_one_line_and_no_record(run, capsys):
    """Issue 42: a flip that left the index's modification time as it was sealed (a disk's, a copy that keeps times)
    skipped the whole-read check and crashed the report halfway (`_duckdb.Error: Corrupt database file`; 31 of 96
    flips here). The seal's checksum beside the index catches it: made again, one line. (24 places here: each costs
    a rebuild; the property test below flips at random.)"""
    first = read(run)
    index = run / runfolder.INDEX
    pristine, made = index.read_bytes(), index.stat()
    capsys.readouterr()
    rebuilt = 0
    for k in range(24):
        damaged = bytearray(pristine)
        damaged[len(pristine) * k // 24] ^= 0xFF
        index.write_bytes(bytes(damaged))
        os.utime(index, ns=(made.st_atime_ns, made.st_mtime_ns))  # the damage keeps the times it was sealed with
        assert read(run) == first, k
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].endswith("): rebuilt"), (k, err)
        rebuilt += 1
        assert read(run) == first and capsys.readouterr().err == ""  # rebuilt: read quietly
        pristine, made = index.read_bytes(), index.stat()
    assert rebuilt == 24


def test_a_crafted_index_description_is_never_trusted(run, capsys):
    """The index's own description (limits, set-aside tables) is read as a schema: a crafted one with the right
    fingerprint and stamps is made again in one line, never a ValueError or a KeyError halfway through."""
    import duckdb

    first = read(run)
    index = run / runfolder.INDEX
    capsys.readouterr()
    for name, value in (("limits", "banana"), ("limits", '["x"]'), ("set aside requests.jsonl", "secrets")):
        con = duckdb.connect(str(index))
        con.execute("UPDATE index_meta SET value = ? WHERE name = ?", [value, name])
        con.close()
        assert read(run) == first, (name, value)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "index unreadable (" in err[0] and err[0].endswith("): rebuilt"), err


def test_any_damage_to_the_index_reads_the_records_as_the_jsonl_holds_them(tmp_path_factory):
    """Property (fixed seed): whatever is done to the index and its seal (bytes flipped, cut or added, times kept or
    not, the seal garbled or gone), a read gives the JSONL's records, says at most one line, never raises."""
    import contextlib
    import io

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    folder = tmp_path_factory.mktemp("prop") / "indexed"
    mp = pytest.MonkeyPatch()
    mp.setenv("RUN_INDEX_MIN_MB", "0")
    try:
        made = RunFolder.create(folder.parent, folder.name)
        for i in range(40):
            made.append_request(record(i))
        first = read(folder)
        index, seal = folder / runfolder.INDEX, folder / INDEX_SEAL
        pristine, pristine_seal, stamp = index.read_bytes(), seal.read_bytes(), index.stat()

        @settings(derandomize=True, max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
        @given(
            flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), max_size=4),
            cut=st.none() | st.floats(0, 1),
            extra=st.binary(max_size=64),
            keep_times=st.booleans(),
            seal_change=st.sampled_from(["kept", "gone", "garbled", "another's"]),
        )
        def damage(flips, cut, extra, keep_times, seal_change):
            body = bytearray(pristine)
            for where, mask in flips:
                body[int(where * len(body))] ^= mask
            if cut is not None:
                body = body[: int(cut * len(body))]
            index.write_bytes(bytes(body) + extra)
            if keep_times:
                os.utime(index, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
            if seal_change == "gone":
                seal.unlink(missing_ok=True)
            elif seal_change == "garbled":
                seal.write_bytes(b'{"size": [1], "crc32": 7')
            elif seal_change == "another's":
                seal.write_text(json.dumps({"size": len(body) + len(extra), "mtime_ns": 1, "crc32": "0"}))
            else:
                seal.write_bytes(pristine_seal)
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                assert read(folder) == first
            assert len(err.getvalue().strip().splitlines()) <= 1, err.getvalue()

        damage()
    finally:
        mp.undo()
