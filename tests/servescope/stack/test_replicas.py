"""N replicas behind nginx: cores per replica, the exporter's view of them, start/stop as one, and refusals."""

from __future__ import annotations

import os
import sys

import psutil
import pytest
import requests

from exporter import config as exporter_config
from exporter.cli import build_parser
from servescope.contracts.settings import KnobTable
from servescope.stack import replicas
from servescope.stack.errors import StackError
from servescope.stack.supervisor import Service
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
    ("kind", "count", "said"), [("vllm", 2, "starts replicas of llamacpp"), ("llamacpp", 0, "expected 1 to 64")]
)
def test_what_cannot_be_started_is_refused_in_one_line(kind, count, said, tmp_path):
    with pytest.raises(StackError, match=said):
        replicas.Replicas(kind, count, table=KnobTable.from_env(), workdir=tmp_path)


def doubles(fail_index: int | None = None):
    """replica_services with the synthetic OpenAI server in place of llama-server (same health path and API)."""

    def services(count, threads, slots, base_port, pin, host="127.0.0.1", table=None):
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
    fleet = replicas.Replicas("llamacpp", 2, table=KnobTable.from_env(), router_port=free_port(), workdir=tmp_path)
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
    fleet = replicas.Replicas("llamacpp", 2, table=KnobTable.from_env(), router_port=free_port(), workdir=tmp_path)
    with pytest.raises(StackError, match="replica 2 exited"):
        with fleet:
            pass
    assert fleet.started == []
    assert not list((tmp_path / "pids").glob("*.json"))


# ---------------------------------------------------------------- knobs and generated config (issue 42)


@pytest.mark.parametrize(
    ("env", "args", "said"),
    [
        ({"REPLICAS_BASE_PORT": "abc"}, [], "stack: REPLICAS_BASE_PORT='abc': expected a whole number from 1 to 65535"),
        ({"REPLICAS_BASE_PORT": "70000"}, [], "stack: REPLICAS_BASE_PORT='70000': expected a whole number from 1 to"),
        (
            {"REPLICAS_BASE_PORT": "65535"},
            [],
            "stack: REPLICAS_BASE_PORT=65535: 2 replicas from it run past port 65535",
        ),
        ({}, ["--count", "100000"], "stack: replicas: --count 100000: expected 1 to 64"),
        ({"REPLICAS_SLOTS": "many"}, [], "stack: REPLICAS_SLOTS='many': expected a whole number from 1 to 256"),
        ({"ROUTER_PORT": "-1"}, [], "stack: ROUTER_PORT='-1': expected a whole number from 1 to 65535"),
        ({"PLAN_ROUTING": "random"}, [], "stack: PLAN_ROUTING='random': expected round_robin or least_conn"),
        (
            {"SERVESCOPE_STATE": "/tmp/x\nserver {"},
            [],
            "stack: SERVESCOPE_STATE='/tmp/x\\nserver {': expected a folder",
        ),
    ],
)
def test_replicas_knobs_are_checked_where_they_are_read_with_one_line_naming_them(tmp_path, env, args, said):
    """Issue 42: `stack replicas` with REPLICAS_BASE_PORT=abc or 70000, or --count 100000, raised ValueError or
    OverflowError; each is one line naming the knob (or the option), exit 1 or 2, nothing started."""
    from tests.harness import run_cli

    proc = run_cli("stack", "replicas", *args, env={**os.environ, "SERVESCOPE_STATE": str(tmp_path), **env}, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode in (1, 2) and len(lines) == 1 and lines[0].startswith(said), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_any_replicas_knob_value_is_taken_within_its_bounds_or_refused_naming_it(monkeypatch):
    """Property (fixed seed): whatever text the REPLICAS_* and ROUTER_PORT knobs hold, reading them gives values
    within their bounds or one KnobError line naming the knob; never another exception."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from servescope.contracts import knobs

    texts = st.sampled_from(["1", "2", "0", "-1", "65535", "70000", "abc", "", " 4 ", "1e3", "٣", "0x10"]) | st.text(
        st.characters(exclude_characters="\x00"),
        max_size=8,  # an environment variable holds no NUL
    )

    @settings(
        derandomize=True, max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(base=texts, router=texts, threads=texts, slots=texts, pin=texts, count=st.integers(-3, 70_000))
    def read(base, router, threads, slots, pin, count):
        for key, value in (
            ("REPLICAS_BASE_PORT", base),
            ("ROUTER_PORT", router),
            ("REPLICAS_THREADS", threads),
            ("REPLICAS_SLOTS", slots),
            ("REPLICAS_PIN", pin),
        ):
            monkeypatch.setenv(key, value)
        try:
            table = KnobTable.from_env()  # the knobs as `replicas` reads them at its entry
            got_threads, got_slots, _ = replicas.settings(table)
            fleet = replicas.Replicas("llamacpp", count, table=table, threads=got_threads, slots=got_slots)
        except knobs.KnobError as exc:
            assert str(exc).split("=", 1)[0] in ("REPLICAS_BASE_PORT", "ROUTER_PORT", "REPLICAS_THREADS",
                                                 "REPLICAS_SLOTS", "REPLICAS_PIN"), exc  # fmt: skip
            assert "\n" not in str(exc)
            return
        except StackError as exc:
            assert str(exc).startswith("replicas: --count") and not 1 <= count <= replicas.MAX_REPLICAS
            return
        assert 1 <= fleet.base_port and fleet.base_port + count - 1 <= 65535 and 1 <= fleet.router_port <= 65535
        assert 1 <= fleet.slots <= 256 and fleet.threads >= 1

    read()


def test_a_folder_that_would_write_nginx_directives_is_refused(tmp_path):
    """Issue 42: a SERVESCOPE_STATE holding a newline and a server block wrote directives into nginx.conf. Paths go in
    quotes; one with a quote, a backslash or a control character is refused, as is an upstream that is not host:port."""
    from servescope.stack.router import config

    for folder in (tmp_path / "x;\n}\nserver { listen 9; }", tmp_path / 'a"b', tmp_path / "a\\b"):
        with pytest.raises(StackError, match="holds a quote, a backslash or a control character"):
            config(["http://127.0.0.1:18500"], 8100, "round_robin", folder)
    with pytest.raises(StackError, match="replica: '127.0.0.1:1; include /etc/passwd' is not host:port"):
        config(["http://127.0.0.1:1; include /etc/passwd"], 8100, "round_robin", tmp_path)
    text = config(["http://127.0.0.1:18500"], 8100, "least_conn", tmp_path / "with space")
    assert f'pid "{tmp_path}/with space/nginx.pid";' in text


@needs_nginx
def test_the_generated_nginx_conf_passes_nginx_t_before_use_and_a_refusal_is_one_line(tmp_path):
    import shutil

    from servescope.stack.router import config, nginx_test

    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    workdir = tmp_path / "a folder with spaces"
    workdir.mkdir()
    conf = workdir / "nginx.conf"
    conf.write_text(config(["http://127.0.0.1:18500", "http://localhost:18501"], free_port(), "least_conn", workdir))
    assert nginx_test(binary, workdir, conf) is None
    conf.write_text(conf.read_text() + "\nnot_a_directive on;\n")
    refused = nginx_test(binary, workdir, conf)
    assert refused is not None and refused.startswith('unknown directive "not_a_directive"'), refused
