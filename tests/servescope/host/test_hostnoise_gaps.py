"""A host reading that fails (no file descriptor to spare) is a gap in a phase's noise, said once: never an end."""

from __future__ import annotations

import errno
import json

from loadgen import trials
from servescope.contracts.runfolder import PhaseRecord
from servescope.host import hostnoise
from tests.harness import run_python

EXHAUST = """
import json, os, resource
from servescope.host import hostnoise

watch = hostnoise.Watch(hostnoise.Roles())
watch.begin()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
noise = watch.measure()
print(json.dumps({"noise": noise, "unread": watch.unread, "held": len(held)}))
"""


def test_a_process_out_of_file_descriptors_reads_a_gap_not_an_end():
    """Issue 42: a load generator whose file descriptors a local process had taken ended its run at the first phase's
    end (`OSError: [Errno 24] Too many open files: '/proc'`, hostnoise.py). The phase's noise is a gap that says why."""
    proc = run_python("-c", EXHAUST, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["held"] > 0 and result["noise"] is None, result
    assert result["unread"].startswith("host noise not read: ") and "Too many open files" in result["unread"]


def test_a_process_table_read_short_of_descriptors_is_no_partial_table(monkeypatch, tmp_path):
    """A /proc/<pid>/stat that cannot be opened for want of a descriptor is not a process that exited: leaving it out
    would charge the whole machine's CPU to 'exited processes'. The reading fails instead (a gap)."""
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "stat").write_text("1 (init) S 0 " + "0 " * 30)

    def no_descriptor(*_a, **_k):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(hostnoise, "open", no_descriptor, raising=False)
    watch = hostnoise.Watch(hostnoise.Roles(), root=tmp_path)
    watch.begin()
    assert watch.start is None and watch.measure() is None
    assert "Too many open files" in (watch.unread or "")


def test_the_keeper_says_a_gap_once_and_counts_the_others(monkeypatch):
    said: list[str] = []
    keeper = trials.NoiseKeeper([], meters=[], say=said.append)

    def unreadable(_root):
        raise hostnoise.Unread(errno.EMFILE, "cannot list /proc: Too many open files")

    monkeypatch.setattr(hostnoise, "read_procs", unreadable)
    for n in (1, 2, 3):
        keeper.watch = hostnoise.Watch(hostnoise.Roles())
        keeper.watch.begin()
        record = PhaseRecord("vllm", "vllm", "burst", f"burst-{n}", 0.0, 1.0, 4, 4, "p", "x", 4)
        keeper.annotate(record)
        assert record.noise is None
    keeper.close()
    assert said[0] == (
        "vllm burst-1: host noise not read: cannot list /proc: Too many open files: a gap in its noise, the run goes on"
    )
    assert len(said) == 2 and "3 phase records" in said[1], said
