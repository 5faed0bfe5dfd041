"""N replicas behind nginx: cores per replica, the exporter's view of them, start/stop as one, and refusals."""

from __future__ import annotations

import sys

import psutil
import pytest
import requests

from exporter import config as exporter_config
from exporter.cli import build_parser
from stack import replicas
from stack.errors import StackError
from stack.supervisor import Service
from tests.conftest import free_port

needs_nginx = pytest.mark.tool("nginx")  # `make test` installs it; skips locally without it, fails under CI=true


def test_replicas_get_their_own_cores_and_share_only_when_they_outnumber_them():
    assert [replicas.cores_of(i, 2, 1, [0, 1]) for i in range(2)] == [[0], [1]]
    assert [replicas.cores_of(i, 2, 2, [0, 1, 2, 3]) for i in range(2)] == [[0, 1], [2, 3]]
    assert [replicas.cores_of(i, 3, 1, [4, 5]) for i in range(3)] == [[4], [5], [4]]


def test_the_exporter_reads_each_replica_as_an_instance_of_its_own(tmp_path):
    path = replicas.exporter_config(
        "llamacpp", ("http://127.0.0.1:18500", "http://127.0.0.1:18501"), tmp_path / "e.yml"
    )
    cfg = exporter_config.load(build_parser().parse_args(["--config", str(path), "--port", "19999"]))
    assert [(i.kind, i.name, i.url) for i in cfg.instances] == [
        ("llamacpp", "llamacpp-1", "http://127.0.0.1:18500"),
        ("llamacpp", "llamacpp-2", "http://127.0.0.1:18501"),
    ]


@pytest.mark.parametrize(
    ("kind", "count", "said"), [("vllm", 2, "starts replicas of llamacpp"), ("llamacpp", 0, "at least 1")]
)
def test_what_cannot_be_started_is_refused_in_one_line(kind, count, said, tmp_path):
    with pytest.raises(StackError, match=said):
        replicas.Replicas(kind, count, workdir=tmp_path)


def doubles(fail_index: int | None = None):
    """replica_services with the synthetic OpenAI server in place of llama-server (same health path and API)."""

    def services(count, threads, slots, base_port, pin, host="127.0.0.1"):
        out = []
        for i in range(count):
            port = free_port()
            cmd = [sys.executable, "-m", "tests.doubles.synthetic_openai", "--port", str(port), "--ttft", "0"]
            if i == fail_index:
                cmd = [sys.executable, "-c", "import sys; print('no weights'); sys.exit(3)"]
            out.append(
                Service(f"llamacpp-{i + 1}", f"replica {i + 1}", cmd, host, port, "REPLICAS_BASE_PORT", "/health", 20)
            )
        return out

    return services


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@needs_nginx
def test_replicas_serve_through_the_router_and_stop_together(tmp_path, monkeypatch):
    monkeypatch.setattr(replicas, "replica_services", doubles())
    fleet = replicas.Replicas("llamacpp", 2, router_port=free_port(), workdir=tmp_path)
    with fleet as up:
        pids = [r.pid for r in fleet.started]
        assert len(up.urls) == 2 and all(alive(p) for p in pids)
        answer = requests.post(
            f"{up.router}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            timeout=10,
        )
        assert answer.status_code == 200
        served = [requests.get(f"{u}/stats", timeout=5).json() for u in up.urls]
        assert sum(s.get("requests", 0) for s in served) == 1  # it went to one replica, through nginx
    assert not any(alive(p) for p in pids)


@needs_nginx
def test_a_replica_that_dies_at_start_stops_the_others_and_says_which(tmp_path, monkeypatch):
    monkeypatch.setattr(replicas, "replica_services", doubles(fail_index=1))
    fleet = replicas.Replicas("llamacpp", 2, router_port=free_port(), workdir=tmp_path)
    with pytest.raises(StackError, match="replica 2 exited"):
        with fleet:
            pass
    assert fleet.started == []
    assert not list((tmp_path / "pids").glob("*.json"))
