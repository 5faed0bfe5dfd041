"""The whole exporter under attack by engines and clients: scrape budget, bounded /metrics, memory given back."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from exporter.config import Instance
from tests.test_exporter_proxy import ExporterThread
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
