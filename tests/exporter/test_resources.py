"""The resource budget series: real processes (and their children) from pid files, cgroup limits, docker stats."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import psutil
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter import cli, server
from exporter import config as exporter_config
from exporter.resources import (
    DockerStats,
    NotRunning,
    ResourceCollector,
    WatchedContainer,
    WatchedProcess,
    cgroup_limits,
    container_budget,
)
from servescope.contracts import series
from servescope.host.process_memory import process_memory, tree_memory
from tests.conftest import JsonReplyHandler, free_port, serve_in_thread
from tests.paths import FIXTURES

FIXTURE = FIXTURES / "docker-engine-api-1.47-container-stats.json"
MIB = 1 << 20
CPU = series.ENGINE_CPU_SECONDS
RSS = series.ENGINE_RESIDENT_BYTES
CPU_LIMIT = series.ENGINE_CPU_LIMIT
MEM_LIMIT = series.ENGINE_MEMORY_LIMIT

# An engine-shaped process tree: the parent (the API server) starts a child (the engine core) that
# holds 64 MiB and burns ~0.3 s of CPU, then both wait to be stopped. "ready" is written when set up.
TREE = r"""
import subprocess, sys, time, pathlib
child = subprocess.Popen([sys.executable, "-c", '''
import time, pathlib, sys
block = bytearray(64 << 20)
for i in range(0, len(block), 4096): block[i] = 1
end = time.process_time() + 0.3
while time.process_time() < end: pass
pathlib.Path(sys.argv[1]).write_text("child")
time.sleep(120)
''', sys.argv[1] + ".child"])
while not pathlib.Path(sys.argv[1] + ".child").exists(): time.sleep(0.02)
pathlib.Path(sys.argv[1]).write_text(str(child.pid))
time.sleep(120)
"""

# A parent whose worker burns ~0.4 s of CPU and exits, reaped: its seconds must stay in the sum.
REAPED = r"""
import subprocess, sys, time, pathlib
subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass"])
pathlib.Path(sys.argv[1]).write_text("done")
time.sleep(120)
"""


def start(script: str, ready: Path, timeout: float = 30) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", script, str(ready)], start_new_session=True)
    deadline = time.monotonic() + timeout
    # Not just there: written. write_text creates the file before it writes, and the tree fixture reads a pid from it.
    while not (ready.exists() and ready.read_text()):
        assert proc.poll() is None, "test process died"
        assert time.monotonic() < deadline, "test process not ready"
        time.sleep(0.02)
    return proc


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole group: the child too
    except ProcessLookupError:
        pass
    proc.wait(10)


@pytest.fixture
def tree(tmp_path):
    proc = start(TREE, tmp_path / "ready")
    pidfile = tmp_path / "vllm.pid"
    pidfile.write_text(f"{proc.pid}\n")
    yield SimpleNamespace(proc=proc, pidfile=pidfile, child_pid=int((tmp_path / "ready").read_text()))
    stop(proc)


def registry_of(collector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def value(registry, name, engine="vllm", instance="vllm", source="process"):
    return registry.get_sample_value(name, {"engine": engine, "instance": instance, "source": source})


# --- native processes ---


def test_a_process_and_its_children_are_summed(tree):
    registry = registry_of(ResourceCollector([WatchedProcess("vllm", "vllm", tree.pidfile)]))
    parent = process_memory(psutil.Process(tree.proc.pid))
    resident = value(registry, RSS)
    assert parent < 64 * MIB  # the API-server stand-in holds little by itself
    assert resident >= parent + 60 * MIB  # the engine-core child's 64 MiB (its own pages) counts
    assert value(registry, CPU) >= 0.25  # the child's busy loop
    cores, memory = psutil.cpu_count(), psutil.virtual_memory().total
    assert value(registry, CPU_LIMIT) == cores  # no cgroup limit here: the machine's
    assert value(registry, MEM_LIMIT) == memory
    # the series is the tree's PSS (servescope.host.process_memory), the one measure `make status` is to show too
    assert tree_memory(psutil.Process(tree.proc.pid)) >= 64 * MIB


# A parent that fills 64 MiB and then forks: the child shares those pages (copy-on-write, never written).
FORKED = r"""
import os, pathlib, sys, time
block = bytearray(64 << 20)
for i in range(0, len(block), 4096): block[i] = 1
if os.fork() == 0:
    time.sleep(120)
    os._exit(0)
pathlib.Path(sys.argv[1]).write_text("forked")
time.sleep(120)
"""


def test_pages_a_forked_worker_shares_are_counted_once(tmp_path):
    """RSS counts the 64 MiB both processes map twice; PSS, which the exporter sums, once."""
    proc = start(FORKED, tmp_path / "forked")
    try:
        parent = psutil.Process(proc.pid)
        members = [parent, *parent.children(recursive=True)]
        assert len(members) == 2
        rss = sum(member.memory_info().rss for member in members)
        pss = tree_memory(parent)
        assert rss >= 2 * 64 * MIB  # each process's RSS holds the whole block
        assert 64 * MIB <= pss < rss - 48 * MIB, (pss, rss)  # the block once, plus each interpreter
        assert process_memory(parent) < parent.memory_info().rss
        (tmp_path / "p.pid").write_text(str(proc.pid))
        registry = registry_of(ResourceCollector([WatchedProcess("vllm", "vllm", tmp_path / "p.pid")]))
        assert value(registry, RSS) == pytest.approx(pss, rel=0.05)
    finally:
        stop(proc)


def test_reaped_children_keep_their_cpu_seconds(tmp_path):
    proc = start(REAPED, tmp_path / "done")
    try:
        (tmp_path / "p.pid").write_text(str(proc.pid))
        registry = registry_of(ResourceCollector([WatchedProcess("llamacpp", "llamacpp", tmp_path / "p.pid")]))
        assert psutil.Process(proc.pid).children() == []  # the worker is gone
        assert value(registry, CPU, engine="llamacpp", instance="llamacpp") >= 0.35
    finally:
        stop(proc)


def test_cpu_counter_grows_between_scrapes(tmp_path):
    script = "import time, pathlib, sys\npathlib.Path(sys.argv[1]).write_text('x')\nend = time.monotonic() + 20\nwhile time.monotonic() < end: pass"
    proc = start(script, tmp_path / "ready")
    try:
        (tmp_path / "busy.pid").write_text(str(proc.pid))
        registry = registry_of(ResourceCollector([WatchedProcess("vllm", "vllm", tmp_path / "busy.pid")]))
        first = value(registry, CPU)
        deadline = time.monotonic() + 10
        while value(registry, CPU) <= first:  # each read is a scrape; the busy loop adds CPU time between them
            assert time.monotonic() < deadline, f"CPU seconds stayed at {first} for 10 s of a busy loop"
    finally:
        stop(proc)


def test_missing_stale_and_garbage_pidfiles_give_no_series_and_one_log_line(tree, tmp_path, caplog):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "dead.pid").write_text(str(dead.pid))
    (tmp_path / "garbage.pid").write_text("not a pid\n")
    (tmp_path / "reused.json").write_text(json.dumps({"pid": tree.proc.pid, "create_time": 1.0}))
    old = tmp_path / "old.pid"  # written long before the process it names started: a reused pid
    old.write_text(str(tree.proc.pid))
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    watched = [
        WatchedProcess("vllm", name, tmp_path / f"{name}.{ext}")
        for name, ext in (("missing", "pid"), ("dead", "pid"), ("garbage", "pid"), ("reused", "json"), ("old", "pid"))
    ]
    watched.append(WatchedProcess("vllm", "vllm", tree.pidfile))
    collector = ResourceCollector(watched)
    registry = registry_of(collector)
    with caplog.at_level(logging.INFO, logger="exporter"):
        for _ in range(3):
            text = generate_latest(registry).decode()
    instances = {s.labels["instance"] for f in text_string_to_metric_families(text) for s in f.samples}
    assert instances == {"vllm"}  # only the live, matching process
    absent = [r.getMessage() for r in caplog.records if "no resource series" in r.getMessage()]
    assert len(absent) == 5, absent  # one per watched process, not one per scrape
    joined = "\n".join(absent)
    assert "no pid file" in joined and "stale pid file" in joined and "holds no pid" in joined
    assert "another process now" in joined and "started after the pid file" in joined


def test_the_stacks_json_pid_record_is_read(tree, tmp_path):
    record = tmp_path / "vllm.json"
    record.write_text(
        json.dumps(
            {
                "name": "vllm",
                "pid": tree.proc.pid,
                "create_time": psutil.Process(tree.proc.pid).create_time(),
                "cmdline": [],
            }
        )
    )
    registry = registry_of(ResourceCollector([WatchedProcess("vllm", "vllm", record)]))
    assert value(registry, RSS) >= 64 * MIB


def test_a_process_that_exits_loses_its_series_then_a_new_one_gets_them(tmp_path, caplog):
    pidfile = tmp_path / "e.pid"
    first = start(
        "import pathlib, sys, time\npathlib.Path(sys.argv[1]).write_text('x')\ntime.sleep(60)", tmp_path / "r1"
    )
    pidfile.write_text(str(first.pid))
    registry = registry_of(ResourceCollector([WatchedProcess("vllm", "vllm", pidfile)]))
    assert value(registry, RSS) > 0
    stop(first)
    assert value(registry, RSS) is None
    second = start(
        "import pathlib, sys, time\npathlib.Path(sys.argv[1]).write_text('x')\ntime.sleep(60)", tmp_path / "r2"
    )
    try:
        pidfile.write_text(str(second.pid))
        with caplog.at_level(logging.INFO, logger="exporter"):
            assert value(registry, RSS) > 0
        assert any("resource series on" in r.getMessage() for r in caplog.records)
    finally:
        stop(second)


def _cgroup_tree(root: Path, pid: int, cgroup_line: str, files: dict[str, str]) -> tuple[Path, Path]:
    """/proc/<pid>/cgroup and /sys/fs/cgroup laid out as the kernel does (cgroup-v2.rst, cgroup-v1/memory.rst)."""
    proc_root, cgroup_root = root / "proc", root / "cgroup"
    (proc_root / str(pid)).mkdir(parents=True)
    (proc_root / str(pid) / "cgroup").write_text(cgroup_line)
    cgroup_root.mkdir()
    for rel, text in files.items():
        path = cgroup_root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return proc_root, cgroup_root


def test_cgroup_v2_limits_tightest_of_the_hierarchy(tree, tmp_path):
    proc_root, cgroup_root = _cgroup_tree(
        tmp_path,
        tree.proc.pid,
        "0::/servescope.slice/vllm.service\n",
        {
            "cgroup.controllers": "cpuset cpu io memory pids",
            "memory.max": "max",
            "cpu.max": "max 100000",
            "servescope.slice/memory.max": "8589934592",
            "servescope.slice/cpu.max": "150000 100000",
            "servescope.slice/vllm.service/memory.max": "4294967296",
            "servescope.slice/vllm.service/cpu.max": "max 100000",
        },
    )
    assert cgroup_limits(tree.proc.pid, proc_root=proc_root, cgroup_root=cgroup_root) == (1.5, 4294967296.0)
    collector = ResourceCollector(
        [WatchedProcess("vllm", "vllm", tree.pidfile)],
        proc_root=proc_root,
        cgroup_root=cgroup_root,
        machine=lambda: (16.0, 64 * 1024.0 * MIB),
    )
    registry = registry_of(collector)
    assert value(registry, CPU_LIMIT) == 1.5
    assert value(registry, MEM_LIMIT) == 4294967296


def test_cgroup_v2_without_limits_is_the_machine(tree, tmp_path):
    proc_root, cgroup_root = _cgroup_tree(
        tmp_path,
        tree.proc.pid,
        "0::/user.slice\n",
        {"cgroup.controllers": "cpu memory", "user.slice/memory.max": "max", "user.slice/cpu.max": "max 100000"},
    )
    assert cgroup_limits(tree.proc.pid, proc_root=proc_root, cgroup_root=cgroup_root) == (None, None)
    registry = registry_of(
        ResourceCollector(
            [WatchedProcess("vllm", "vllm", tree.pidfile)],
            proc_root=proc_root,
            cgroup_root=cgroup_root,
            machine=lambda: (2.0, 1e10),
        )
    )
    assert (value(registry, CPU_LIMIT), value(registry, MEM_LIMIT)) == (2.0, 1e10)


def test_cgroup_v1_limits_and_its_unlimited_marker(tree, tmp_path):
    lines = "12:memory:/docker/abc\n11:cpu,cpuacct:/docker/abc\n0::/\n"
    proc_root, cgroup_root = _cgroup_tree(
        tmp_path,
        tree.proc.pid,
        lines,
        {
            "memory/memory.limit_in_bytes": "9223372036854771712",
            "memory/docker/abc/memory.limit_in_bytes": "2147483648",
            "cpu/cpu.cfs_quota_us": "-1",
            "cpu/cpu.cfs_period_us": "100000",
            "cpu/docker/abc/cpu.cfs_quota_us": "50000",
            "cpu/docker/abc/cpu.cfs_period_us": "100000",
        },
    )
    assert cgroup_limits(tree.proc.pid, proc_root=proc_root, cgroup_root=cgroup_root) == (0.5, 2147483648.0)
    proc_root2, cgroup_root2 = _cgroup_tree(
        tmp_path / "unlimited",
        tree.proc.pid,
        lines,
        {
            "memory/docker/abc/memory.limit_in_bytes": "9223372036854771712",
            "cpu/docker/abc/cpu.cfs_quota_us": "-1",
            "cpu/docker/abc/cpu.cfs_period_us": "100000",
        },
    )
    assert cgroup_limits(tree.proc.pid, proc_root=proc_root2, cgroup_root=cgroup_root2) == (None, None)


def test_the_real_cgroup_of_this_machine_reads_without_error(tree):
    cores, memory = cgroup_limits(tree.proc.pid)
    assert cores is None or cores > 0
    assert memory is None or memory > 0


# --- containers: docker stats ---


def fixture_stats() -> dict:
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize(
    "host_config, cores",
    [
        ({"NanoCpus": 4_000_000_000, "CpuQuota": 0, "CpuPeriod": 0}, 4.0),  # compose `cpus: 4`
        ({"NanoCpus": 0, "CpuQuota": 150000, "CpuPeriod": 100000}, 1.5),  # docker run --cpu-quota
        ({"NanoCpus": 0, "CpuQuota": 0, "CpuPeriod": 0}, 8.0),  # no limit: online CPUs
    ],
)
def test_docker_stats_become_a_budget(host_config, cores):
    budget = container_budget(fixture_stats(), host_config)
    assert budget.cpu_seconds == 812.5  # total_usage is nanoseconds
    assert budget.resident_bytes == 2415919104 - 268435456  # usage - inactive_file, as `docker stats`
    assert budget.memory_limit_bytes == 5368709120
    assert budget.cpu_limit_cores == cores


def test_docker_stats_cgroup_v1_subtract_total_inactive_file():
    stats = fixture_stats()
    stats["memory_stats"]["stats"] = {"total_inactive_file": 100, "cache": 999}
    stats["memory_stats"]["usage"] = 1100
    assert container_budget(stats, {}).resident_bytes == 1000


def test_a_stopped_containers_empty_stats_are_not_running():
    # Docker answers a stopped container's stats with empty cpu_stats / memory_stats.
    with pytest.raises(NotRunning):
        container_budget({"cpu_stats": {"cpu_usage": {}}, "memory_stats": {}}, {})


def truthy(value: str) -> bool:
    """dockerd's httputils.BoolValue: false only for "", 0, no, false, none (any case)."""
    return value.strip().lower() not in ("", "0", "no", "false", "none")


class DockerEngineAPI:
    """Stands in for the Docker Engine (dockerd) API 1.47 over TCP: /version, /containers/{id}/json, /containers/{id}/stats.

    Only what the docker SDK calls for `containers.get(...)` and `stats(stream=False, one_shot=True)`;
    the stats body is the recorded fixture; an unknown container gets Docker's 404 JSON message.
    """

    def __init__(self, containers: dict[str, dict]):
        self.containers = containers
        self.requests: list[str] = []
        api = self

        class Handler(JsonReplyHandler):
            extra_headers = {"Api-Version": "1.47"}

            def do_GET(self):  # noqa: N802 -- http.server's naming
                api.requests.append(self.path)
                parts = urlsplit(self.path)
                path = parts.path.split("/", 2)[-1] if parts.path.startswith("/v1.") else parts.path.lstrip("/")
                if path == "version":
                    return self.reply_json(200, {"ApiVersion": "1.47", "MinAPIVersion": "1.24", "Version": "27.3.1"})
                segments = path.split("/")
                if len(segments) == 3 and segments[0] == "containers":
                    found = api.containers.get(segments[1]) or next(
                        (c for c in api.containers.values() if c["Id"] == segments[1]), None
                    )
                    if found is None:
                        return self.reply_json(404, {"message": f"No such container: {segments[1]}"})
                    if segments[2] == "json":
                        return self.reply_json(
                            200,
                            {
                                "Id": found["Id"],
                                "Name": "/" + segments[1],
                                "HostConfig": found["HostConfig"],
                                "State": {"Running": True},
                            },
                        )
                    if segments[2] == "stats":
                        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                        if truthy(query.get("stream", "1")) or not truthy(query.get("one-shot", "0")):
                            return self.reply_json(
                                400, {"message": f"this stand-in serves one-shot stats only: {query}"}
                            )
                        return self.reply_json(200, found["stats"])
                self.reply_json(404, {"message": "page not found"})

        self.server = serve_in_thread(Handler)
        self.url = f"tcp://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_containers_through_the_docker_sdk(monkeypatch):
    engine = DockerEngineAPI(
        {
            "servescope-vllm": {
                "Id": "ede54ee1afda",
                "stats": fixture_stats(),
                "HostConfig": {"NanoCpus": 4_000_000_000, "Memory": 5368709120},
            }
        }
    )
    monkeypatch.setenv("DOCKER_HOST", engine.url)
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    collector = ResourceCollector(
        containers=[
            WatchedContainer("vllm", "vllm", "servescope-vllm"),
            WatchedContainer("ollama", "ollama", "servescope-ollama"),
        ]
    )
    try:
        registry = registry_of(collector)
        text = generate_latest(registry).decode()
        assert value(registry, CPU, source="container") == 812.5
        assert value(registry, RSS, source="container") == 2147483648
        assert value(registry, CPU_LIMIT, source="container") == 4.0
        assert value(registry, MEM_LIMIT, source="container") == 5368709120
        assert 'instance="ollama"' not in text  # no such container: no series, no error
    finally:
        collector.close()
        engine.close()
    assert any("/containers/ede54ee1afda/stats" in r for r in engine.requests)  # by the Id the SDK got


def test_an_unreachable_docker_gives_no_series_and_no_crash(monkeypatch, caplog, tree):
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{free_port()}")  # nothing listens there
    collector = ResourceCollector(
        [WatchedProcess("vllm", "vllm", tree.pidfile)],
        [WatchedContainer("ollama", "ollama", "servescope-ollama")],
        timeout=1.0,
    )
    registry = registry_of(collector)
    with caplog.at_level(logging.INFO, logger="exporter"):
        started = time.monotonic()
        for _ in range(2):
            text = generate_latest(registry).decode()
        assert time.monotonic() - started < 5
    assert 'source="container"' not in text and value(registry, RSS) > 0  # the process is still reported
    lines = [r.getMessage() for r in caplog.records if "ollama" in r.getMessage()]
    assert len(lines) == 1 and "docker cannot show container servescope-ollama" in lines[0]
    collector.close()


def test_describe_reads_nothing():
    def no_docker():
        raise AssertionError("describe() must not reach Docker")

    collector = ResourceCollector(
        [WatchedProcess("vllm", "vllm", Path("/nonexistent/pid"))],
        [WatchedContainer("vllm", "vllm-c", "x")],
        docker=DockerStats(client_factory=no_docker),
    )
    names = {family.name for family in collector.describe()}
    assert names == {CPU.removesuffix("_total"), RSS, CPU_LIMIT, MEM_LIMIT}
    CollectorRegistry().register(collector)


# --- configuration ---


def args(*argv: str):
    return cli.build_parser().parse_args(list(argv))


def test_process_and_container_flags(tmp_path):
    config = exporter_config.load(
        args(
            "--process",
            "vllm=~/run/vllm.pid",
            "--process",
            "vllm:vllm-b=/run/b.json",
            "--container",
            "ollama=servescope-ollama",
        )
    )
    assert config.processes == (
        WatchedProcess("vllm", "vllm", Path("~/run/vllm.pid").expanduser()),
        WatchedProcess("vllm", "vllm-b", Path("/run/b.json")),
    )
    assert config.containers == (WatchedContainer("ollama", "ollama", "servescope-ollama"),)


def test_processes_and_containers_in_the_config_file(tmp_path):
    path = tmp_path / "exporter.yml"
    path.write_text(
        "engines: []\nprocesses:\n  - {kind: llamacpp, pidfile: /tmp/l.pid}\n  - {kind: vllm, name: vllm-a, pidfile: /tmp/a.pid}\n"
        "containers:\n  - {kind: vllm, name: vllm-a, container: servescope-vllm}\n"
    )
    config = exporter_config.load(args("--config", str(path)))
    assert config.processes == (
        WatchedProcess("llamacpp", "llamacpp", Path("/tmp/l.pid")),
        WatchedProcess("vllm", "vllm-a", Path("/tmp/a.pid")),
    )
    assert config.containers == (WatchedContainer("vllm", "vllm-a", "servescope-vllm"),)
    # flags replace the file's list
    assert exporter_config.load(args("--config", str(path), "--process", "ollama=/x")).processes == (
        WatchedProcess("ollama", "ollama", Path("/x")),
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--process", "vllm"), "config error: --process: expected NAME=PIDFILE"),
        (("--process", "triton=/x.pid"), "unknown engine kind 'triton'"),
        (("--process", "vllm=/a", "--process", "vllm=/b"), "vllm 'vllm' is watched twice"),
        (("--container", "vllm="), "config error: --container: expected a container name or id"),
    ],
)
def test_bad_flags_are_one_line(argv, message):
    with pytest.raises(exporter_config.ConfigError) as err:
        exporter_config.load(args(*argv))
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("processes: {kind: vllm}", "config error: processes: expected a list"),
        ("processes:\n  - {kind: vllm}", "config error: processes[0].pidfile: missing"),
        ("processes:\n  - {kind: vllm, pidfile: /a, port: 1}", "config error: processes[0].port: unknown key"),
        ("containers:\n  - {kind: nope, container: c}", "config error: containers[0].kind: unknown engine kind"),
        ("containers:\n  - {kind: vllm, name: 'a b', container: c}", "config error: containers[0].name:"),
    ],
)
def test_bad_file_entries_are_one_line(tmp_path, text, message):
    path = tmp_path / "bad.yml"
    path.write_text(text + "\n")
    with pytest.raises(exporter_config.ConfigError) as err:
        exporter_config.load(args("--config", str(path)))
    assert message in str(err.value), str(err.value)


def test_the_exporter_built_from_cli_flags_exports_the_budget(tree):
    exporter = server.build(exporter_config.load(args("--process", f"vllm={tree.pidfile}")))
    try:
        text = generate_latest(exporter.registry).decode()
    finally:
        exporter.close()
    samples = {
        (s.name, s.labels.get("instance")): s.value for f in text_string_to_metric_families(text) for s in f.samples
    }
    assert samples[(RSS, "vllm")] >= 64 * MIB
    assert samples[(CPU, "vllm")] >= 0.25
