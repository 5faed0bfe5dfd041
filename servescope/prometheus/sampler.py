"""The run's own server-side time series: every engine's lever gauges, read from the exporter every SAMPLE_INTERVAL_MS during load phases.

One code path: the exporter's collectors read the engines (vLLM /metrics, llama.cpp /metrics and
/slots, Ollama through its proxy) for Prometheus, and the same collectors answer this sampler; it
parses the exporter's page with the exporter's own exposition parser, asking only for the
engine-neutral series it keeps (`name[]`, prometheus_client's filter). Prometheus stays the
source for dashboards and long windows; a run's report reads these samples, taken 10x a second
on the clock of the request records, so a burst that ends inside one scrape is still seen.

Load generator and benchmarks use it the same way::

    sampler = Sampler.for_run(folder, expected=[("vllm", "vllm")])
    sampler.start("burst")   # one read at once, then every interval
    ...                      # the phase runs
    sampler.stop()           # one last read (the drain), then quiet until the next phase
    sampler.close()
"""

from __future__ import annotations

import functools
import math
import sys
import threading
import time
from collections.abc import Callable, Iterable
from urllib.parse import urlencode

from servescope.contracts import metrics_mode, series, urls
from servescope.contracts.runfolder import RunFolder, SampleRecord, append_samples
from servescope.contracts.settings import SamplerSettings
from servescope.host import bounded_http
from servescope.prometheus import prometheus_api
from servescope.prometheus.exposition import Samples, parse_exposition
from servescope.text import printable

# What a sample keeps: the three lever gauges, the counters the report turns into rates, the KV pool.
KEPT = (
    series.REQUESTS_RUNNING,
    series.REQUESTS_WAITING,
    series.KV_CACHE_USAGE,
    series.GENERATED_TOKENS,
    series.PROMPT_TOKENS,
    series.PROMPT_CACHED_TOKENS,
    series.PREEMPTIONS,
    series.KV_BLOCK_SIZE,
    series.KV_BLOCKS,
    series.KV_CAPACITY_TOKENS,
    series.KV_MAX_CONCURRENCY,
)
WANTED = frozenset((series.ENGINE_UP, *KEPT))
# Per engine instance, several models (Ollama) or pools: counts add up, these take the largest.
LARGEST_ACROSS_MODELS = frozenset((series.KV_CACHE_USAGE, series.KV_BLOCK_SIZE))
# The longest engine or instance name a record keeps (the exporter's own cap, exporter/bounds.py's MAX_LABEL_BYTES).
MAX_LABEL_CHARS = 128
# A pause longer than this many intervals between two reads is a gap (time nobody read), for every reader.
GAP_FACTOR = 1.5
# Longer than the exporter's own per-engine budget (3 s by default, below 1 s natively), so a slow
# engine costs its own samples, not the page's.
READ_TIMEOUT_S = 5.0
HEADERS = {"Accept": "text/plain", "User-Agent": "servescope-sampler"}
# Where the samples come from: the exporter's page (fans out to every engine with a deadline each; 100 ms reads), or
# Prometheus' query API in fleet mode (the recording rules' series, at Prometheus' own resolution).
FROM_EXPORTER = "exporter"
FROM_PROMETHEUS = "prometheus"
SOURCES = (FROM_EXPORTER, FROM_PROMETHEUS)
AUTO = "auto"
PROMETHEUS_QUERY = '{__name__=~"' + "|".join(sorted(WANTED)) + '"}'
# A read whose exporter answered but could not read the engine (down, frozen, its page failing): the engine's fault,
# where an exporter that did not answer says nothing about the engine.
ENGINE_UNREAD = f"the exporter could not read this engine ({series.ENGINE_UP} 0)"


def split_at_gaps(points: list[tuple[float, float | None]], spacing: float | None) -> list[tuple[float, float | None]]:
    """The points with (t, None) put in wherever two reads are more than GAP_FACTOR spacings apart.

    A series is a read every `spacing` seconds (the sampling interval, a Prometheus step); a longer
    pause is time nobody read (a read that hung, a stack that was down): it is drawn as a gap, never
    as a line from the value before it to the value after it. The gap starts one spacing after the
    last read, which is how long that read's value stands for.
    """
    out: list[tuple[float, float | None]] = []
    for i, (t, value) in enumerate(points):
        if i and spacing and t - points[i - 1][0] > GAP_FACTOR * spacing:
            out.append((points[i - 1][0] + spacing, None))
        out.append((t, value))
    return out


def combine_models(name: str, values: Iterable[float]) -> float:
    """One value per engine instance from its per-model series: a usage ratio is the fullest pool, counts add up."""
    values = list(values)
    return max(values) if name in LARGEST_ACROSS_MODELS else sum(values)


def engine_values(samples: Samples) -> dict[tuple[str, str], dict[str, float] | None]:
    """(engine, instance) -> {series: value} from a parsed exporter page; None for an engine it could not read.

    An engine the exporter could not read has no values, except what the exporter saw itself: the
    Ollama proxy's running / waiting stand while Ollama's API is down, and are kept.
    """
    out: dict[tuple[str, str], dict[str, float] | None] = {}
    for labels, up in samples.get(series.ENGINE_UP, ()):
        out[_instance_key(labels)] = {} if up == 1 else None
    per_model: dict[tuple[str, str], dict[str, list[float]]] = {}
    for name in KEPT:
        for labels, value in samples.get(name, ()):
            key = _instance_key(labels)
            if key in out and math.isfinite(value):  # NaN is no value; an infinity none a gauge can have
                per_model.setdefault(key, {}).setdefault(name, []).append(value)
    for key, by_name in per_model.items():
        out[key] = {name: combine_models(name, values) for name, values in by_name.items()}
    return out


def _instance_key(labels: dict[str, str]) -> tuple[str, str]:
    """(engine, instance) as the run's records keep them: printable, no longer than the exporter's own labels (a
    source's labels are another service's text: its engine and instance names go into every record)."""
    return _shown_instance(labels.get("engine", ""), labels.get("instance", ""))


@functools.lru_cache(maxsize=1024)
def _shown_instance(engine: str, instance: str) -> tuple[str, str]:
    """Made printable once per name: every read sees the same few instances on every series (a read's cost stays
    the parse of its lines, not two rounds of printable.line per sample); bounded against a source inventing names."""
    return printable.line(engine, limit=MAX_LABEL_CHARS), printable.line(instance, limit=MAX_LABEL_CHARS)


def source_kind(settings: SamplerSettings) -> str:
    """Where the samples come from (SAMPLE_SOURCE): `auto` reads the exporter in exporter mode and Prometheus in
    fleet mode, where the exporter no longer has the series the recording rules make."""
    value = settings.source.strip().lower() or AUTO
    if value not in (AUTO, *SOURCES):
        raise ValueError(f"SAMPLE_SOURCE={value!r}: expected auto, {' or '.join(SOURCES)}")
    if value != AUTO:
        return value
    return FROM_PROMETHEUS if metrics_mode.is_fleet(settings.metrics_mode) else FROM_EXPORTER


# A resolution longer than this is not one a run's gauges can use (a configuration of `99999999999h`): the stack's.
MAX_RESOLUTION_S = 600.0


def prometheus_resolution_s(url: str, timeout_s: float = READ_TIMEOUT_S, interval_ms: int | None = None) -> float:
    """How often Prometheus' values change: `interval_ms` (SAMPLE_PROMETHEUS_INTERVAL_MS), else its own
    configuration's longer of scrape and rule evaluation interval (a read more often than that only repeats a value),
    else the stack's. Asked through the bounded client, only the configuration's `global:` block read: never longer
    than `timeout_s`."""
    from servescope.prometheus import prometheus_config

    if interval_ms is not None:
        return interval_ms / 1000.0
    fallback = prometheus_config.interval_s(prometheus_config.DEFAULT_SCRAPE_INTERVAL)
    try:
        top = prometheus_api.Prometheus(url, timeout=timeout_s).global_config()
        # Prometheus' own defaults when its configuration says nothing: scrape 1m, evaluation 1m.
        seconds = max(
            prometheus_config.interval_s(str(top.get(k, "1m"))) for k in ("scrape_interval", "evaluation_interval")
        )
    except (prometheus_api.PrometheusError, ValueError):
        return fallback
    return seconds if 0 < seconds <= MAX_RESOLUTION_S else fallback


class Sampler:
    """Reads the exporter's page on a thread (a greenlet under gevent) and appends SampleRecords to the run folder."""

    def __init__(
        self,
        folder: RunFolder,
        source: str,
        interval_s: float,
        *,
        expected: Iterable[tuple[str, str]] = (),
        timeout_s: float = READ_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
        notify: Callable[[str], None] | None = None,
        kind: str = FROM_EXPORTER,
    ):
        if interval_s < 0:
            raise ValueError(f"sampling interval must be >= 0 ms, got {interval_s * 1000:g}")
        self.folder = folder
        self.source = source.rstrip("/")
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.notify = notify  # told once per new kind of failure, one line
        if "://" not in self.source:
            self.source = f"http://{self.source}"
        self.shown = printable.line(urls.redact(self.source))  # what every line and record says: no password
        self.kind = kind
        if kind == FROM_PROMETHEUS:
            self._path = "/api/v1/query?" + urlencode({"query": PROMETHEUS_QUERY})
        else:
            self._path = "/metrics?" + urlencode([("name[]", n) for n in sorted(WANTED)])
        self._origin: bounded_http.Origin | None = None  # kept-alive connections, opened at the first read
        # Instances to mark missing when the exporter itself does not answer: the run's until the exporter
        # has answered, then the ones on its page (its names may differ from the run's: the report matches them).
        self.known: dict[tuple[str, str], None] = dict.fromkeys(expected)
        self.phase: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reads = 0
        self.failed_reads = 0  # reads that got no values: gaps in the gauges, each a record marked missing
        self.last_error: str | None = None

    @classmethod
    def for_run(cls, folder: RunFolder, expected: Iterable[tuple[str, str]], settings: SamplerSettings) -> Sampler:
        """The knobs' sampler: SAMPLE_INTERVAL_MS (0: off) from SAMPLE_EXPORTER_URL (default the local exporter), or
        in fleet mode (SAMPLE_SOURCE) from SAMPLE_PROMETHEUS_URL at Prometheus' resolution."""
        interval, kind = settings.interval_ms / 1000.0, source_kind(settings)
        if kind == FROM_EXPORTER:
            return cls(folder, settings.exporter_url, interval, expected=expected, notify=_to_stderr)
        source = settings.prometheus_url
        if interval > 0:
            interval = max(interval, prometheus_resolution_s(source, interval_ms=settings.prometheus_interval_ms))
        else:
            interval = 0.0
        return cls(folder, source, interval, expected=expected, notify=_to_stderr, kind=kind)

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0

    def describe(self) -> str:
        if not self.enabled:
            return "server samples: off (SAMPLE_INTERVAL_MS=0)"
        if self.kind == FROM_PROMETHEUS:
            return (
                f"server samples: every {self.interval_s * 1000:g} ms from Prometheus at {self.shown} (fleet mode: "
                f"its latest values, up to one scrape or rule evaluation old) during load phases"
            )
        return f"server samples: every {self.interval_s * 1000:g} ms from {self.shown}/metrics during load phases"

    # --- phases ---
    def start(self, phase: str | None = None) -> None:
        """Sample from now on: one read before returning (so before the phase's first request), then every interval."""
        if not self.enabled:
            return
        self.stop(final_read=False)
        self.phase = phase
        self._stop.clear()
        # The next read is due one interval after this one began, not ended: a slow first read (a cold
        # connection, the exporter's first collection) must not stretch the first interval past a gap.
        first = time.monotonic()
        self.read_once()
        self._thread = threading.Thread(
            target=self._loop, args=(first + self.interval_s,), name="servescope-sampler", daemon=True
        )
        self._thread.start()

    def stop(self, final_read: bool = True) -> None:
        """Stop sampling; with `final_read`, one read after the phase's last request (the queue drained or not)."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        if final_read:
            self.read_once()

    def close(self) -> None:
        self.stop(final_read=False)
        if self._origin is not None:
            self._origin.close()
            self._origin = None

    def _loop(self, due: float) -> None:
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            self.read_once()
            due += self.interval_s
            now = time.monotonic()
            if due < now:
                # The read overran one or more intervals: those ticks are gaps (readers see them as such);
                # catching up with a volley of reads would only put invented density there.
                due += self.interval_s * ((now - due) // self.interval_s + 1)

    # --- one read ---
    def read_once(self) -> list[SampleRecord]:
        """Read the source once and append one record per engine instance; never raises. A read that gets no values
        (the source down, slow past READ_TIMEOUT_S, its answer not what it should be) is a gap: a record per known
        instance marked missing with the reason, counted in `failed_reads`, and the run goes on."""
        sent = self.clock()
        try:
            answer = self._get()
            if self.kind == FROM_PROMETHEUS:
                samples = prometheus_samples(answer.body, answer.status)  # Prometheus says why in its JSON
            elif answer.status != 200:
                raise ValueError(f"HTTP {answer.status}")
            else:
                samples = parse_exposition(answer.text(), WANTED)
            by_engine, error = engine_values(samples), None
        except (bounded_http.ServiceError, ValueError) as exc:
            by_engine, error = {}, _reason(exc)
        except Exception as exc:  # noqa: BLE001 - whatever the source sends, the sampler never ends a run
            by_engine, error = {}, f"its answer could not be read ({type(exc).__name__}: {printable.line(exc, 120)})"
        received = self.clock()
        t, read_s = (sent + received) / 2, received - sent
        self.reads += 1
        records = []
        if error is not None:
            self.failed_reads += 1
            what = f"Prometheus at {self.shown}" if self.kind == FROM_PROMETHEUS else f"exporter at {self.shown}"
            where = "SAMPLE_PROMETHEUS_URL" if self.kind == FROM_PROMETHEUS else "SAMPLE_EXPORTER_URL"
            if self.notify is not None and f"{what}: {error}" != self.last_error:
                self.notify(
                    f"server samples: {what}: {error}; these reads are marked missing "
                    f"({where} points elsewhere, SAMPLE_INTERVAL_MS=0 turns sampling off)"
                )
            self.last_error = f"{what}: {error}"
            records = [
                SampleRecord(t, read_s, self.interval_s, engine, instance, self.phase, missing=self.last_error)
                for engine, instance in self.known
            ]
        else:
            self.known = dict.fromkeys(by_engine)
            for (engine, instance), values in by_engine.items():
                if values is None:
                    missing = ENGINE_UNREAD
                    values = {}
                else:
                    missing = None
                records.append(SampleRecord(t, read_s, self.interval_s, engine, instance, self.phase, values, missing))
        try:
            append_samples(self.folder, records)
        except (OSError, ValueError) as exc:
            self.last_error = f"cannot write {self.folder.path}: {getattr(exc, 'strerror', None) or exc}"
        return records

    def _get(self) -> bounded_http.Answer:
        """The source's answer to one read, whole, within READ_TIMEOUT_S (servescope/host/bounded_http.py: a source
        dripping its bytes costs that and no more; redirects only within its origin; a body past the cap refused)."""
        if self._origin is None:
            self._origin = bounded_http.Origin(self.source, user_agent="servescope-sampler", accept="text/plain")
        return self._origin.get(self._path, time.monotonic() + self.timeout_s, redirects=bounded_http.MAX_REDIRECTS)


def prometheus_samples(body: str | bytes, status: int = 200) -> Samples:
    """An instant query's answer as the exporter page's samples: the engine's `instance` is `exported_instance` where
    Prometheus renamed it (a series scraped from the exporter), else `instance` (a recording rule over the engine's
    own page). An instance the rules read has no engine_up of its own: its series being there stands for it.
    ValueError (one line) for an answer that is not a success vector (servescope/prometheus/prometheus_api.py checks its shape)."""
    try:
        result = prometheus_api.vector(prometheus_api.data_of(body, status))
    except ValueError as exc:
        raise ValueError(str(exc).removeprefix(":").strip()) from None
    out: Samples = {}
    for item in result:
        metric, value = item["metric"], item["value"][1]
        name = metric.get("__name__", "")
        labels = {
            "engine": metric.get("engine", ""),
            "instance": metric.get("exported_instance") or metric.get("instance", ""),
        }
        if "model" in metric:
            labels["model"] = metric["model"]
        if name in WANTED and not math.isnan(value):
            out.setdefault(name, []).append((labels, value))
    up = {(lb["engine"], lb["instance"]) for lb, _ in out.get(series.ENGINE_UP, ())}
    for name in KEPT:
        for labels, _ in out.get(name, ()):
            key = (labels["engine"], labels["instance"])
            if key not in up:
                up.add(key)
                out.setdefault(series.ENGINE_UP, []).append(({"engine": key[0], "instance": key[1]}, 1.0))
    return out


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _reason(exc: BaseException) -> str:
    """Why a read got no values, in a few printable words (the source's URL is said before them)."""
    if isinstance(exc, bounded_http.ServiceError):
        return "timed out" if exc.timed_out else exc.reason
    return printable.line(exc) or type(exc).__name__
