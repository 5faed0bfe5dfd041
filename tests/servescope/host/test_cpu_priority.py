"""CPU priority (servescope/host/cpu_priority.py) on fake cgroup trees (v1, v2, refused, exited pids), and once for real as root."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from servescope.host import cpu_priority
from tests.conftest import unavailable
from tests.doubles.synthetic_openai import SyntheticProcess

NAME = "servescope-test"  # the fake trees' group; the real test's is named for its own process


class Tree:
    """A fake host: a mount table, the cgroup files the kernel would show, and a process table (/proc)."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.mounts = root / "mounts"
        self.mounts.write_text("")
        self.proc = root / "proc"
        self.proc.mkdir()

    def mount(self, point: str, kind: str, options: str = "rw") -> Path:
        path = self.root / point
        path.mkdir(parents=True, exist_ok=True)
        escaped = str(path).replace(" ", "\\040")
        with self.mounts.open("a") as fh:
            fh.write(f"{kind} {escaped} {kind} {options} 0 0\n")
        return path

    def v1(self) -> Path:
        """cgroup v1's cpu hierarchy, and beside it a cgroup2 mount without the cpu controller (a hybrid host)."""
        self.mount("unified", "cgroup2", "rw,relatime")
        (self.root / "unified" / "cgroup.controllers").write_text("\n")
        cpu = self.mount("cgroup/cpu", "cgroup", "rw,relatime,cpu")
        for group, files in ((cpu, ("cgroup.procs",)), (cpu / NAME, ("cgroup.procs", "cpu.shares"))):
            group.mkdir(exist_ok=True)
            for name in files:
                (group / name).write_text("")
        return cpu

    def v2(self, subtree: str = "memory") -> Path:
        root = self.mount("cgroup", "cgroup2", "rw,nsdelegate")
        (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        (root / "cgroup.subtree_control").write_text(subtree + "\n")
        (root / "cgroup.procs").write_text("")
        (root / NAME).mkdir()
        for name in ("cgroup.procs", "cpu.weight"):
            (root / NAME / name).write_text("")
        return root

    def process(self, pid: int, ppid: int, cgroup: str = "1:cpu:/") -> None:
        (self.proc / str(pid)).mkdir()
        (self.proc / str(pid) / "stat").write_text(f"{pid} (busy (x)) S {ppid} {pid} {pid} 0 -1 0\n")
        (self.proc / str(pid) / "cgroup").write_text(cgroup + "\n")

    def apply(self, pids, **kwargs) -> cpu_priority.Priority:
        kwargs.setdefault("mode", "auto")
        kwargs.setdefault("multiple", 10.0)
        kwargs.setdefault("euid", 0)
        return cpu_priority.apply(pids, name=NAME, mounts=self.mounts, proc=self.proc, **kwargs)


@pytest.fixture
def tree(tmp_path):
    return Tree(tmp_path)


def written(path: Path) -> list[str]:
    return path.read_text().split()


def test_v1_sets_the_shares_and_moves_each_process_with_its_children(tree):
    cpu = tree.v1()
    tree.process(100, 1)
    tree.process(101, 100)  # a child already there (vLLM's engine core)
    tree.process(102, 101)
    tree.process(200, 1)  # not ours
    result = tree.apply([100])
    assert result.applied and result.reason is None
    assert (result.controller, result.weight, result.path) == ("v1 cpu.shares", 10240, str(cpu / NAME))
    assert written(cpu / NAME / "cpu.shares") == ["10240"]
    assert written(cpu / NAME / "cgroup.procs") == ["100", "101", "102"] and result.pids == [100, 101, 102]
    result.who = {"load generator": [100], "vllm": [101]}
    line = result.describe()
    assert line.startswith("CPU priority: the engine (vllm) and the load generator run in cgroup ")
    assert f"{cpu / NAME} at cpu.shares 10240 (10x a default group)" in line
    assert line.endswith("(CPU_PRIORITY=off to turn off)") and "\n" not in line
    data = result.as_dict()
    assert json.loads(json.dumps(data)) == data and "origins" not in data


def test_v2_hands_the_cpu_controller_down_and_caps_the_weight(tree):
    root = tree.v2()
    tree.process(100, 1, "0::/user.slice/session-1.scope")
    result = tree.apply([100], multiple=200)
    assert result.applied and (result.controller, result.weight) == ("v2 cpu.weight", 10000)
    assert written(root / "cgroup.subtree_control") == ["+cpu"]
    assert written(root / NAME / "cpu.weight") == ["10000"]
    assert written(root / NAME / "cgroup.procs") == ["100"]
    assert tree.apply([], multiple=10).weight == 1000


def test_v2_with_the_controller_already_handed_down_is_left_as_it_is(tree):
    root = tree.v2(subtree="cpu memory")
    assert tree.apply([]).applied
    assert written(root / "cgroup.subtree_control") == ["cpu", "memory"]


def test_the_controller_is_found_in_the_mount_table(tree):
    assert cpu_priority.find_controller(tree.mounts) is None
    cpu = tree.v1()
    assert cpu_priority.find_controller(tree.mounts) == cpu_priority.Controller(1, cpu)  # unified lists no cpu
    (tree.root / "unified" / "cgroup.controllers").write_text("cpu io\n")
    assert cpu_priority.find_controller(tree.mounts) == cpu_priority.Controller(2, tree.root / "unified")
    spaced = Tree(tree.root / "with space")
    point = spaced.mount("cpu,cpuacct", "cgroup", "rw,cpu,cpuacct")
    assert cpu_priority.find_controller(spaced.mounts) == cpu_priority.Controller(1, point)
    spaced.mounts.write_text(f"cgroup {point} cgroup rw,cpuacct,cpuset 0 0\n")  # cpuacct and cpuset are not cpu
    assert cpu_priority.find_controller(spaced.mounts) is None


def test_not_root_no_controller_and_off_are_not_applied_and_say_why(tree):
    tree.v1()
    not_root = tree.apply([1], euid=1000)
    assert (not_root.applied, not_root.reason) == (False, "not root")
    assert not_root.describe() == (
        "CPU priority: not applied (not root): other programs compete for the CPU as equals (CPU_PRIORITY=auto)"
    )
    missing = Tree(tree.root / "bare").apply([1])  # nothing mounted
    assert not missing.applied and missing.reason.startswith("no cpu controller mounted")
    off = cpu_priority.apply([1], mode="off", mounts=tree.root / "nowhere")
    assert (off.applied, off.reason) == (False, "CPU_PRIORITY=off")
    assert off.describe() == "CPU priority: off (CPU_PRIORITY=off): other programs compete for the CPU as equals"


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (errno.EROFS, "read-only file system"),
        (errno.EACCES, "permission denied"),
        (errno.ENOENT, "no such file (the cpu controller is not enabled there)"),
    ],
)
def test_a_group_that_cannot_be_written_is_not_applied_with_the_file_and_why(tree, monkeypatch, code, words):
    cpu = tree.v1()
    tree.process(100, 1)

    def refuse(path, text, append=False):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(cpu_priority, "_write", refuse)
    result = tree.apply([100])
    assert not result.applied and result.pids == []
    assert result.reason == f"cannot write {cpu / NAME / 'cpu.shares'}: {words}"
    assert result.describe().startswith(f"CPU priority: not applied (cannot write {cpu / NAME / 'cpu.shares'}: ")


def test_a_missing_weight_file_is_said_as_such(tree):
    cpu = tree.v1()
    (cpu / NAME / "cpu.shares").unlink()  # a group the cpu controller does not serve
    result = tree.apply([])
    assert (
        result.reason
        == f"cannot write {cpu / NAME / 'cpu.shares'}: no such file (the cpu controller is not enabled there)"
    )


def test_a_pid_that_exited_is_noted_as_gone_and_the_rest_are_moved(tree, monkeypatch):
    cpu = tree.v1()
    tree.process(100, 1)
    tree.process(101, 1)
    write = cpu_priority._write

    def exits_meanwhile(path, text, append=False):
        if text.strip() == "101":  # listed, then gone before its move
            raise OSError(errno.ESRCH, "No such process")
        write(path, text, append)

    monkeypatch.setattr(cpu_priority, "_write", exits_meanwhile)
    result = tree.apply([100, 101, 300])  # 300: not in the process table at all
    assert result.applied and result.pids == [100] and sorted(result.gone) == [101, 300]
    assert written(cpu / NAME / "cgroup.procs") == ["100"]


def test_a_move_the_kernel_refuses_puts_back_what_was_moved_and_is_not_applied(tree, monkeypatch):
    cpu = tree.v1()
    tree.process(100, 1)
    tree.process(101, 1)
    write = cpu_priority._write

    def refuses_the_second(path, text, append=False):
        if text.strip() == "101":
            raise OSError(errno.EINVAL, "Invalid argument")
        write(path, text, append)

    monkeypatch.setattr(cpu_priority, "_write", refuses_the_second)
    result = tree.apply([100, 101])
    assert not result.applied and result.pids == []
    assert result.reason == f"cannot write {cpu / NAME / 'cgroup.procs'}: invalid argument (pid 101)"
    assert written(cpu / "cgroup.procs") == ["100"]  # back where it was


def test_restore_puts_a_process_back_where_it_was_and_leaves_one_that_was_in_the_group(tree):
    cpu = tree.v1()
    (cpu / "user").mkdir()
    (cpu / "user" / "cgroup.procs").write_text("")
    tree.process(100, 1, "1:cpu:/user")
    tree.process(101, 1, f"1:cpu:/{NAME}")  # `make up` put it there
    result = tree.apply([100, 101])
    assert result.pids == [100, 101]
    result.restore([100, 101], tree.mounts)
    assert written(cpu / "user" / "cgroup.procs") == ["100"] and written(cpu / "cgroup.procs") == []


def test_a_process_under_a_cpu_limit_of_its_own_stays_there(tree):
    cpu = tree.v1()
    (cpu / "docker" / "abc").mkdir(parents=True)
    (cpu / "docker" / "abc" / "cpu.cfs_quota_us").write_text("50000\n")
    (cpu / "docker" / "cpu.cfs_quota_us").write_text("-1\n")
    tree.process(100, 1, "1:cpu:/docker/abc")
    tree.process(101, 1, "1:cpu:/docker")
    result = tree.apply([100, 101])
    assert result.applied and result.pids == [101]
    assert result.kept == {"100": "its cgroup /docker/abc limits its CPU (50000)"}
    result.who = {"vllm": [100, 101]}
    assert "; left where they were: pid 100 (its cgroup /docker/abc limits its CPU (50000))" in result.describe()


def test_on_where_it_cannot_be_applied_is_one_line_that_stops_the_run(tree):
    tree.v1()
    with pytest.raises(cpu_priority.Refused) as refused:
        tree.apply([1], mode="on", euid=1000)
    text = str(refused.value)
    assert "\n" not in text and text.startswith("CPU priority: not applied (not root); CPU_PRIORITY=on")
    assert isinstance(refused.value, ValueError)  # the load generator's usage errors: one line, exit 2
    assert tree.apply([], mode="on").applied  # where it can be, "on" is "auto"


def test_the_knobs_are_checked_with_one_line_naming_them(monkeypatch):
    monkeypatch.setenv("CPU_PRIORITY", "always")
    with pytest.raises(ValueError, match=r"^CPU_PRIORITY='always': expected auto, on or off$"):
        cpu_priority.mode_knob()
    monkeypatch.setenv("CPU_PRIORITY", " ON ")
    assert cpu_priority.mode_knob() == "on"
    monkeypatch.setenv("CPU_PRIORITY_WEIGHT", "0")
    with pytest.raises(ValueError, match=r"^CPU_PRIORITY_WEIGHT='0': expected a number from 1 to 100$"):
        cpu_priority.multiple_knob()


def test_the_report_line_says_it_in_the_past_and_reads_any_record():
    applied = {
        "mode": "auto",
        "applied": True,
        "controller": "v2 cpu.weight",
        "weight": 1000,
        "multiple": 10,
        "path": "/sys/fs/cgroup/servescope",
        "who": {"load generator": [1], "vllm": [2], "llamacpp": [3]},
    }
    assert cpu_priority.report_line({"cpu_priority": applied}) == (
        "CPU priority: the engines (vllm, llamacpp) and the load generator ran in cgroup /sys/fs/cgroup/servescope "
        "at cpu.weight 1000 (10x a default group): other programs got the CPU when these were idle (CPU_PRIORITY=auto)."
    )
    refused = {"mode": "auto", "applied": False, "reason": "not root"}
    assert cpu_priority.report_line({"cpu_priority": refused}) == (
        "CPU priority: not applied (not root): other programs competed for the CPU as equals (CPU_PRIORITY=auto)."
    )
    assert cpu_priority.report_line({"repetitions": 3}) is None  # a run from before it existed
    assert cpu_priority.report_line(None) is None
    for odd in ({"applied": True, "who": 7, "multiple": "x", "kept": []}, {"applied": "yes"}, {}):
        assert cpu_priority.report_line({"cpu_priority": odd}).startswith("CPU priority: ")


def test_a_run_finds_its_engines_on_this_host_by_their_port(monkeypatch, tmp_path):
    """protect_run moves the load generator and what listens on each local engine's port; a remote one is left."""
    monkeypatch.setenv("SERVESCOPE_STATE", str(tmp_path))  # no pid records: the port is how it is found
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    asked = []

    def fake_apply(pids, **kwargs):
        asked.append(list(pids))
        return cpu_priority.Priority(kwargs["mode"], True, pids=list(pids))

    monkeypatch.setattr(cpu_priority, "apply", fake_apply)
    at_exit = []
    monkeypatch.setattr(cpu_priority.atexit, "register", lambda *a: at_exit.append(a))
    with SyntheticProcess() as engine:
        result = cpu_priority.protect_run(
            [("llamacpp", "llamacpp", engine.url), ("vllm", "vllm", "http://192.0.2.1:8000")], mode="auto"
        )
        assert asked == [[os.getpid(), engine.proc.pid]]
    assert result.who == {"load generator": [os.getpid()], "llamacpp": [engine.proc.pid]}
    assert at_exit == [(result.restore, [engine.proc.pid])]  # the engine goes back when the run ends; not this one
    cpu_priority.protect_run([("llamacpp", "llamacpp", "http://127.0.0.1:9")], mode="off")
    assert asked[-1] == [os.getpid()]  # off: no engine looked for


def test_a_run_moves_servescopes_observers_with_its_engines(monkeypatch, tmp_path):
    """The exporter reads the engines while they run: outside the group it would starve beside an engine in it."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(
        cpu_priority, "apply", lambda pids, **kw: cpu_priority.Priority(kw["mode"], True, pids=list(pids))
    )
    monkeypatch.setattr(cpu_priority.atexit, "register", lambda *a: None)
    monkeypatch.setenv("SERVESCOPE_STATE", str(tmp_path))  # no pid records: only the observer named below
    with SyntheticProcess() as engine:
        observer = SyntheticProcess()
        with observer:
            monkeypatch.setenv("LOADGEN_OBSERVER_PIDS", f"exporter={observer.proc.pid}")
            result = cpu_priority.protect_run([("llamacpp", "llamacpp", engine.url)], mode="auto")
    assert result.who["observers"] == [observer.proc.pid] and result.who["llamacpp"] == [engine.proc.pid]
    said = cpu_priority.line({**result.as_dict(), "controller": "v1 cpu.shares", "weight": 10240, "multiple": 10})
    assert said.startswith(
        "CPU priority: the engine (llamacpp), servescope's observers and the load generator run in cgroup"
    )


# ---------------------------------------------------------------- for real


def test_as_root_a_process_and_its_child_move_into_the_group_and_back(tmp_path):
    """The kernel's own files: a child and its grandchild move, /proc/PID/cgroup says so; then all is put back."""
    controller = cpu_priority.find_controller()
    if os.geteuid() != 0:
        unavailable("not root: the cgroup move needs root")
    if controller is None or not os.access(controller.root, os.W_OK):
        unavailable("no writable cpu controller here (cgroup v1 cpu or cgroup2 with cpu)")
    name = f"servescope-test-{os.getpid()}"
    script = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nelse:\n    print('forked', flush=True)\n    time.sleep(60)\n"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    moved: list[int] = []
    family = [child.pid]
    try:
        assert child.stdout.readline().strip() == "forked"
        grandchild = psutil.Process(child.pid).children()[0].pid
        family.insert(0, grandchild)
        result = cpu_priority.apply([child.pid], mode="on", multiple=2, name=name)
        moved = result.pids
        assert result.applied and moved == [child.pid, grandchild]
        value = "2048" if controller.version == 1 else "200"
        assert (controller.root / name / controller.weight_file).read_text().strip() == value
        for pid in moved:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
            if controller.version == 1:
                assert any("cpu" in x.split(":")[1].split(",") and x.endswith(f":/{name}") for x in lines), lines
            else:
                assert f"0::/{name}" in lines, lines
    finally:
        cpu_priority.release(moved)  # back to the root group, then the test's own group removed
        for pid in family:  # the grandchild first, while its parent still names it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        child.wait(10)
        deadline = time.monotonic() + 10
        while not cpu_priority.remove(name) and (controller.root / name).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert not (controller.root / name).exists()
