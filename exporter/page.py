"""Collector for an engine with a Prometheus page: its adapter's mapping (servescope/engines/<name>.py) onto servescope's series.

What is engine-specific is data in the adapter: which sample feeds which neutral series (the first of
a renamed metric's names present on the page), whether it is a count or a 0..1 ratio, summed or
averaged over the engine's other labels, the label naming the model, whether the page may be off.
A subclass adds what the page's gauges cannot say (vLLM's KV pool from cache_config_info labels,
llama.cpp's from GET /slots).

In fleet mode (METRICS_MODE=fleet) Prometheus scrapes the page itself and the recording rules make the page's
series (servescope/prometheus/fleet_rules.py): the collector leaves those out, and reads the page only for its pool's samples.

Values: per model where the page labels them, each impossible value dropped and counted; on an
unlabelled page one value per series, left out whole when any of its lines is impossible.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric

from exporter.bounds import ModelLabels, bounded, count, ratio
from exporter.collector import ENGINE_FAMILIES, HELP, EngineCollector
from exporter.upstream import MISSING, Upstream
from servescope import engines
from servescope.contracts import series
from servescope.engines.base import Identity, Source
from servescope.prometheus.exposition import Samples, parse_exposition


class PageCollector(EngineCollector):
    """One instance of an engine whose adapter has a metrics page; `adapter` is its kind."""

    adapter: engines.EngineKind | None = None  # a subclass's own engine; else given to __init__
    pool_families: tuple[tuple[str, str], ...] = ()  # what a subclass's pool() yields

    def __init__(
        self,
        name: str,
        upstream: Upstream,
        *,
        adapter: engines.EngineKind | None = None,
        fleet: bool = False,
        **kwargs,
    ):
        super().__init__(name, upstream, **kwargs)
        self.adapter = adapter or self.adapter
        if self.adapter is None or self.adapter.metrics is None:
            raise ValueError(f"{type(self).__name__}: an engine adapter with a metrics page is needed")
        self.kind = self.adapter.name
        self.page = self.adapter.metrics
        # One source per series: in fleet mode the rules make these from Prometheus' own scrape of the page.
        self.left_out = self.page.page_series if fleet else frozenset()
        self.sources = tuple(s for s in self.page.sources if s.series not in self.left_out)

    @property
    def family_names(self) -> tuple[tuple[str, str], ...]:
        known = {name for name, _ in ENGINE_FAMILIES}
        own = tuple((s.series, "counter" if s.counter else "gauge") for s in self.sources if s.series not in known)
        named = ENGINE_FAMILIES + own + self.pool_families
        return tuple(family for family in named if family[0] not in self.left_out)

    # --- what a subclass adds
    def before(self, deadline: float) -> Any:
        """Read what the pool needs besides the page (llama.cpp's /slots); its result goes to fallback() and pool()."""
        return None

    def fallback(self, name: str, extra: Any) -> float | None:
        """A neutral series' value when the page does not give it (an unlabelled page only)."""
        return None

    def pool(self, samples: Samples, identity: Identity, on_page: set[str], models: ModelLabels, extra: Any):
        """The KV pool's families beyond the page's gauges."""
        return iter(())

    # --- the page
    def scrape(self, deadline: float) -> Iterator[Metric]:
        path = self.adapter.metrics_path
        if self.left_out and not self.page.extra:
            text = MISSING  # fleet mode, and the pool needs nothing off the page: Prometheus alone reads it
        elif self.page.optional:
            # Off (404/501) or behind an API key: it costs the series it feeds, never the engine.
            text = self.optional(self.upstream.get_text, path, deadline, self.page.without)
        else:
            text = self.upstream.get_text(path, deadline)
        # In fleet mode only the pool's samples are parsed: the rest are Prometheus' to read.
        wanted = frozenset(self.page.extra) if self.left_out else self.page.names
        samples = parse_exposition(text, wanted) if text is not MISSING else {}
        extra = self.before(deadline)
        identity = self.identity(deadline)
        info = self.gauge(series.ENGINE_INFO, HELP[series.ENGINE_INFO], ["version"])
        info.add_metric(self.labels(bounded(identity.version or "unknown")), 1.0)
        yield info
        label = self.page.model_label
        if label is None:
            yield from self._unlabelled(samples, identity, extra)
            yield from self.pool(samples, identity, set(), ModelLabels([]), extra)
            return
        own = self.page.names - frozenset(self.page.extra)
        on_page = {labels.get(label, "") for name in own for labels, _ in samples.get(name, ())}
        models = self.model_labels([*identity.models, *on_page])
        yield from self._labelled(samples, models)
        yield from self.pool(samples, identity, on_page, models, extra)

    def _family(self, source: Source):
        if source.counter:
            return CounterMetricFamily(source.series, HELP[source.series], labels=[*series.ENGINE_LABELS, "model"])
        return self.gauge(source.series, HELP[source.series], ["model"])

    def _chosen(self, source: Source, samples: Samples) -> str | None:
        """The name the page gives the series under: the first present; None for an optional series it lacks."""
        present = next((n for n in source.names if samples.get(n)), None)
        return present if present is not None or source.optional else source.names[0]

    def _labelled(self, samples: Samples, models: ModelLabels) -> Iterator[Metric]:
        read: dict[tuple[str, bool], dict[str, float]] = {}

        def values(name: str, check: Callable, mean: bool) -> dict[str, float]:
            if (name, mean) not in read:  # once per name: an impossible value is counted once
                read[name, mean] = self.by_model(samples, name, check, models, mean=mean)
            return read[name, mean]

        for source in self.sources:
            name = self._chosen(source, samples)
            if name is None:
                continue
            check = ratio if source.ratio else count
            totals = dict(values(name, check, source.mean))
            for extra in source.plus:
                for model, value in values(extra, count, False).items():
                    totals[model] = totals.get(model, 0.0) + value
            family = self._family(source)
            for model, value in totals.items():
                family.add_metric(self.labels(model), value)
            yield family

    def _unlabelled(self, samples: Samples, identity: Identity, extra: Any) -> Iterator[Metric]:
        name_model = self.adapter.model_name or (lambda model: model)
        model = bounded(name_model(identity.model))
        read: dict[str, float | None] = {}

        def total(name: str, check: Callable) -> float | None:
            if name not in read:  # once per name: an impossible value is counted once
                read[name] = self._total(samples, name, check)
            return read[name]

        for source in self.sources:
            name = self._chosen(source, samples)
            if name is None:
                continue
            value = total(name, ratio if source.ratio else count)
            if value is not None:
                value += sum(total(extra, count) or 0.0 for extra in source.plus)
            else:
                value = self.fallback(source.series, extra)
            family = self._family(source)
            if value is not None:
                family.add_metric(self.labels(model), value)
            yield family

    def by_model(
        self, samples: Samples, name: str, check: Callable, models: ModelLabels, *, mean: bool = False
    ) -> dict[str, float]:
        """Values of one sample name per model label, summed (or averaged) over the engine's other labels (vLLM's
        data-parallel `engine` rank); impossible values are dropped and counted."""
        totals: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        for labels, value in samples.get(name, ()):
            number = self.valid(value, check, name)
            if number is not None:
                model = models[labels.get(self.page.model_label, "")]
                totals[model] += number
                counts[model] += 1
        if mean:
            return {model: totals[model] / counts[model] for model in totals}
        return dict(totals)

    def _total(self, samples: Samples, name: str, check: Callable) -> float | None:
        """One sample name's value (summed over its lines), or None when absent or any line is not a count."""
        values = [self.valid(value, check, name) for _, value in samples.get(name, ())]
        return sum(values) if values and None not in values else None
