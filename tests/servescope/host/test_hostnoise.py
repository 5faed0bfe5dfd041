"""Host noise per phase against real processes: a busy hog is named with its CPU share, the engine and other engines are told apart, the rule flags."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types

import psutil
import pytest

from servescope.contracts.thresholds import NoiseRule
from servescope.host import hostnoise, listening, pidrecords
from servescope.text import numbers
from tests.doubles.synthetic_openai import SyntheticProcess
from tests.paths import REPO

HOG = "python -m tests.doubles.cpu_hog"
# Its hogs spin at nice -20 (they would starve a parallel worker's timed tests) and its shares are read off
# the whole machine: run alone.
pytestmark = pytest.mark.serial
RULE = NoiseRule(group_cores=0.25, foreign_cores=0.5, steal_share=0.05, outlier_ratio=3)


def start_hog(*args: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.doubles.cpu_hog", "--seconds", "30", "--nice", "-20", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "busy"
    return proc


def spin_until_cpu(proc: psutil.Process, seconds: float, deadline_s: float = 30.0) -> None:
    """Wait (polling, with a deadline) until the process has used `seconds` of CPU."""
    deadline = time.monotonic() + deadline_s
    while sum(proc.cpu_times()[:2]) < seconds:
        assert time.monotonic() < deadline, "the hog got no CPU"
        time.sleep(0.02)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(10)


def group(noise: dict, name: str) -> dict | None:
    return next((g for g in noise["groups"] if g["name"] == name), None)


@pytest.fixture
def idle_engine():
    """A process standing in for the engine under test (it does nothing): the hog is not under it."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    stop(proc)


def test_a_hog_is_named_with_its_cpu_share(idle_engine):
    watch = hostnoise.Watch(hostnoise.Roles(engine={idle_engine.pid}, engine_how="a sleep"))
    watch.begin()
    hog = start_hog()
    try:
        spin_until_cpu(psutil.Process(hog.pid), 0.5)
        used_before = sum(psutil.Process(hog.pid).cpu_times()[:2])
        noise = watch.measure()
        used_after = sum(psutil.Process(hog.pid).cpu_times()[:2])
    finally:
        stop(hog)
    found = group(noise, HOG)
    assert found is not None and found["kind"] == "process", noise["groups"]
    # /proc counts in clock ticks (10 ms): the share is the hog's own CPU over the window, within a tick or two.
    seconds = found["cores"] * noise["window_s"]
    assert used_before - 0.03 <= seconds <= used_after + 0.03
    assert noise["foreign_cores"] >= found["cores"]
    assert noise["engine_found"] and noise["engine_cores"] is not None
    flags = hostnoise.flags(noise, "llamacpp", RULE)
    flag = next((f for f in flags if HOG in f), "")
    assert f"{numbers.cores(found['cores'])} used by {HOG}" in flag, flags
    assert flag.endswith("while measuring llamacpp")


def test_the_engine_and_another_engine_are_told_apart_from_other_processes():
    hog = start_hog()
    other = start_hog()
    try:
        roles = hostnoise.Roles(engine={hog.pid}, others={"vllm": {other.pid}})
        watch = hostnoise.Watch(roles)
        watch.begin()
        for proc in (psutil.Process(hog.pid), psutil.Process(other.pid)):
            spin_until_cpu(proc, sum(proc.cpu_times()[:2]) + 0.3)
        noise = watch.measure()
    finally:
        stop(hog)
        stop(other)
    assert noise["engine_cores"] > 0.1  # the engine under test's own CPU, not noise
    assert group(noise, HOG) is None
    vllm = group(noise, "vllm")
    assert vllm is not None and vllm["kind"] == "other engine" and vllm["cores"] > 0
    any_share = NoiseRule(group_cores=0.01, foreign_cores=99, steal_share=1, outlier_ratio=3)
    (flag,) = hostnoise.flags(noise, "llamacpp", any_share)
    assert "used by vllm" in flag and flag.endswith("while measuring llamacpp")


def test_a_reaped_child_is_not_charged_to_its_parent(idle_engine):
    """Regression: a parent that reaps a child gains the child's whole life in cutime; only its own CPU counts."""
    script = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-m', 'tests.doubles.cpu_hog', '--seconds', '30'], "
        "stdout=subprocess.PIPE, text=True)\n"
        "print(child.pid, child.stdout.readline().strip(), flush=True)\n"
        "child.wait()\n"
        "print('reaped', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        child_pid, state = parent.stdout.readline().split()
        assert state == "busy"
        child = psutil.Process(int(child_pid))
        spin_until_cpu(child, 0.6)  # the child's CPU before the window
        watch = hostnoise.Watch(hostnoise.Roles(engine={idle_engine.pid}))
        watch.begin()
        child.terminate()
        assert parent.stdout.readline().strip() == "reaped"
        noise = watch.measure()
    finally:
        parent.stdin.close()
        parent.wait(10)
    charged = group(noise, "python -c")
    assert charged is None or charged["cores"] * noise["window_s"] < 0.3, noise["groups"]


def test_only_steal_is_judged_when_the_engine_was_not_found():
    noise = {
        "engine_found": False,
        "foreign_cores": 1.9,
        "groups": [{"name": "python -m vllm", "kind": "process", "cores": 1.9}],
        "steal_share": 0.2,
    }
    flags = hostnoise.flags(noise, "vllm", RULE)
    assert flags == ["noisy: the hypervisor stole 20% of the CPU time while measuring vllm"]
    assert hostnoise.flags(None, "vllm", RULE) == []
    assert hostnoise.flags({"engine_found": True, "groups": "garbage", "foreign_cores": "x"}, "vllm", RULE) == []


def test_many_small_processes_flag_together():
    groups = [{"name": f"p{i}", "kind": "process", "cores": 0.1} for i in range(6)]
    noise = {"engine_found": True, "foreign_cores": 0.6, "groups": groups}
    (flag,) = hostnoise.flags(noise, "vllm", RULE)
    assert flag.startswith("noisy: 60% of a core used by other processes (p0 0.10, p1 0.10, p2 0.10)")


def test_live_pid_records_prove_their_process(tmp_path):
    hog = start_hog()
    try:
        created = psutil.Process(hog.pid).create_time()
        (tmp_path / "llamacpp.json").write_text(
            json.dumps({"name": "llamacpp", "pid": hog.pid, "create_time": created, "url": "http://127.0.0.1:8081"})
        )
        (tmp_path / "vllm.json").write_text(json.dumps({"name": "vllm", "pid": hog.pid, "create_time": created - 50}))
        (tmp_path / "exporter.json").write_text('{"name": "exporter", "pid": ')  # torn
        (tmp_path / "ollama.json").write_text(json.dumps({"name": "ollama", "pid": None, "absent": "not installed"}))
        records = pidrecords.live(tmp_path)
    finally:
        stop(hog)
    assert list(records) == ["llamacpp"]  # the reused-pid vllm record, the torn and the absent ones prove nothing
    assert records["llamacpp"].is_engine and records["llamacpp"].pid == hog.pid


def test_the_engine_under_test_is_found_by_its_port_or_its_record():
    with SyntheticProcess("--ttft", "0") as a, SyntheticProcess("--ttft", "0") as b:
        roles = hostnoise.roles_for("vllm", "vllm", a.url, others=[("llamacpp", b.url)], records={})
        assert roles.engine == {a.proc.pid} and "listening on port" in roles.engine_how
        assert roles.others == {"llamacpp": {b.proc.pid}}
        recorded = pidrecords.LiveRecord("llamacpp", b.proc.pid, b.url)
        roles = hostnoise.roles_for("llamacpp", "llamacpp", b.url, records={"llamacpp": recorded})
        assert roles.engine == {b.proc.pid} and "llamacpp record" in roles.engine_how
    remote = hostnoise.roles_for("vllm", "vllm", "http://10.1.2.3:8009", records={})
    assert remote.engine == set() and remote.engine_how.startswith("not measured: http://10.1.2.3:8009 is not on")


@pytest.mark.parametrize(
    ("cores", "text"), [(0.61, "61% of a core"), (0.999, "1.0 cores"), (1.44, "1.4 cores"), (0.0, "0% of a core")]
)
def test_shares_read_as_the_issue_writes_them(cores, text):
    assert numbers.cores(cores) == text


def test_a_port_found_listening_a_moment_ago_is_answered_without_another_scan(monkeypatch):
    """A run asks for each engine's port a moment apart: one scan answers; a port it did not find is scanned for."""
    found = {8009: {11}}
    scans = []
    monkeypatch.setattr(listening, "listening", lambda: scans.append(1) or {p: set(s) for p, s in found.items()})
    monkeypatch.setattr(hostnoise, "_last_scan", (-hostnoise.LISTENERS_FRESH_S, {}))
    assert hostnoise.listeners(8009) == {11} and len(scans) == 1
    assert hostnoise.listeners(8009) == {11} and len(scans) == 1  # found a moment ago: no scan
    found[8081] = {13}
    assert hostnoise.listeners(8081) == {13} and len(scans) == 2  # not listening at the last scan: scanned again
    found[8009] = {14}  # the engine restarted; the last scan is then older than the window
    at, by_port = hostnoise._last_scan
    hostnoise._last_scan = (at - hostnoise.LISTENERS_FRESH_S - 0.1, by_port)
    assert hostnoise.listeners(8009) == {14} and len(scans) == 3


def test_where_netlink_is_refused_the_listeners_come_from_psutil(monkeypatch):
    """A sandbox without the kernel's socket diagnostics: psutil's reading of /proc/net/tcp answers instead."""
    listen = psutil.CONN_LISTEN
    conns = [
        types.SimpleNamespace(status=listen, laddr=types.SimpleNamespace(port=8009), pid=11),
        types.SimpleNamespace(status="ESTABLISHED", laddr=types.SimpleNamespace(port=8081), pid=12),
    ]

    def refused(proc):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(listening, "_from_sock_diag", refused)
    monkeypatch.setattr(psutil, "net_connections", lambda kind: list(conns))
    monkeypatch.setattr(hostnoise, "_last_scan", (-hostnoise.LISTENERS_FRESH_S, {}))
    assert hostnoise.listeners(8009) == {11}
    monkeypatch.setattr(hostnoise, "_last_scan", (-hostnoise.LISTENERS_FRESH_S, {}))
    assert hostnoise.listeners(8081) == set()  # connected, not listening
