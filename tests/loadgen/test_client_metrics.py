"""The load generator's client /metrics count good requests by the report's rule (servescope/judgements/slo.py) and show the objective."""

from __future__ import annotations

from loadgen.client_metrics import ClientMetrics
from servescope.contracts import series
from servescope.judgements import slo
from tests.servescope.judgements.test_slo import rec


def test_good_and_total_counters_follow_the_slo_rule_and_the_objective_is_exposed():
    metrics = ClientMetrics(spec=slo.parse("ttft<=0.5", objective=0.9))
    for record in (rec(ttft=0.1), rec(ttft=0.2, started=101.0, scheduled=100.0), rec(ttft=0.9), rec(ok=False)):
        metrics.observe(record)
    value = metrics.registry.get_sample_value
    labels = {"engine": "vllm", "scenario": "knee"}
    assert value(series.CLIENT_GOOD_REQUESTS, labels) == 1  # the late one counts from its schedule: 1.2 s
    assert value(series.CLIENT_GOOD_OUTPUT_TOKENS, labels) == 4
    total = sum(value(series.CLIENT_REQUESTS, {**labels, "outcome": o}) or 0 for o in ("ok", "other_error"))
    assert total == 4
    assert value(series.CLIENT_SLO_OBJECTIVE) == 0.9
