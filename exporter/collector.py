"""The base of every engine collector: fetch on scrape, and report failure as engine_up 0 rather than raising."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.bounds import MAX_MODELS, OVERFLOW_MODEL, ModelLabels
from exporter.heap import give_back_memory
from exporter.upstream import MISSING, Unauthorized, Upstream, UpstreamError
from servescope import engines
from servescope.contracts import series
from servescope.host import engine_identity

log = logging.getLogger("exporter")


# What every engine with a /metrics page reports on the neutral series (vLLM, llama.cpp).
ENGINE_FAMILIES: tuple[tuple[str, str], ...] = (
    (series.REQUESTS_RUNNING, "gauge"),
    (series.REQUESTS_WAITING, "gauge"),
    (series.KV_CACHE_USAGE, "gauge"),
    (series.GENERATED_TOKENS, "counter"),
    (series.PROMPT_TOKENS, "counter"),
    (series.PROMPT_CACHED_TOKENS, "counter"),
    (series.ENGINE_INFO, "gauge"),
)


class EngineCollector:
    """A prometheus_client custom collector for ONE engine instance.

    Subclasses implement `scrape(deadline)` (fetch and yield fresh families; raise on anything
    unexpected) and list the names they may produce in `family_names` so that `describe()`
    never touches the network. `collect()` always yields `servescope_engine_up` and
    `servescope_scrape_duration_seconds` for the instance, whatever happened upstream.
    """

    kind = ""  # the `engine` label: its adapter's name (servescope/engines/<name>.py)
    family_names: tuple[tuple[str, str], ...] = ()  # (name, type) of what scrape() may yield

    def __init__(
        self,
        name: str,
        upstream: Upstream,
        *,
        timeout: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.name = name
        self.upstream = upstream
        self.timeout = timeout
        self.clock = clock
        self._last_error: str | None = None
        self._said: set[str] = set()  # what note() has logged since the engine last failed
        self.invalid = 0  # values dropped as impossible since the exporter started (a counter)
        # What an engine states once per start (served model, max-model-len, version): read on the
        # first good scrape, forgotten when the engine fails so a restarted engine is re-read.
        self.cache: dict = {}

    # --- what subclasses provide ---
    def scrape(self, deadline: float) -> Iterable[Metric]:
        raise NotImplementedError

    def always(self) -> Iterable[Metric]:
        """Families that do not depend on the engine answering (e.g. the Ollama proxy's view)."""
        return ()

    # --- prometheus_client's collector protocol ---
    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(series.ENGINE_UP, "")
        yield GaugeMetricFamily(series.SCRAPE_DURATION, "")
        yield Metric(series.ENGINE_INVALID_SAMPLES.removesuffix("_total"), "", "counter")
        for name, typ in self.family_names:
            yield Metric(name.removesuffix("_total") if typ == "counter" else name, "", typ)

    def collect(self) -> Iterator[Metric]:
        started = self.clock()
        try:
            # Materialised inside the try: a parser failing halfway yields nothing half-done.
            families = list(self.scrape(started + self.timeout))
            up = 1.0
            self._recovered()
        except UpstreamError as exc:
            families, up = [], 0.0
            self._failed(str(exc))
        except Exception as exc:  # noqa: BLE001 -- any surprise in a payload is "engine unreadable", never a crash
            families, up = [], 0.0
            self._failed(f"malformed response from {self.upstream.shown_url}: {type(exc).__name__}: {exc}")
        if self.upstream.large_read:  # the page and what parsing it took are let go by now: give the heap back
            self.upstream.large_read = False
            give_back_memory()
        labels = [self.kind, self.name]
        up_family = GaugeMetricFamily(
            series.ENGINE_UP,
            "1 when the exporter read the engine's endpoints in this scrape, else 0.",
            labels=list(series.ENGINE_LABELS),
        )
        up_family.add_metric(labels, up)
        yield up_family
        duration = GaugeMetricFamily(
            series.SCRAPE_DURATION,
            "Seconds the exporter spent reading this engine instance in this scrape.",
            labels=list(series.ENGINE_LABELS),
        )
        duration.add_metric(labels, self.clock() - started)
        yield duration
        invalid = CounterMetricFamily(
            series.ENGINE_INVALID_SAMPLES,
            "Values the engine sent that cannot be true (NaN, infinite, a negative count, a ratio outside 0..1, "
            "tokens past a slot's context, an unreadable date), dropped instead of exported.",
            labels=list(series.ENGINE_LABELS),
        )
        invalid.add_metric(labels, float(self.invalid))
        yield invalid
        yield from families
        yield from self.always()

    # --- one log line per failure, not one per scrape ---
    def _failed(self, reason: str) -> None:
        self.cache.clear()
        self._said.clear()
        if reason != self._last_error:
            log.warning("%s %s down: %s", self.kind, self.name, reason)
        self._last_error = reason

    def note(self, what: str, key: str | None = None) -> None:
        """Say once (until the engine next fails) what could not be read or was not exported, and why;
        `key` (default: the text) decides what counts as saying the same again."""
        key = what if key is None else key
        if key not in self._said and len(self._said) < 64:
            self._said.add(key)
            log.warning("%s %s: %s", self.kind, self.name, what)

    def valid(self, value: object, check: Callable[[object], float | None], what: str) -> float | None:
        """check(value) (a function of exporter.bounds); None, rejected, when it cannot be true."""
        number = check(value)
        if number is None:
            self.reject(value, what)
        return number

    def reject(self, value: object, what: str) -> None:
        """Count a value left out as impossible; said once per `what`."""
        self.invalid += 1
        self.note(f"dropped {what} = {str(value)[:40]!r}: not a value the engine can mean", key=f"invalid {what}")

    def _recovered(self) -> None:
        if self._last_error is not None:
            log.info("%s %s up again", self.kind, self.name)
        self._last_error = None

    # --- shared by subclasses ---
    def gauge(self, name: str, documentation: str, extra_labels: Iterable[str] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, documentation, labels=[*series.ENGINE_LABELS, *extra_labels])

    def labels(self, *extra: str) -> list[str]:
        return [self.kind, self.name, *extra]

    def model_labels(self, names: Iterable[str]) -> ModelLabels:
        """Label values for the models this engine lists (exporter.bounds): its first MAX_MODELS, then "other"."""
        labels = ModelLabels(names)
        if labels.overflow:
            self.note(
                f"lists more than {MAX_MODELS} models: {labels.overflow} of them are reported as model={OVERFLOW_MODEL!r}",
                key="overflow",
            )
        return labels

    def identity(self, deadline: float) -> engine_identity.Identity:
        """What the engine says about itself (servescope.host.engine_identity), read once per engine start.

        An endpoint that is off (404/501) or wants an API key costs what it would have said, not the
        engine: that is noted once and read again after IDENTITY_RETRY_S. An engine that does not
        answer at all raises (engine down).
        """
        cached = self.cache.get("identity")
        if cached is not None and (not cached.errors or self.clock() < self.cache["identity_at"] + IDENTITY_RETRY_S):
            return cached

        def get_json(path: str):
            payload = self.upstream.get_json(path, deadline, missing_ok=True)
            if payload is MISSING:
                raise EndpointOff("not served by this engine (404/501)")
            return payload

        identity = engine_identity.identify(self.kind, get_json, recoverable=(EndpointOff, Unauthorized))
        for path, reason in identity.errors.items():
            self.note(f"cannot read {path}: {reason}{self.key_hint(reason)}")
        self.cache["identity"], self.cache["identity_at"] = identity, self.clock()
        return identity

    def optional(self, get: Callable, path: str, deadline: float, without: str):
        """get(path) for an endpoint the engine may have off (404/501) or behind an API key: MISSING then, said once."""
        try:
            payload = get(path, deadline, missing_ok=True)
        except Unauthorized as exc:
            self.note(f"cannot read {path}: {exc}{self.key_hint(str(exc))}: {without}")
            return MISSING
        if payload is MISSING:
            self.note(f"{path} is off (404/501): {without}")
        return payload

    def key_hint(self, reason: str) -> str:
        env = engines.ENGINES[self.kind].api_key_env
        return f" (set {env}, or api_key in the config file)" if env and "API key" in reason else ""


# An identity endpoint that failed is asked again this often (a key set, a feature turned on, a restart).
IDENTITY_RETRY_S = 60.0


class EndpointOff(Exception):
    """The engine answered 404/501 for an endpoint: the feature is off in this build or this start."""


# One HELP per engine-neutral family: families from every engine are merged under one name, so the text names each
# engine's source (its adapter's metrics page or `explains`), and which engines report none.
_HELP_BASE = {
    series.REQUESTS_RUNNING: "Requests in the running batch.",
    series.REQUESTS_WAITING: "Requests queued, not yet scheduled.",
    series.KV_CACHE_USAGE: "Fraction 0..1 of the KV cache in use.",
    series.GENERATED_TOKENS: "Generated (output) tokens.",
    series.PROMPT_TOKENS: "Prompt tokens of the requests, computed or taken from a cache.",
    series.PROMPT_CACHED_TOKENS: "Prompt tokens taken from the engine's prefix / prompt cache instead of computed.",
    series.PREEMPTIONS: (
        "Requests preempted (taken out of the running batch, their KV blocks freed, recomputed later) because the KV "
        "cache was full."
    ),
    series.ENGINE_INFO: "Engine version, value 1.",
    series.KV_BLOCK_SIZE: "Tokens per KV-cache block.",
    series.KV_BLOCKS: "KV-cache blocks.",
    series.KV_CAPACITY_TOKENS: "Tokens the KV cache holds.",
    series.KV_MAX_CONCURRENCY: "Requests of the served max-model-len that fit in the KV cache at once.",
}


def _help(name: str, base: str) -> str:
    said = [f"{a.said}: {where}" for a in engines.ENGINES.values() if (where := a.where(name))]
    none = [a.said for a in engines.ENGINES.values() if not a.where(name)]
    if none:
        said.append(
            f"{', '.join(none[:-1])} and {none[-1]} report none" if len(none) > 1 else f"{none[0]} reports none"
        )
    return f"{base} {'; '.join(said)}."


HELP = {name: _help(name, base) for name, base in _HELP_BASE.items()}
