"""servescope/report/traffic.py's real-service traffic (`report plan --prometheus-query`) against what a Prometheus may answer:
arrivals, or one line; never a traceback, a password, a redirect followed elsewhere (issue 42 cases 10 and 14)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings

from servescope.report import plan, traffic
from tests.doubles.hostile_http import Hostile, reply
from tests.servescope.prometheus.test_prometheus_api import ANSWERS, success
from tests.servescope.report.plan_knees import knee_folder

pytestmark = pytest.mark.timeout(120)

RANGE = "/api/v1/query_range"
NOW = 1_700_000_000.0


def matrix(*points: tuple[float, object]) -> dict:
    return success([{"metric": {"job": "api"}, "values": [list(p) for p in points]}], "matrix")


def planned(url: str) -> traffic.Traffic:
    return traffic.prometheus(url, "sum(rate(x[5m]))", 120, 60, now=NOW)


def test_a_services_rate_becomes_poisson_arrivals():
    with Hostile({RANGE: reply(matrix((NOW - 120, "2"), (NOW - 60, "3")))}) as server:
        offered = planned(server.url)
        assert "start=" in server.requests[0].target and "step=60" in server.requests[0].target
    assert offered.duration_s == 120 and 150 < len(offered.arrivals) < 450  # about 2 x 60 + 3 x 60


@pytest.mark.parametrize(
    "answer",
    [
        {"status": "success", "data": {"result": ["abc"]}},  # was AttributeError (traffic.py:85)
        matrix((NOW, None)),  # [[t, null]]: was TypeError
        matrix((NOW, "1"), ("later", "1")),
        success([{"metric": "api", "values": [[NOW, "1"]]}], "matrix"),
        success(5, "matrix"),
        b"[" * 200_000,  # was RecursionError
    ],
    ids=["result-text", "value-null", "time-text", "metric-text", "result-number", "deep"],
)
def test_a_hostile_answer_is_one_line(answer):
    with Hostile({RANGE: reply(answer)}) as server:
        with pytest.raises(traffic.TrafficError) as caught:
            planned(server.url)
    assert str(caught.value).startswith(f"Prometheus at {server.url}") and "\n" not in str(caught.value)


def test_a_rate_past_the_cap_is_refused_before_any_arrival_is_drawn():
    with Hostile({RANGE: reply(matrix((NOW, "1e300")))}) as server:
        with pytest.raises(traffic.TrafficError, match="more than 2,000,000"):
            planned(server.url)


@pytest.fixture(scope="module")
def prometheus():
    state = {"answer": b""}

    def script(server, conn, request, index):
        conn.sendall(reply(state["answer"], state.get("status", 200)))
        return True

    with Hostile({RANGE: script}) as server:
        yield server, state


@settings(derandomize=True, max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ANSWERS)
def test_any_answer_is_traffic_or_one_line(prometheus, answer):
    """1,690 of 3,000 fuzzed answers crashed the plan (issue 42 case 10)."""
    server, state = prometheus
    state["answer"] = json.dumps(answer)
    try:
        offered = traffic.prometheus(server.url, "up", 120, 60, now=NOW)
    except traffic.TrafficError as exc:
        assert "\n" not in str(exc)
    else:
        assert offered.arrivals and all(a.at >= 0 for a in offered.arrivals)


def test_report_plan_never_prints_the_password_nor_follows_a_redirect_elsewhere(tmp_path, capsys):
    """Issue 42 case 14: `report plan --prometheus http://bob:PW@...` printed the URL whole, and followed a 302."""
    knee = knee_folder(tmp_path)
    with Hostile({RANGE: reply(matrix((NOW, "1")))}) as elsewhere:
        moved = reply(b"", 302, {"Location": f"{elsewhere.url}{RANGE}?query=up"})
        with Hostile({RANGE: moved}) as server:
            url = f"http://bob:PW@127.0.0.1:{server.port}"
            code = plan.main([str(knee), "--prometheus", url, "--prometheus-query", "up", "--out", str(tmp_path / "o")])
        assert elsewhere.requests == []
    err = capsys.readouterr().err
    assert code == 2 and "PW" not in err and err.count("\n") == 1, err
    assert "redirected to another origin" in err
