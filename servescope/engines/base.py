"""The engine adapter: everything servescope knows about one engine kind, as data and pure functions."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from servescope.contracts import engine_kinds, knobs, thresholds
from servescope.engines.panels import Dashboard

# The request APIs the load generator speaks: OpenAI's SSE chat completions, Ollama's native NDJSON /api/chat.
OPENAI_API = "openai"
OLLAMA_API = "ollama"

GetJson = Callable[[str], Any]


@dataclass
class Identity:
    """What an engine says about itself: one reading for the exporter and the load generator."""

    version: str | None = None
    models: dict[str, int | None] = field(default_factory=dict)  # model id -> max_model_len (None: not stated)
    settings: dict[str, Any] = field(default_factory=dict)  # llama.cpp: total_slots, n_ctx, model_path
    loaded: str = ""  # llama.cpp: the model /props names (its --alias, else the file's path)
    errors: dict[str, str] = field(default_factory=dict)  # endpoint path -> why it could not be read

    @property
    def model(self) -> str:
        """The first served model, else the one llama-server says it loaded."""
        return next(iter(self.models), "") or self.loaded


@dataclass(frozen=True)
class Endpoint:
    """One GET an engine answers about itself, and what its payload fills in (ValueError on a shape it never sends)."""

    path: str
    read: Callable[[Any, Identity], None]


def version_of(payload: object, path: str) -> str:
    """`{"version": "x.y.z"}`: vLLM's /version, Ollama's /api/version."""
    if not isinstance(payload, dict) or not isinstance(payload.get("version"), str) or not payload["version"]:
        raise ValueError(f'{path}: expected {{"version": "x.y.z"}}')
    return payload["version"]


def openai_models(payload: object) -> dict[str, int | None]:
    """Model id -> max_model_len (vLLM adds it; None elsewhere) from GET /v1/models."""
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
        raise ValueError("/v1/models: expected an object with a 'data' list")
    models: dict[str, int | None] = {}
    for entry in payload["data"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise ValueError("/v1/models: every entry needs a string 'id'")
        length = entry.get("max_model_len")
        usable = isinstance(length, int | float) and not isinstance(length, bool) and 0 < length < 1 << 40
        models[entry["id"]] = int(length) if usable else None
    return models


def version_endpoint(path: str) -> Endpoint:
    """An endpoint answering `{"version": "x.y.z"}`."""
    return Endpoint(path, lambda payload, identity: setattr(identity, "version", version_of(payload, path)))


def _set_models(payload: object, identity: Identity) -> None:
    identity.models = openai_models(payload)


OPENAI_MODELS = Endpoint("/v1/models", _set_models)


@dataclass(frozen=True)
class Signature:
    """How discovery tells the engine from other servers: a GET only it answers so (loadgen/discover.py)."""

    path: str
    matches: Callable[[int, Any], bool]  # (HTTP status, JSON payload or None) -> it is this engine
    # Signatures are asked in rank order, the most particular first: a {"version"} object at /version (vLLM's) is
    # answered by other servers too, so it comes after theirs.
    rank: int


def version_object(status: int, payload: Any) -> bool:
    """A 200 with `{"version": "x.y.z"}`."""
    return status == 200 and isinstance(payload, dict) and isinstance(payload.get("version"), str)


# The resources a serving knob adds (servescope/judgements/binding.py names the others, which no knob adds).
BATCH_SLOTS = "batch slots"
KV_CAPACITY = "KV capacity"
# Past these, more is not a serving setting a CPU can use: where `make tune` stops raising a knob.
MAX_SLOTS = 256
MAX_CONTEXT = 1 << 20


@dataclass(frozen=True)
class Knob:
    """A serving setting: the knob the stack starts the engine with, the engine's own name for it, and the names a run
    folder records it under (its command line, the engine's reported settings)."""

    flag: str  # what the engine calls it, as advice shows it
    env: str | None = None  # the knob in .env.example the native stack and Compose pass; None: servescope starts none
    option: str | None = None  # the command-line option the stack passes it as; None: the engine reads `env` itself
    names: tuple[str, ...] = ()  # other spellings a run records it under (matched without dashes, case or - vs _)

    @property
    def recorded_as(self) -> tuple[str, ...]:
        return tuple(n for n in (self.option, self.env, *self.names) if n)


@dataclass(frozen=True)
class Lever:
    """What adds more of one resource on this engine: the knob to turn and how each reader says so."""

    resource: str  # BATCH_SLOTS or KV_CAPACITY
    knob: Knob
    advice: str  # what to do with it (the binding rule's one line)
    name: str  # the verdict's name for turning it (report.json's `lever`)
    words: str  # the verdict's instruction: "{now}" where the current setting goes, "{max_model_len}" likewise
    caveat: str = ""  # what not to turn instead, said beside a KV verdict read from the gauges

    @property
    def env(self) -> str | None:
        return self.knob.env

    @property
    def flag(self) -> str:
        return self.knob.flag

    def to_json(self) -> dict[str, Any]:
        """The knee's record of it (knee.json `knob`)."""
        return {"env": self.env, "flag": self.flag, "advice": self.advice}

    def say(self, now: str = "", max_model_len: str = "") -> str:
        return self.words.format(now=now, max_model_len=max_model_len)


# How long a queue lasted before a "which lever" alert fires: never drained over the window, then held for `for:`.
ALERT_LASTED = f"{thresholds.minutes(thresholds.ALERT_WINDOW) + thresholds.minutes(thresholds.ALERT_FOR)} minutes"


@dataclass(frozen=True)
class Alert:
    """One "which lever" alert in words (Prometheus templating in them: {{ $labels.instance }}, {{ $value }})."""

    name: str
    lever: str  # the alert's `lever` label
    summary: str
    description: str


@dataclass(frozen=True)
class AlertRules:
    """The engine's "which lever" rule file, prometheus/rules/<file>: servescope/prometheus/lever_rules.py writes the expressions
    from the engine's queue rule and the threshold table, the words from here."""

    file: str
    group: str
    waiting: Alert  # requests waited for a slot: KV with room, a queue only ever for a slot, or the engine's durations
    kv_full: Alert | None = None  # requests waited on a full KV pool (an engine whose queue may be for either)


# How the exporter reads an engine's KV pool beyond its page's gauges.
POOL_CACHE_CONFIG = "cache_config_info"  # vLLM's cache_config_info labels: blocks x block size, / max-model-len
POOL_SLOTS = "slots"  # llama-server's GET /slots: tokens the busy slots hold over every slot's n_ctx


@dataclass(frozen=True)
class Source:
    """One engine-neutral series (servescope/contracts/series.py) as the engine's metrics page gives it."""

    series: str
    names: tuple[str, ...]  # the engine's sample names: the first one on the page is read (a rename: newest first)
    counter: bool = False  # else a gauge
    ratio: bool = False  # a 0..1 value (else a count)
    mean: bool = False  # averaged over the engine's other labels (data-parallel ranks' equal pools); else summed
    optional: bool = False  # none of the names on the page: no series at all, never a made-up 0
    plus: tuple[str, ...] = ()  # added to it where the page has them (llama.cpp's prompt tokens: computed + cached)
    note: str = ""  # what the exporter's HELP says beside the names

    @property
    def read(self) -> tuple[str, ...]:
        return (*self.names, *self.plus)

    def help(self) -> str:
        said = " + ".join((", else ".join(self.names), *self.plus))
        return f"{said} ({self.note})" if self.note else said


@dataclass(frozen=True)
class MetricsPage:
    """The engine's Prometheus page and how its samples map onto the engine-neutral series."""

    prefix: str  # every sample name of its own starts so ("vllm:"): a page without one is not this engine's
    sources: tuple[Source, ...]
    model_label: str | None = None  # the label naming the model; None: unlabelled, the served model's
    optional: bool = False  # the page may be off (llama-server without --metrics): costs its series, not the engine
    without: str = ""  # what a page that is off costs, in words
    how_on: str = ""  # how to turn it on, said where it answers an error
    pool: str | None = None  # POOL_CACHE_CONFIG, POOL_SLOTS, or None: the page's gauges are all there is
    extra: tuple[str, ...] = ()  # other sample names the exporter reads for `pool`
    # Its own latency histograms as the dashboards chart them: "ttft", "itl", "e2e" -> names (a rename: newest first)
    latency: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Other samples its own dashboard charts as they are: what the panel shows -> names (a rename: newest first)
    charted: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Sample names the engine dropped that servescope once read -> where their value comes from now
    removed: Mapping[str, str] = field(default_factory=dict)

    @property
    def names(self) -> frozenset[str]:
        """Every sample name the exporter reads from the page."""
        return frozenset(n for source in self.sources for n in source.read) | frozenset(self.extra)

    @property
    def page_series(self) -> frozenset[str]:
        """The neutral series the page's own samples give: fleet mode's recording rules make these, not the exporter."""
        return frozenset(source.series for source in self.sources)

    def source(self, series_name: str) -> Source | None:
        return next((s for s in self.sources if s.series == series_name), None)


# Who reads a sample off an engine's page, as `python -m exporter check` (exporter/check.py) names them.
BY_EXPORTER = "the exporter"
BY_DASHBOARDS = "the dashboards"
BY_REPORT = "the report"


@dataclass(frozen=True)
class Reading:
    """One sample servescope reads off an engine's page, under every name it has had, and who reads it."""

    names: tuple[str, ...]  # newest first: the others are its old names
    readers: tuple[str, ...]  # BY_EXPORTER, BY_DASHBOARDS, BY_REPORT
    feeds: str  # what it becomes: a neutral series, "ttft latency", "the KV pool"
    optional: bool = False  # its absence costs a panel or a cross-check, never a neutral series the exporter must give
    histogram: bool = False  # `names` are histogram names: the page carries <name>_bucket, _sum and _count

    @property
    def current(self) -> str:
        return self.names[0]

    @property
    def old(self) -> tuple[str, ...]:
        return self.names[1:]


# The forms an engine's own request timings come in (the report's cross-check and TTFT split read each its way).
DURATIONS = "durations"  # per request, its final object's *_duration in nanoseconds (Ollama's)
TIMINGS = "timings"  # per request, a `timings` object in milliseconds in its final chunk (llama.cpp's)
HISTOGRAMS = "histograms"  # none per request: histograms on its /metrics, read from Prometheus over the run window


@dataclass(frozen=True)
class RequestTimings:
    """The engine's own account of its requests, beside the client's."""

    form: str  # DURATIONS, TIMINGS or HISTOGRAMS
    # HISTOGRAMS: the part of a request each histogram times (queue, prefill, decode, server_e2e), by name
    histograms: Mapping[str, str] = field(default_factory=dict)
    why_aggregate: str = ""  # why only means over a window ("vLLM 0.32 gives no per-request timings")


class KvRoom(Protocol):
    """How many slots the KV space admits at the served max-model-len (the native stack's plan: servescope/stack/tune.KvFit)."""

    max_model_len: int

    def most_slots(self, space_gib: float) -> int: ...

    def space_for(self, slots: int) -> int: ...


# More of a resource: (the new knob values, what changed in words), or None when there is no rule or no room.
RaiseKnob = Callable[[str, Mapping[str, str], KvRoom | None], tuple[dict[str, str], str] | None]


@dataclass(frozen=True)
class Native:
    """How the native stack (`make up` without Docker: servescope/stack/native.py) prepares, starts and waits for the
    engine on this machine."""

    # The stack's module that prepares and launches it, by name: the stack is an app floors above the adapters, which
    # never import it. The hooks it defines are listed in servescope/stack/native.py.
    module: str
    prepares: str = ""  # its one-time preparation as `up` names it ("" : none)
    from_gguf: bool = False  # its preparation starts from the GGUF (a conversion): after it, in the model's chain
    ready_s: int = 120  # seconds `up` waits for its health check to answer
    ready_env: str | None = None  # the knob that sets those seconds instead
    warms_up: bool = False  # its warm-up is the long pole: started first, waited for once the others are up
    found: bool = False  # `up` does not start it on its own account: it joins when one is installed or answering


@dataclass(frozen=True)
class EngineKind:
    """One engine kind. The fields say where it listens and how it is asked; servescope/engines/<name>.py fills them."""

    name: str  # the `engine` label value everywhere: vllm, llamacpp, ollama
    title: str  # how reports and dashboards name it
    api: str  # OPENAI_API or OLLAMA_API
    health_path: str  # a GET that answers 200 once the engine can serve
    metrics_path: str | None  # Prometheus text exposition, None when the engine has none
    port_env: str  # the knob that moves its port
    url_env: str  # the knob that points the exporter/loadgen at an existing instance
    chat_path: str  # where chat requests go
    accepts_ignore_eos: bool  # whether the engine honours `ignore_eos` in a request
    api_key_env: str | None  # the knob holding the key of an engine started with --api-key; None: it has no such flag
    # The knob of the port where the stack's exporter relays this engine's requests (Ollama: its proxy, the only
    # place its requests in flight can be seen); None: load goes to the engine itself.
    proxy_port_env: str | None = None

    short: str = ""  # how running text names it ("vLLM"); the title when empty
    metrics: MetricsPage | None = None  # its page's samples on the neutral series; None: it has no page
    model_name: Callable[[str], str] | None = None  # the model label for a model as it names it (None: as is)
    colour: str = ""  # its colour on every plot (a matplotlib colour); "" : the next free one
    model_env: str = "SERVED_MODEL_NAME"  # the knob naming the model the stack serves on it
    # Its model list is every model installed, not the one it serves (Ollama's /api/tags): the knob's model is asked
    # for when set, and the list says nothing of a model's length.
    lists_installed: bool = False
    # Where a neutral series comes from when not from its page (GET /slots, the exporter's proxy, a label), for the
    # exporter's HELP; a series in neither this nor the page is one the engine cannot report.
    explains: Mapping[str, str] = field(default_factory=dict)
    own_port: int | None = None  # where it listens when started without servescope (its own default)
    signature: Signature | None = None  # how discovery recognises it; None: only ever named by the user
    # What it says about itself, read in this order (servescope/host/engine_identity.py asks each on its own).
    identity: tuple[Endpoint, ...] = ()

    # --- its knobs: what adds batch slots and KV capacity, and what else a report reads of its settings
    levers: tuple[Lever, ...] = ()
    max_model_len: Knob | None = None  # the longest request it admits (section 3's concurrency divides by it)
    stack_knobs: tuple[str, ...] = ()  # the knobs `make up` starts it with: the report's fallback when a run has none
    # Its queue is only ever for a slot (llama.cpp splits its context over the slots up front, Ollama runs
    # OLLAMA_NUM_PARALLEL per model): waiting means batch slots whatever the KV pool says.
    queue_means_slots: bool = False
    # Seconds it held one request outside the model, from the request's own stats (the load generator's record of
    # its durations); None: its stats do not say. Where this exists it decides what the requests waited for: the
    # engine's gauges cannot (Ollama's waiting count, seen by the proxy, holds model loads and prompt evaluation).
    held_s: Callable[[Mapping[str, Any]], float | None] | None = None
    # Its KV knob is split evenly over the slots (llama.cpp's -c over --parallel): slots grow with their share kept.
    context_split_over_slots: bool = False
    # The stack admits no more slots than its KV space holds at full length (the reference page's inequality): make
    # tune raises slots within it, and checks the plan before each restart.
    slots_within_kv: bool = False
    # Where prompts wait inside the running batch, in words ("" when the engine has no such limit to name).
    prefill_in_batch: str = ""
    raise_knob: RaiseKnob | None = None  # make tune's rule; None: the stack cannot restart this engine with new knobs
    alerts: AlertRules | None = None  # the "which lever" alert rules' words
    timings: RequestTimings | None = None  # its own request timings; None: it reports none servescope reads
    native: Native | None = None  # how the native stack runs it; None: the stack never starts it
    dashboard: Dashboard = Dashboard()  # its own dashboard and how the shared ones speak of it

    def port_in(self, table: Mapping[str, str]) -> int:
        """Its port as the knobs set it (`table`: the knobs an entry read; KnobError naming port_env otherwise)."""
        return knobs.as_int(self.port_env, table[self.port_env])

    def default_url(self, table: Mapping[str, str], host: str = "127.0.0.1") -> str:
        """Where it listens on `host` when no URL is given: its port knob."""
        return f"http://{host}:{self.port_in(table)}"

    @property
    def said(self) -> str:
        return self.short or self.title

    def where(self, series_name: str) -> str | None:
        """Where the engine's value of a neutral series comes from, in words; None: it reports none."""
        source = self.metrics.source(series_name) if self.metrics is not None else None
        return source.help() if source is not None else self.explains.get(series_name)

    def lever(self, resource: str) -> Lever | None:
        """The knob that adds `resource`; None where no serving knob of this engine does."""
        return next((lever for lever in self.levers if lever.resource == resource), None)

    def readings(self) -> tuple[Reading, ...]:
        """Every sample servescope reads off its page, from this adapter alone: the neutral series' sources and the
        pool's samples (the exporter's; needed unless the source is optional), its latency histograms and the
        samples its dashboard charts (the dashboards'), its timing histograms (the report's): all optional."""
        page = self.metrics
        if page is None:
            return ()
        found: dict[tuple[str, ...], Reading] = {}

        def add(reading: Reading) -> None:
            known = found.get(reading.names)
            if known is None:
                found[reading.names] = reading
                return
            found[reading.names] = Reading(
                reading.names,
                tuple(dict.fromkeys((*known.readers, *reading.readers))),
                known.feeds,
                known.optional and reading.optional,
                known.histogram or reading.histogram,
            )

        for source in page.sources:
            add(Reading(source.names, (BY_EXPORTER,), source.series, optional=source.optional))
        read = {name for source in page.sources for name in source.names}
        for source in page.sources:
            for name in source.plus:
                if name not in read:  # added "where the page has them"
                    add(Reading((name,), (BY_EXPORTER,), source.series, optional=True))
        for name in page.extra:
            add(Reading((name,), (BY_EXPORTER,), "the KV pool"))
        for which, names in page.latency.items():
            add(Reading(names, (BY_DASHBOARDS,), f"{which} latency", optional=True, histogram=True))
        if self.timings is not None:
            for part, name in self.timings.histograms.items():
                add(Reading((name,), (BY_REPORT,), f"{part} time", optional=True, histogram=True))
        for what, names in page.charted.items():
            add(Reading(names, (BY_DASHBOARDS,), what, optional=True))
        return tuple(found.values())

    @property
    def tuned(self) -> tuple[str, ...]:
        """The knobs `make tune` may move (empty: it cannot tune this engine)."""
        return tuple(lever.env for lever in self.levers if lever.env) if self.raise_knob else ()


def registered_knobs(name: str) -> dict[str, Any]:
    """The knob names of a kind's registration line (servescope/contracts/engine_kinds.py): EngineKind's port_env,
    url_env and api_key_env, so an adapter never spells them a second time."""
    entry = engine_kinds.registration(name)
    return {"port_env": entry.port_env, "url_env": entry.url_env, "api_key_env": entry.api_key_env}


def openai_server(name: str, **fields: Any) -> EngineKind:
    """An engine that speaks the OpenAI API (vLLM, llama.cpp, SGLang): chat at /v1/chat/completions honouring
    `ignore_eos`, Prometheus text at /metrics, and the knobs of its registration line. `fields` are the rest of its
    EngineKind."""
    return EngineKind(
        name=name,
        api=OPENAI_API,
        metrics_path="/metrics",
        chat_path="/v1/chat/completions",
        accepts_ignore_eos=True,
        **registered_knobs(name),
        **fields,
    )
