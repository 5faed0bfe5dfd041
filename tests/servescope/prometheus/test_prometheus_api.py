"""servescope/prometheus/prometheus_api.py: whatever a Prometheus (or what claims to be one) answers, a reader gets Prometheus' shape
or one PrometheusError line (issue 42 cases 1, 10 and 14: the boundary every Prometheus reader shares)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.prometheus import prometheus_api
from servescope.prometheus.prometheus_api import Prometheus, PrometheusError, data_of, global_block, matrix, vector
from tests.doubles.hostile_http import Hostile, drip, reply

pytestmark = pytest.mark.timeout(120)


def success(result, kind: str | None = "vector") -> dict:
    data = {"result": result} if kind is None else {"resultType": kind, "result": result}
    return {"status": "success", "data": data}


# What the attack sent (issue 42): each was an AttributeError, TypeError or IndexError in a reader.
HOSTILE = {
    "result a number": success(5, None),
    "result text": success(["abc"]),
    "metric a list": success([{"metric": ["a"], "value": [1, "1"]}]),
    "label a dict": success([{"metric": {"instance": {"a": 1}}, "value": [1, "1"]}]),
    "value null": success([{"metric": {}, "value": [1, None]}]),
    "value short": success([{"metric": {}, "value": [1]}]),
    "time text": success([{"metric": {}, "value": ["x", "1"]}]),
    "time huge": success([{"metric": {}, "value": [10**400, "1"]}]),
    "value words": success([{"metric": {}, "value": [1, "many"]}]),
    "a string result": success([1, "x"], "string"),
    "status missing": {"data": {"result": []}},
    "data a list": {"status": "success", "data": []},
}


@pytest.mark.parametrize("answer", HOSTILE.values(), ids=HOSTILE.keys())
def test_an_answer_that_is_not_a_vector_is_one_error(answer):
    with pytest.raises(ValueError) as caught:
        vector(data_of(json.dumps(answer), 200))
    assert "\n" not in str(caught.value)


def test_matrix_values_must_be_samples():
    """Issue 42 case 10: `[[t, null]]` in a range answer was a TypeError in the plan."""
    with pytest.raises(ValueError, match="sample value is not a number"):
        matrix(data_of(json.dumps(success([{"metric": {}, "values": [[1, None]]}], "matrix")), 200))
    with pytest.raises(ValueError, match="where a matrix was asked"):
        matrix(data_of(json.dumps(success(["abc"], "vector")), 200))


def test_prometheus_own_answers_are_read_as_floats():
    answer = success([{"metric": {"__name__": "up", "job": "x"}, "value": [1700000000.5, "NaN"]}])
    (item,) = vector(data_of(json.dumps(answer), 200))
    assert item["metric"] == {"__name__": "up", "job": "x"} and item["value"][0] == 1700000000.5
    assert math.isnan(item["value"][1])
    assert vector(data_of(json.dumps(success([1, "2.5"], "scalar")), 200)) == [{"metric": {}, "value": [1.0, 2.5]}]
    with pytest.raises(ValueError) as caught:
        data_of(json.dumps({"status": "error", "error": "parse error:\x1b[31m\nok: fine"}), 400)
    assert str(caught.value) == ": parse error:[31m ok: fine"  # after "Prometheus at URL"


# --- property: any JSON a server may send -----------------------------------------------------------------------------
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8))
ANY_JSON = st.recursive(
    SCALARS,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=20,
)
# Near-misses of Prometheus' own shape: the fields it has, each any JSON or what it should be.
SAMPLE = st.one_of(ANY_JSON, st.tuples(st.floats(), st.sampled_from(["1", "NaN", "+Inf", "x"])).map(list))
SERIES = st.fixed_dictionaries(
    {},
    optional={
        "metric": st.one_of(ANY_JSON, st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3)),
        "value": SAMPLE,
        "values": st.one_of(ANY_JSON, st.lists(SAMPLE, max_size=3)),
    },
)
ANSWERS = st.fixed_dictionaries(
    {},
    optional={
        "status": st.one_of(st.just("success"), ANY_JSON),
        "error": ANY_JSON,
        "data": st.one_of(
            ANY_JSON,
            st.fixed_dictionaries(
                {},
                optional={
                    "resultType": st.one_of(st.sampled_from(["vector", "matrix", "scalar", "string"]), ANY_JSON),
                    "result": st.one_of(ANY_JSON, st.lists(SERIES, max_size=4)),
                },
            ),
        ),
    },
)


def _is_shape(items: list[dict], key: str) -> bool:
    def sample(pair) -> bool:
        return isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, float) for x in pair)

    return all(
        isinstance(item["metric"], dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in item["metric"].items())
        and (sample(item["value"]) if key == "value" else all(sample(p) for p in item["values"]))
        for item in items
    )


@settings(derandomize=True, max_examples=400, deadline=None)
@given(ANSWERS, st.sampled_from([200, 400, 503]))
def test_any_answer_is_prometheus_shape_or_one_line(answer, status):
    body = json.dumps(answer)
    for read, key in ((vector, "value"), (matrix, "values")):
        try:
            items = read(data_of(body, status))
        except ValueError as exc:
            assert "\n" not in str(exc) and len(str(exc)) < 400
        else:
            assert _is_shape(items, key)


# --- the configuration endpoint ---------------------------------------------------------------------------------------
def test_only_the_global_block_of_a_configuration_is_read():
    deep = "scrape_configs:\n  - " + "[" * 100_000 + "\n"  # deeper than YAML's parser recurses, after the block
    text = "global:\n  scrape_interval: 2s\n  evaluation_interval: 3s\n" + deep
    assert global_block(text) == {"scrape_interval": "2s", "evaluation_interval": "3s"}
    assert global_block(deep) == {}


@pytest.mark.parametrize(
    "text",
    ["global: " + "[" * 100_000, "global:\n  a: " + "{" * 50_000, "global: [1, 2]", "global:\n\t- x: [", "global: *x"],
    ids=["deep-flow", "deep-map", "a-list", "bad-yaml", "alias"],
)
def test_a_global_block_that_is_not_a_mapping_is_one_error(text):
    """Issue 42 case 1: deep YAML in the config endpoint raised out of the sampler's start-up."""
    with pytest.raises(ValueError) as caught:
        global_block(text)
    assert "\n" not in str(caught.value)


@settings(derandomize=True, max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("global:_ \n\t-[]{}&*!|>'\"#a1s,")), max_size=120))
def test_any_configuration_text_is_a_block_or_one_error(text):
    try:
        top = global_block(text)
    except ValueError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(top, dict)


# --- the client: credentials, redirects, errors as lines -------------------------------------------------------------------
def test_credentials_are_never_in_an_error_and_a_redirect_elsewhere_is_not_followed():
    """Issue 42 case 14: `report plan --prometheus http://bob:PW@...` printed the URL whole, and followed a 302."""
    with Hostile({"/api/v1/query_range": reply(success([], "matrix"))}) as elsewhere:
        moved = reply(b"", 302, {"Location": f"{elsewhere.url}/api/v1/query_range?query=up"})
        with Hostile({"/api/v1/query_range": moved}) as server:
            with pytest.raises(PrometheusError) as caught:
                Prometheus(f"http://bob:PW@127.0.0.1:{server.port}").query_range("up", 0, 60, 15)
        assert elsewhere.requests == []
    assert "redirected to another origin" in str(caught.value) and "PW" not in str(caught.value)


def test_an_error_the_server_words_is_echoed_inert():
    body = {"status": "error", "error": "bad\x1b[2J\nok: everything is fine"}
    with Hostile({"/api/v1/query": reply(body, 400)}) as server:
        with pytest.raises(PrometheusError) as caught:
            Prometheus(server.url).query("up")
    assert str(caught.value) == f"Prometheus at {server.url}: bad[2J ok: everything is fine"


def test_a_dripping_prometheus_costs_its_timeout():
    with Hostile({"/api/v1/query": drip(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")}) as server:
        with pytest.raises(PrometheusError, match="did not answer within 1s"):
            Prometheus(server.url, timeout=1).query("up")


def test_the_timeout_default_is_the_modules():
    assert Prometheus("http://x").timeout == prometheus_api.TIMEOUT_S
