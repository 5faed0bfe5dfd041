"""The whole exporter under attack by engines and clients: scrape budget, bounded /metrics, memory given back."""

from __future__ import annotations

import threading
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import Instance
from servescope import series
from tests.doubles.ollama_simulator import OllamaSimulator
from tests.test_exporter_proxy import MODEL, ExporterThread, chat_body, wait_until
from tests.test_exporter_upstream import PAGE, ScriptedEngine

pytestmark = pytest.mark.timeout(120)


def test_concurrent_scrapes_of_a_dripping_engine_each_stay_within_the_budget():
    """BUG at 6364460: under Prometheus-like scrapes of an engine sending 256 B every 50 ms, 0 of 12 scrapes answered
    (each fetch took 12 s, and scrapes queued behind each other)."""
    dripping = threading.Event()
    dripping.set()

    def script(conn, head):
        if not dripping.is_set():
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nx 1")
            return True
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(PAGE))
        for start in range(0, len(PAGE), 256):
            conn.sendall(PAGE[start : start + 256])
            time.sleep(0.05)
        return False

    budget = 0.5
    with ScriptedEngine(script) as engine:
        instances = (Instance(kind="vllm", name="vllm", url=engine.url, timeout=budget),)
        with ExporterThread(instances=instances) as exporter:
            took: list[float] = []
            bodies: list[str] = []

            def scrape():
                started = time.monotonic()
                body = requests.get(exporter.metrics_url, timeout=30).text
                took.append(time.monotonic() - started)
                bodies.append(body)

            for _ in range(3):  # three rounds of four scrapers at once
                scrapers = [threading.Thread(target=scrape) for _ in range(4)]
                for scraper in scrapers:
                    scraper.start()
                for scraper in scrapers:
                    scraper.join(30)
            assert len(took) == 12 and max(took) < budget + 0.5, took
            assert all('servescope_engine_up{engine="vllm",instance="vllm"} 0.0' in body for body in bodies)


def model_labels_on(page: str) -> set[str]:
    return {
        sample.labels["model"]
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if "model" in sample.labels
    }


def test_client_model_names_cannot_grow_metrics():
    """BUG at 6364460 (issue 13, item 7): 3,000 unknown model names grew /metrics from 6.6 KB to 46 MB (3,001 model
    labels); names that only ever fail got around the 64-name cap; 10 names of 60,000 characters made 41.5 MB."""
    with OllamaSimulator(token_delay=0.001, load_delay=0.0) as sim, ExporterThread(sim.url) as exporter:
        before = requests.get(exporter.metrics_url, timeout=10).text
        with requests.Session() as session:
            names = [f"junk-{i}" for i in range(300)] + ["x" * 60_000 + str(i) for i in range(10)]
            for name in names:
                session.post(f"{exporter.proxy_url}/api/chat", json={"model": name, "messages": []}, timeout=10)
            ok = session.post(f"{exporter.proxy_url}/api/chat", json=chat_body(stream=False), timeout=10)
        assert ok.status_code == 200
        # the last request is counted after every one before it (the proxy counts in order)
        assert wait_until(lambda: exporter.value(series.PROXY_REQUESTS, model=MODEL, outcome="ok") == 1.0)
        page = requests.get(exporter.metrics_url, timeout=10).text
        assert len(page) < len(before) + 20_000, (len(before), len(page))
        labels = model_labels_on(page)
        assert labels <= {MODEL, "other"}, sorted(labels)[:5]  # the real model keeps its label after all that junk
        assert exporter.value(series.PROXY_REQUESTS, model="other", outcome="error") == 310.0
