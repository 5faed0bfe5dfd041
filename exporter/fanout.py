"""One collector over every configured engine instance: read them concurrently, merge families of the same name."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from prometheus_client.core import Metric

from exporter.collector import EngineCollector


class FanoutCollector:
    """Scrapes each instance in its own pool thread so one slow engine costs its timeout once, not per engine.

    Several instances of one kind (or neutral series from different kinds) produce families of
    the same name; Prometheus rejects a name exposed twice, so samples are merged into one family.
    """

    def __init__(self, collectors: Sequence[EngineCollector], *, max_workers: int | None = None):
        self.collectors = list(collectors)
        self._lock = threading.Lock()
        self._running: Future | None = None  # the collection under way, shared with whoever comes meanwhile
        # A thread per instance: every instance is read at once, so a scrape lasts as long as the
        # slowest instance's budget, never the sum of several.
        self._pool = ThreadPoolExecutor(
            max_workers=max_workers or max(1, len(self.collectors)), thread_name_prefix="scrape"
        )

    def describe(self) -> Iterator[Metric]:
        seen: set[str] = set()
        for collector in self.collectors:
            for family in collector.describe():
                if family.name not in seen:
                    seen.add(family.name)
                    yield family

    def collect(self) -> Iterator[Metric]:
        """Every instance read once; a collect() that comes while one runs (another scrape, the run's sampler)
        gets that one's families: an engine is never read twice at once, and its counts never race."""
        with self._lock:
            shared, self._running = self._running, self._running or Future()
        if shared is not None:
            yield from shared.result()
            return
        try:
            families = self._read_all()
            self._running.set_result(families)
        except BaseException as exc:
            self._running.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._running = None
        yield from families

    def _read_all(self) -> list[Metric]:
        results = list(self._pool.map(lambda collector: list(collector.collect()), self.collectors))
        merged: dict[str, Metric] = {}
        for families in results:
            for family in families:
                into = merged.get(family.name)
                if into is None:
                    merged[family.name] = family
                else:
                    into.samples.extend(family.samples)
        return list(merged.values())

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for collector in self.collectors:
            collector.upstream.close()
