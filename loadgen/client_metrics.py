"""The load generator's client-side view for Prometheus: TTFT/ITL/E2E histograms, tokens, requests by outcome, users.

servescope_client_ttft_seconds_bucket{engine="vllm",scenario="burst",le="0.5"} 3.0
servescope_client_requests_total{engine="vllm",outcome="ok",scenario="burst"} 3.0
servescope_client_users{engine="vllm",scenario="burst"} 3.0
servescope_client_good_requests_total{engine="vllm",scenario="burst"} 2.0   (met every SLO term: servescope/judgements/slo.py)
servescope_client_slo_objective 0.95   (the attainment the burn-rate rules in prometheus/rules/slo.yml measure against)
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from loadgen.client import ErrorKind
from servescope.contracts import series
from servescope.contracts.runfolder import RequestRecord
from servescope.judgements import slo

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0)


def outcome(record: RequestRecord) -> str:
    """The `outcome` label: ok, or the failure's kind (a bounded value, never the free-text reason)."""
    if record.ok:
        return "ok"
    return record.error_kind or ErrorKind.OTHER.value


class ClientMetrics:
    """Histograms and counters on their own registry; `serve()` exposes them on 127.0.0.1."""

    def __init__(self, registry: CollectorRegistry | None = None, *, spec: slo.SloSpec):
        """`spec`: the SLOs each request is judged by (the run's, read with its options)."""
        self.registry = registry or CollectorRegistry()
        self.spec = spec
        labels = series.CLIENT_LABELS

        # Every series but the objective is per (engine, scenario), on this registry.
        def histogram(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, documentation, labels, buckets=buckets, registry=self.registry)

        def counter(name: str, documentation: str) -> Counter:
            return Counter(name, documentation, labels, registry=self.registry)

        self.ttft = histogram(series.CLIENT_TTFT, "Client-side time to first non-empty content chunk.", TTFT_BUCKETS)
        self.itl = histogram(series.CLIENT_ITL, "Client-side gap between consecutive content chunks.", ITL_BUCKETS)
        self.e2e = histogram(series.CLIENT_E2E, "Client-side send to last content chunk.", E2E_BUCKETS)
        self.output_tokens = counter(
            series.CLIENT_OUTPUT_TOKENS, "Output tokens received (usage / eval_count, else chunks)."
        )
        self.requests = Counter(
            series.CLIENT_REQUESTS, "Requests finished, by outcome.", (*labels, "outcome"), registry=self.registry
        )
        self.users = Gauge(series.CLIENT_USERS, "Locust users running.", labels, registry=self.registry)
        # Good / total = attainment: the same rule as the report's goodput (servescope/judgements/slo.py).
        self.good = counter(series.CLIENT_GOOD_REQUESTS, f"Requests that met every SLO term ({self.spec.text}).")
        self.good_tokens = counter(
            series.CLIENT_GOOD_OUTPUT_TOKENS, "Output tokens of requests that met every SLO term."
        )
        self.objective = Gauge(
            series.CLIENT_SLO_OBJECTIVE, "The attainment the SLOs ask for (SLO_ATTAINMENT).", registry=self.registry
        )
        self.objective.set(self.spec.objective)
        self.server = None
        self.port: int | None = None  # where it serves, once serve() has run

    def observe(self, record: RequestRecord) -> None:
        labels = (record.engine, record.scenario)
        if record.ttft_s is not None:
            self.ttft.labels(*labels).observe(record.ttft_s)
        itl = self.itl.labels(*labels)
        for gap in record.itl_s:
            itl.observe(gap)
        if record.ok and record.e2e_s is not None:
            self.e2e.labels(*labels).observe(record.e2e_s)
        if record.output_tokens:
            self.output_tokens.labels(*labels).inc(record.output_tokens)
        self.requests.labels(*labels, outcome(record)).inc()
        good = self.good.labels(*labels)  # present (at 0) from the first request on: attainment is defined
        good_tokens = self.good_tokens.labels(*labels)
        if self.spec.good(record):
            good.inc()
            good_tokens.inc(record.output_tokens or 0)

    def set_users(self, engine: str, scenario: str, users: int) -> None:
        self.users.labels(engine, scenario).set(users)

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """The port it serves on (port 0: a free one); raises OSError when the port is taken."""
        self.server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return self.server.server_address[1]

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
