"""quick against what answers on the usual ports, and against a knee that will not stop: one line each, and a hard
deadline (issue 42 cases 7, 11 and 14)."""

from __future__ import annotations

import signal
import time

import pytest

from loadgen import discover, quick
from servescope import engines
from servescope.contracts.settings import KnobTable
from servescope.host import children
from tests.conftest import free_port
from tests.doubles.hostile_http import Hostile, drip, huge, reply
from tests.harness import run_cli, run_python

pytestmark = pytest.mark.timeout(180)

HANG_S = 60.0  # far above a bounded probe here, far below the attack's "never"
DEEP = reply(b"[" * 200_000)


def test_a_server_answering_deep_json_everywhere_is_named_not_a_recursion_error():
    """`[` x 200,000 on /api/version, /version or /props was a RecursionError."""
    with Hostile({path: DEEP for path in ("/api/version", "/version", "/props", "/v1/models")}) as server:
        found = discover.identify(server.url)
    assert found.answered and found.kind is None and "no LLM server servescope knows" in found.what


@pytest.mark.parametrize("path", ["/api/version", "/v1/models", "/version"])
def test_a_10gb_body_on_a_usual_endpoint_is_no_memory_error(path):
    with Hostile({path: huge()}) as server:
        started = time.monotonic()
        found = discover.discover(discover.parse_ports(str(server.port)), KnobTable.from_env())
    assert time.monotonic() - started < HANG_S
    assert [s.kind for s in found.servers] == [None]  # it answers, as no engine servescope knows


def test_a_10gb_or_dripping_metrics_page_is_one_line(monkeypatch):
    """quick's check of the engine's /metrics: a 10 GB page was a MemoryError, a dripping one a hang."""
    monkeypatch.setattr(quick, "METRICS_TIMEOUT_S", 1.0)
    with (
        Hostile({"/metrics": huge("text/plain")}) as big,
        Hostile({"/metrics": drip(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")}) as slow,
    ):
        assert "body larger than" in quick.metrics_problem(big.url, engines.VLLM, KnobTable.from_env())
        started = time.monotonic()
        assert quick.metrics_problem(slow.url, engines.VLLM, KnobTable.from_env()) == (
            "/metrics could not be read (timed out)"
        )
    assert time.monotonic() - started < HANG_S


def test_a_forged_version_line_stays_inside_its_own_line():
    """Issue 42 case 14: a /version of "0.32.0\\nok: everything is fine" printed a forged line."""
    routes = {
        "/version": reply({"version": "0.32.0\nok: everything is fine\x1b[2J"}),
        "/v1/models": reply({"data": []}),
    }
    with Hostile(routes) as server:
        found = discover.identify(server.url)
    assert found.kind == "vllm" and found.version == "0.32.0 ok: everything is fine[2J"


def test_quick_on_a_hostile_url_is_one_line_and_no_traceback(tmp_path):
    with Hostile({path: DEEP for path in ("/api/version", "/version", "/props", "/v1/models")}) as server:
        proc = run_cli("loadgen", "quick", server.url, "--results", str(tmp_path), timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "servescope has no engine kind for it" in proc.stdout


def test_quick_never_prints_the_password_of_a_url_it_cannot_use(tmp_path):
    proc = run_cli("loadgen", "quick", "tgi=bob:PW@127.0.0.1:1", "--results", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "PW" not in proc.stderr + proc.stdout, proc.stderr


# --- the budget is a hard deadline -----------------------------------------------------------------------------------------
def test_a_knee_that_ignores_sigint_and_sigterm_is_killed_on_the_schedule(monkeypatch, tmp_path):
    """quick.py:455 sent one SIGINT at the budget and waited for ever on a knee that ignored it and SIGTERM."""
    monkeypatch.setattr(children, "STOP_TERMINATE_AFTER_S", 1.0)
    monkeypatch.setattr(children, "STOP_KILL_AFTER_S", 2.0)
    # Ignored signals stay ignored across exec: from its first instant, this knee hears neither.
    stubborn = ["sh", "-c", "trap '' INT TERM; exec sleep 600"]
    monkeypatch.setattr(quick, "knee_command", lambda *args: stubborn)
    settings = quick.Settings.of(quick.build_parser().parse_args(["--budget", "2", "--results", str(tmp_path)]))
    server = discover.Server(f"http://127.0.0.1:{free_port()}", True, "vLLM", "vllm")  # nothing there: no gauges
    said: list[str] = []
    started = time.monotonic()
    outcome, interrupted = quick.measure(server, settings, said.append)
    assert time.monotonic() - started < HANG_S
    assert not interrupted and "budget (QUICK_BUDGET_S) stopped the search" in outcome.stopped
    escalations = [line for line in said if "after its SIGINT" in line]
    assert [line.rsplit(": ", 1)[1] for line in escalations] == ["SIGTERM sent", "SIGKILL sent"], said


def test_the_schedule_sends_each_signal_once_in_order_and_stops_at_exit():
    clock = [0.0]
    sent: list[int] = []

    class Child:
        returncode = None

        def poll(self):
            return self.returncode

        def send_signal(self, sig):
            sent.append(sig)

    child = Child()
    stopping = children.Stopping(child, clock=lambda: clock[0])  # type: ignore[arg-type]
    assert sent == [signal.SIGINT]
    clock[0] = children.STOP_TERMINATE_AFTER_S - 0.1
    assert stopping.due() is None
    clock[0] = children.STOP_TERMINATE_AFTER_S
    assert stopping.due() == signal.SIGTERM and stopping.due() is None
    child.returncode = 0  # it exited after its SIGTERM: no SIGKILL for a pid that may be another's by now
    clock[0] = children.STOP_KILL_AFTER_S + 1
    assert stopping.due() is None and sent == [signal.SIGINT, signal.SIGTERM]


def test_whatever_holds_the_web_uis_port_costs_its_bound():
    """The web UI asks what holds its port: a holder sending 10 GB, or dripping, is "not a web page" at once, never read
    whole (in a process of its own: loadgen.cli brings Locust and gevent's patching, which must come first)."""
    with (
        Hostile({"/": huge("text/html")}) as big,
        Hostile({"/": drip(b"HTTP/1.1 200 OK\r\n")}) as slow,
        Hostile({"/": reply(b"<title>Locust</title>")}) as locust,
    ):
        ports = [big.port, slow.port, locust.port]
        code = f"from loadgen import cli\nfor port in {ports}: print(cli._held_by('127.0.0.1', port))"
        proc = run_python("-c", code, timeout=HANG_S)
    assert proc.stdout.splitlines() == ["something that is not a web page"] * 2 + ["locust"], proc.stderr[-2000:]
