"""Writers stay in their folder: a link, a FIFO or a hard link planted at a run folder file's name is never written
through (servescope/contracts/runfolder.py's write_file and open_append, which every run-folder writer uses)."""

from __future__ import annotations

import os

import pytest

from loadgen.recorder import Recorder
from servescope.contracts.runfolder import MANIFEST, REQUESTS, RequestRecord, RunFolder, open_append, write_file

VICTIM_TEXT = "the victim's own words\n"


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim"
    path.write_text(VICTIM_TEXT)
    return path


def _record() -> RequestRecord:
    return RequestRecord("vllm", "vllm", "burst", "burst-1", "openai", "m", "p", "x", "p1", 4, 1e9, True, 200)


def test_a_whole_file_write_replaces_a_link_at_its_name(tmp_path, victim):
    folder = RunFolder.create(tmp_path, "run")
    (folder.path / MANIFEST).symlink_to(victim)
    folder.write_manifest({"run_id": "run"})
    assert victim.read_text() == VICTIM_TEXT
    assert not (folder.path / MANIFEST).is_symlink() and folder.manifest()["run_id"] == "run"
    assert sorted(os.listdir(folder.path)) == [MANIFEST]  # no temp file left behind


def test_an_append_refuses_a_link_a_fifo_and_a_hard_link(tmp_path, victim):
    link, fifo, hard = tmp_path / "link.jsonl", tmp_path / "fifo.jsonl", tmp_path / "hard.jsonl"
    link.symlink_to(victim)
    os.mkfifo(fifo)  # opened for writing, it would block until a reader came
    os.link(victim, hard)
    for path in (link, fifo, hard):
        with pytest.raises(OSError):
            open_append(path)
    assert victim.read_text() == VICTIM_TEXT
    with open_append(tmp_path / "fresh.jsonl") as fh:
        fh.write("one\n")
    with open_append(tmp_path / "fresh.jsonl", binary=True) as fh:
        fh.write(b"two\n")
    assert (tmp_path / "fresh.jsonl").read_text() == "one\ntwo\n"


def test_a_run_whose_records_file_is_a_link_writes_nothing_through_it_and_says_why(tmp_path, victim):
    """The recorder's writes stop (once said), the process does not; the link's target is untouched."""
    folder = RunFolder.create(tmp_path, "run")
    (folder.path / REQUESTS).symlink_to(victim)
    said: list[str] = []
    recorder = Recorder(folder, out=None, on_failure=said.append)
    recorder.request(_record())
    recorder.request(_record())
    assert victim.read_text() == VICTIM_TEXT
    assert len(said) == 1 and "cannot write requests.jsonl" in said[0]


def test_a_directory_at_the_name_is_an_oserror_and_leaves_no_temp_file(tmp_path):
    (tmp_path / "report.md").mkdir()
    with pytest.raises(OSError):
        write_file(tmp_path / "report.md", "text")
    assert sorted(os.listdir(tmp_path)) == ["report.md"]
