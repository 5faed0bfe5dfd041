"""The master's port for its workers (`--workers N`) under attack: a local process that never registered, forged and
malformed messages, frames that are not Locust's; the plan without credentials; a lost worker's unsent requests.

A forger in this process connects a ZeroMQ socket to the master's port as soon as it listens (before the workers do)
and sends, over and over until the run ends, what an attacker would: a registration, forged records, records and
phase messages with fields missing or of the wrong type, frames that are not msgpack at all. The run must end as if
none of it had come: every request recorded once, no forged one, the workers never lost, one line per kind of bad
message, and nothing of the run handed to the forger.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from servescope.runfolder import RunFolder
from tests.doubles.synthetic_openai import SyntheticServer
from tests.test_loadgen_distributed import QUIET_SAMPLER, REPO, command, prompt_file


@pytest.fixture
def server():
    with SyntheticServer(ttft=0.02, itl=0.002, tokens=4) as s:
        yield s


def listening_ports(pid: int) -> set[int]:
    """TCP ports the process `pid` listens on (its socket inodes matched against the kernel's tables)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                ports.add(int(fields[1].rpartition(":")[2], 16))
    return ports


def message(kind: str, data, node: str) -> bytes:
    return msgpack.dumps((kind, data, node))


FORGED_RECORD = {
    "engine": "vllm",
    "instance": "vllm",
    "scenario": "burst",
    "phase": "burst-1",
    "api": "openai",
    "model": "m",
    "prompt_set": "prompts",
    "prompt_set_sha256": "x",
    "prompt_id": "forged",
    "max_tokens": 4,
    "started_at": time.time(),
    "ok": True,
    "status": 200,
    "ttft_s": 0.001,
    "e2e_s": 0.002,
}


def attacks(node: str) -> list[bytes]:
    """One round of what the forger sends: each a frame the master must drop, costing the run nothing."""
    __version__ = importlib.metadata.version("locust")  # not imported here: Locust patches the whole process
    return [
        message("client_ready", __version__, node),  # registers itself: handed the plan, counted as a worker
        *[
            message("servescope_record", {"key": [0, r, i], "record": FORGED_RECORD}, node)
            for r in (0, 1)
            for i in (0, 1)
        ],
        message("servescope_record", {"key": "x", "record": 5}, node),  # malformed: a TypeError traceback once
        message("servescope_record", {"record": {**FORGED_RECORD, "started_at": "soon"}}, node),
        message("servescope_ready", {}, node),  # missing fields: "KeyError: 'phase'" once stopped the run
        message("servescope_ready", {"index": 0, "round": "one", "users": -3}, node),
        message("servescope_done", {"index": 0}, node),
        message("servescope_done", {"index": 0, "sent": "all"}, node),
        message("servescope_begin", {"key": [0, 0, 1]}, node),
        message("servescope_begin", {"key": [0, 0, 2], "phase": 7, "prompt_id": None, "at": "now"}, node),
        message("servescope_clock_probe", {}, node),
        message("heartbeat", {}, node),  # Locust's own, without its fields
        message("spawning_complete", {"user_classes_count": "many"}, node),
        message("client_ready", __version__, "someone-else"),  # naming another sender than itself
        b"\xc1 not msgpack at all",  # killed Locust's listener once: every worker "lost" 3 s later
        b"",
        msgpack.dumps([1]),  # msgpack, not a Locust message
        msgpack.dumps({"type": "x"}),
    ]


class Forger:
    def __init__(self, port: int):
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.node = f"forger_{os.getpid()}"
        self.socket.setsockopt(zmq.IDENTITY, self.node.encode())
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(f"tcp://127.0.0.1:{port}")
        self.received: list = []
        self.stop = threading.Event()
        self.rounds = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for frame in attacks(self.node):
                self.socket.send(frame)
            self.rounds += 1
            self._drain()
            time.sleep(0.05)

    def _drain(self) -> None:
        while True:
            try:
                self.received.append(msgpack.loads(self.socket.recv(zmq.NOBLOCK)))
            except zmq.Again:
                return

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self._drain()
        self.socket.close()
        self.context.term()


def test_forged_and_malformed_messages_cost_themselves_never_the_run(server, tmp_path):
    prompts = prompt_file(tmp_path, "p1", "p2", "p3", "p4")
    proc = subprocess.Popen(
        command(server, tmp_path, "burst", "--burst-size", "4", "--bursts", "8", "--burst-pause", "0.3")
        + ["--prompts", prompts],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=QUIET_SAMPLER,
    )
    forger = None
    try:
        deadline = time.monotonic() + 60
        while forger is None and proc.poll() is None and time.monotonic() < deadline:
            ports = listening_ports(proc.pid)
            if ports:
                forger = Forger(min(ports))  # the master's port: the only one it has (no metrics port here)
            time.sleep(0.01)
        assert forger is not None, "the master never listened"
        out, err = proc.communicate(timeout=120)
    finally:
        if forger is not None:
            forger.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert forger.rounds > 3, "the forger hardly sent anything before the run ended"
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    assert "Traceback" not in out + err and "KeyError" not in err, err[-3000:]
    folder = RunFolder(tmp_path / "run")
    manifest = folder.manifest()
    assert manifest["status"] == "complete"
    records = list(folder.requests())
    # Every request once, none forged, none lost: 8 rounds of 4.
    assert len(records) == 32 and server.stats.requests == 32, len(records)
    assert sorted({r.prompt_id for r in records}) == ["prompts-1", "prompts-2", "prompts-3", "prompts-4"]
    assert all(r.ok and r.error_kind is None for r in records)
    assert [(w["index"], w["lost"]) for w in manifest["workers"]] == [(0, None), (1, None)]
    dropped = manifest["distributed"]["dropped_messages"]
    assert sum(dropped.values()) >= forger.rounds, dropped
    # One line per kind of bad message, not one per message.
    lines = [line for line in err.splitlines() if "dropped" in line]
    assert 1 <= len(lines) <= len(dropped) + 1, lines
    assert all(len(line) < 400 for line in lines)
    # The forger was handed nothing: no acknowledgement, no plan, no users.
    assert forger.received == [], forger.received[:3]


def test_the_plan_carries_no_credentials_and_the_workers_still_send_them(tmp_path):
    """The plan once carried the engine URL's password to whatever connected first; workers now read it from the
    environment their master started them with."""
    from loadgen import master_port  # not loadgen.distributed: Locust would patch this whole process
    from loadgen.commands import build_parser, prepare

    with SyntheticServer(ttft=0.02, itl=0.002, tokens=4) as server:
        url = server.url.replace("http://", "http://zqx-user:s3cret@")
        argv = command(server, tmp_path, "burst", "--burst-size", "2")
        argv[argv.index(f"vllm={server.url}")] = f"vllm={url}"
        args = build_parser().parse_args(argv[3:])
        plan = json.dumps(master_port.plan_message(args, prepare(args).targets))
        assert "s3cret" not in plan and "zqx-user" not in plan and "***@" in plan
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, env=QUIET_SAMPLER)
        assert proc.returncode == 0, proc.stderr[-3000:]
        # Both workers' requests carried the credentials as basic auth.
        assert list(server.stats.authorizations.values()) == [2] and None not in server.stats.authorizations
    for path in (tmp_path / "run").iterdir():
        assert "s3cret" not in path.read_text(errors="replace"), path.name


def test_a_lost_worker_leaves_its_unsent_requests_counted_per_phase(server, tmp_path):
    """A rate run once recorded 37 of 60 arrivals (23 neither sent nor recorded) without a word; later burst rounds
    sent 4 requests while the report said "burst (8 concurrent)"."""
    prompts = prompt_file(tmp_path, "q1", "q2", "q3 [[fault:stall=30]]", "q4 [[fault:stall=30]]")
    proc = subprocess.Popen(
        command(server, tmp_path, "burst", "--burst-size", "4", "--bursts", "3", "--burst-pause", "0")
        + ["--prompts", prompts],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=QUIET_SAMPLER,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen: list[str] = []
    try:
        pid, deadline = None, time.monotonic() + 60
        while pid is None and time.monotonic() < deadline:
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                continue
            match = re.match(r"\[.*\] worker 1: pid (\d+)", seen[-1])
            pid = int(match.group(1)) if match else None
        assert pid is not None, "".join(seen)
        while server.stats.requests < 4 and time.monotonic() < deadline:  # worker 1's two requests are streaming
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=90) == 0, "".join(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    while not lines.empty():
        seen.append(lines.get())
    folder = RunFolder(tmp_path / "run")
    phases = {p.phase: p for p in folder.phases()}
    # Round 1: 4 released (2 of them lost with the worker); rounds 2 and 3: the other worker's 2 users.
    assert [(name, phases[name].requests, phases[name].concurrency) for name in sorted(phases)] == [
        ("burst-1", 4, 4),
        ("burst-2", 2, 2),
        ("burst-3", 2, 2),
    ]
    unsent = folder.manifest()["distributed"]["unsent"]
    assert unsent == {"burst": 4}, unsent
    text = "".join(seen)
    assert "burst: 4 of 12 requests never sent (load generator worker 1 lost)" in text, text[-3000:]


def test_a_lost_workers_share_of_an_open_loop_schedule_is_counted(server, tmp_path):
    prompts = prompt_file(tmp_path, "r1", "r2 [[fault:stall=30]]")
    proc = subprocess.Popen(
        command(server, tmp_path, "rate", "--rate", "10", "--requests", "40", "--prompts", prompts),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=QUIET_SAMPLER,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen: list[str] = []
    try:
        pid, deadline = None, time.monotonic() + 60
        while pid is None and time.monotonic() < deadline:
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                continue
            match = re.match(r"\[.*\] worker 1: pid (\d+)", seen[-1])
            pid = int(match.group(1)) if match else None
        assert pid is not None, "".join(seen)
        while server.stats.requests < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=90) == 0, "".join(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    while not lines.empty():
        seen.append(lines.get())
    folder = RunFolder(tmp_path / "run")
    records = list(folder.requests())
    unsent = folder.manifest()["distributed"]["unsent"]
    (phase,) = unsent
    assert unsent[phase] > 0 and len(records) + unsent[phase] == 40, (len(records), unsent)
    assert f"{phase}: {unsent[phase]} of 40 requests never sent (load generator worker 1 lost)" in "".join(seen)
    assert json.loads(json.dumps(folder.manifest()["workers"]))[1]["lost"]
