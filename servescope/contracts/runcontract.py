"""The run folder contract between the load generator and the report: file names, record fields, units.

results/<run-id>/
  manifest.json     RunManifest: engines (url, version, model, flags), prompt set + sha256, machine, times
  requests.jsonl    one RequestRecord per measured request (warm-up excluded), appended as they finish
  phases.jsonl      one PhaseRecord per load phase (sequential pass, burst k, ramp step, sweep level), with its
                    repetition, attempt, the host's noise and the machine's energy while it ran (see PhaseRecord)
  locust_*.csv, locust.html   Locust's own stats (rounded by Locust: never the source of a reported number)
  workers.log       `python -m loadgen ... --workers N`: what its worker processes printed
  report.md / report.html / report.json / *.png   written by `make report`
  records.duckdb, records.duckdb.seal   a long run's records read once (servescope/contracts/runreader.py): a cache

All durations are seconds (float); wall-clock instants are Unix epoch seconds; engine-native
durations keep the engine's own unit and say so in their key (Ollama: *_ns).

Workload fields (absent in runs written before they existed, read as null): a conversation's turn carries
`conversation`, `turn` and how long its history was (`history_messages`, `history_tokens`);
`cached_tokens` is what the engine said its prompt cache supplied; an open-loop request (rate,
replay) carries `scheduled_at` beside `started_at`, and their difference is its schedule lag.

Records are read in one place, servescope/contracts/runreader.py (DuckDB): every line is checked against REQUEST_FIELDS /
PHASE_FIELDS / SAMPLE_FIELDS once, and what fails is skipped and counted by reason (Skips), never passed on.
The folder itself (created, appended to, read back through that reader) is servescope/contracts/runfolder.py: the contract
sits below both, so the reader and the folder do not import each other.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field, fields
from typing import Any

# What a run can take: no wait, pause, timeout or replay in it may be longer (a trace spans at most this, too).
MAX_RUN_S = 7 * 24 * 3600.0

MANIFEST = "manifest.json"
REQUESTS = "requests.jsonl"
PHASES = "phases.jsonl"
# The JSONL read once into a columnar database beside it (servescope.contracts.runreader): a cache, never the record.
INDEX = "records.duckdb"
# Beside the index: its size, modification time and checksum when made, so a damaged one is known before it is read.
INDEX_SEAL = INDEX + ".seal"
SCHEMA_VERSION = 1
FOLDER_MODE = 0o700  # a run folder: only its owner lists or reads it (README, Security defaults)


def record_json(record: Any, **extra: Any) -> str:
    """A record's fields (and `extra`) as one compact JSON line. Not asdict(): it deep-copies every list and dict one
    item at a time (a request's itl_s of thousands of floats; a sample's values ten times a second), and json writes
    them as they are."""
    return json.dumps({**{f.name: getattr(record, f.name) for f in fields(record)}, **extra}, separators=(",", ":"))


@dataclass
class RequestRecord:
    """One measured request as the client saw it: a line of requests.jsonl."""

    engine: str  # engine kind label: vllm, llamacpp, ollama
    instance: str  # configured instance name (several of one kind may run)
    scenario: str  # sequential, burst, ramp, rate, sweep
    phase: str  # the PhaseRecord.phase this request belongs to
    api: str  # "openai" or "ollama"
    model: str
    prompt_set: str  # prompt set name
    prompt_set_sha256: str
    prompt_id: str
    max_tokens: int
    started_at: float  # epoch seconds at send
    ok: bool
    status: int  # HTTP status, 0 when no response came
    error: str | None = None  # one line: why the request failed
    error_kind: str | None = None  # the same as a bounded value (loadgen.client.ErrorKind): connection_refused, ...
    ttft_s: float | None = None  # send -> first chunk with non-empty content
    e2e_s: float | None = None  # send -> last content chunk
    itl_s: list[float] = field(default_factory=list)  # every gap between consecutive content chunks
    tpot_s: float | None = None  # (e2e - ttft) / (output_tokens - 1)
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    tokens_source: str | None = None  # "usage", "eval_count", or "chunks" (fallback, flagged)
    content_chunks: int = 0
    arrival_index: int | None = None  # order of release within a burst
    scheduled_at: float | None = None  # epoch seconds the schedule said to send it (open loop: rate, trace replay)
    engine_stats: dict[str, Any] = field(default_factory=dict)  # Ollama *_ns fields, llama.cpp timings
    conversation: str | None = None  # the conversation (session) this turn belongs to; None for a single prompt
    turn: int | None = None  # 1-based place in its conversation
    history_messages: int | None = None  # messages sent before this turn's user message (system prompt, earlier turns)
    history_tokens: int | None = None  # the previous turn's prompt + output tokens, as the engine counted them
    # Prompt tokens the engine took from its cache: llama.cpp's timings.cache_n, or usage.prompt_tokens_details.
    # cached_tokens (llama.cpp; vLLM started with --enable-prompt-tokens-details). None: the engine did not say.
    cached_tokens: int | None = None
    worker: int | None = None  # the load generator worker process that sent it (--workers, Locust workers); None: one

    def to_json(self) -> str:
        return record_json(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class PhaseRecord:
    """One load phase as it ran.

    Repeated trials, so that one pass a busy host disturbed cannot become the headline: the reference
    experiment runs each phase several times, interleaved with the other engines'. `repetition` (1, 2, ...)
    says which pass a record belongs to and `attempt` (1, 2, ...) which run of it: a phase flagged noisy may
    be run again, and the later attempt supersedes the earlier one, which stays in the file. The phase name
    stays unique per engine: repetition 1, attempt 1 keeps the plain name ("sequential", "burst-1") and later
    ones carry a suffix (trial_phase_name: "burst-1#2", "sequential#3.retry1"); a request's `phase` is that
    full name. Records written before these fields existed read as repetition 1, attempt 1, no noise.

    `noise` (servescope/host/hostnoise.py) is the host's CPU while the phase ran: the engine's own cores,
    every other program's (other engines by name, other processes by program), servescope's own
    observers, CPU steal and the load average; null when it was not measured.

    `energy` (servescope/host/energy.py) is the machine's energy while the phase ran, from its own counters (RAPL, a
    GPU's): joules, by source and zone, or the reason it was not measured; null in records written before it
    existed, which read as not measured.
    """

    engine: str
    instance: str
    scenario: str
    phase: str  # e.g. "sequential", "burst-1", "ramp-4users", "sweep-c8"; "burst-1#2" in repetition 2
    started_at: float  # epoch seconds: first request sent
    ended_at: float  # epoch seconds: last request finished
    requests: int
    concurrency: int  # users / burst size / sweep level; 1 for sequential
    prompt_set: str
    prompt_set_sha256: str
    max_tokens: int
    repetition: int = 1
    attempt: int = 1
    noise: dict[str, Any] | None = None
    energy: dict[str, Any] | None = None

    @property
    def wall_s(self) -> float:
        return self.ended_at - self.started_at

    def to_json(self) -> str:
        return record_json(self, wall_s=self.wall_s)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PhaseRecord:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


_TRIAL_SUFFIX = re.compile(r"(#\d+)?(\.retry\d+)?$")


def trial_phase_name(base: str, repetition: int = 1, attempt: int = 1) -> str:
    """The recorded name of a phase in a repetition and attempt: the base name, then #REPETITION, then .retryN."""
    name = base if repetition == 1 else f"{base}#{repetition}"
    return name if attempt == 1 else f"{name}.retry{attempt - 1}"


def base_phase(name: str) -> str:
    """The phase across repetitions and attempts: "burst-1#2.retry1" -> "burst-1"."""
    return _TRIAL_SUFFIX.sub("", name, count=1) or name


def new_run_id(now: float | None = None) -> str:
    """Sortable and unique enough for one machine: 20261130-051500-<pid>."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    return f"{stamp}-{os.getpid()}"


RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_run_id(run_id: str) -> str:
    """A run id names one folder inside the results folder: no path separators, no `..`, nothing absolute."""
    if not RUN_ID.fullmatch(run_id):
        raise ValueError(
            f"run id {run_id!r}: expected a folder name (letters, digits, '.', '_', '-'; up to 128, "
            f"starting with a letter or digit), not a path"
        )
    return run_id


# ---------------------------------------------------------------- reading: the contract, checked once

# Bounds that no real record comes near; past them a number is a corrupt or hostile record, not a
# measurement (two durations of 1e308 overflow every sum the report takes).
MAX_DURATION_S = 1e7  # about 116 days
MAX_EPOCH_S = 1e11  # the year 5138
MAX_COUNT = 10**9  # tokens, chunks, positions
MAX_ENGINE_NUMBER = 2**63  # engine-native values are int64 at most (Ollama's *_ns)


@dataclass(frozen=True)
class Field:
    """One record field: its JSON type, bounds, and what a missing (or null) value means."""

    name: str
    kind: str  # str | int | float | bool | floats (a list of numbers) | object
    required: bool = False  # missing or null -> the record is skipped
    default: Any = None  # missing or null -> this (None: the field stays null; a list or dict is copied)
    lo: float = 0
    hi: float = MAX_COUNT


def _duration(name: str) -> Field:
    return Field(name, "float", hi=MAX_DURATION_S)


REQUEST_FIELDS = (
    Field("engine", "str", required=True),
    Field("instance", "str"),  # missing -> the engine's name
    Field("scenario", "str", default="unknown"),
    Field("phase", "str", default="unknown"),
    Field("api", "str", default=""),
    Field("model", "str", default=""),
    Field("prompt_set", "str", default=""),
    Field("prompt_set_sha256", "str", default=""),
    Field("prompt_id", "str", default=""),
    Field("max_tokens", "int", default=0),
    Field("started_at", "float", required=True, hi=MAX_EPOCH_S),
    Field("ok", "bool", required=True),
    Field("status", "int", default=0, hi=999),
    Field("error", "str"),
    Field("error_kind", "str"),
    _duration("ttft_s"),
    _duration("e2e_s"),
    Field("itl_s", "floats", default=[], hi=MAX_DURATION_S),
    _duration("tpot_s"),
    Field("output_tokens", "int"),
    Field("prompt_tokens", "int"),
    Field("tokens_source", "str"),
    Field("content_chunks", "int", default=0),
    Field("arrival_index", "int"),
    Field("scheduled_at", "float", hi=MAX_EPOCH_S),
    Field("engine_stats", "object", default={}),
    Field("conversation", "str"),
    Field("turn", "int"),
    Field("history_messages", "int"),
    Field("history_tokens", "int"),
    Field("cached_tokens", "int"),
    Field("worker", "int"),
)
PHASE_FIELDS = (
    Field("engine", "str", required=True),
    Field("instance", "str"),
    Field("scenario", "str", default="unknown"),
    Field("phase", "str", required=True),
    Field("started_at", "float", required=True, hi=MAX_EPOCH_S),
    Field("ended_at", "float", required=True, hi=MAX_EPOCH_S),
    Field("requests", "int", default=0),
    Field("concurrency", "int", default=1),
    Field("prompt_set", "str", default=""),
    Field("prompt_set_sha256", "str", default=""),
    Field("max_tokens", "int", default=0),
    Field("repetition", "int", default=1, lo=1),
    Field("attempt", "int", default=1, lo=1),
    Field("noise", "object"),
    Field("energy", "object"),
)


def check_fields(data: Any, spec: tuple[Field, ...]) -> dict[str, Any]:
    """`data` as a record of `spec` would be read from a run folder (servescope/contracts/runreader.py checks the same table in
    SQL): the fields it knows, with their defaults; ValueError naming the first field that breaks the contract. For
    records that arrive some other way than a file (a load generator worker's, over the master's port)."""
    import math

    if not isinstance(data, dict):
        raise ValueError(NOT_OBJECT)
    out: dict[str, Any] = {}
    for f in spec:
        value = data.get(f.name)
        if value is None:
            if f.required:
                raise ValueError(f"missing {f.name}")
            out[f.name] = (
                list(f.default)
                if isinstance(f.default, list)
                else dict(f.default)
                if isinstance(f.default, dict)
                else f.default
            )
            continue
        numbers = None
        if f.kind == "str":
            ok = isinstance(value, str)
        elif f.kind == "bool":
            ok = isinstance(value, bool)
        elif f.kind == "int":
            ok, numbers = isinstance(value, int) and not isinstance(value, bool), [value]
        elif f.kind == "float":
            ok, numbers = isinstance(value, (int, float)) and not isinstance(value, bool), [value]
        elif f.kind == "floats":
            ok = isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
            numbers = value
        else:  # object: free-form engine numbers, each within what an engine can mean
            ok = isinstance(value, dict) and _engine_numbers_ok(value)
        if not ok:
            raise ValueError(f"{f.name}: expected {f.kind}")
        if numbers is not None and not all(math.isfinite(v) and f.lo <= v <= f.hi for v in numbers):
            raise ValueError(f"{f.name}: out of range ({f.lo:g} to {f.hi:g})")
        out[f.name] = float(value) if f.kind == "float" else value
    if "ended_at" in out and "started_at" in out and out["ended_at"] < out["started_at"]:
        raise ValueError(ENDS_BEFORE_START)
    if "instance" in out and out["instance"] is None:
        out["instance"] = out.get("engine")  # a record without one is its engine's only instance
    return out


def _engine_numbers_ok(value: dict, depth: int = 16) -> bool:
    """Every number inside is finite and within MAX_ENGINE_NUMBER, nested at most `depth` deep (walked iteratively)."""
    import math

    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            if level > depth:
                return False
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            if not (math.isfinite(item) and abs(item) <= MAX_ENGINE_NUMBER):
                return False
        elif not (item is None or isinstance(item, (str, bool))):
            return False
    return True


# Reasons a whole line is unusable, before any field is looked at.
NOT_JSON = "not a JSON record"
NOT_OBJECT = "not a JSON object"
TORN = "torn last record (run killed mid-write?)"
ENDS_BEFORE_START = "ended_at: before started_at"


class Skips:
    """Lines the reader left out, counted by file and reason, with the first few line numbers to find them."""

    SHOW_LINES = 3

    def __init__(self) -> None:
        self.by_reason: dict[tuple[str, str], list[int]] = {}  # (file name, reason) -> line numbers (first few)
        self.counts: dict[tuple[str, str], int] = {}

    def add(self, file: str, reason: str, count: int, lines: list[int]) -> None:
        key = (file, reason)
        self.counts[key] = self.counts.get(key, 0) + count
        shown = self.by_reason.setdefault(key, [])
        shown[:] = sorted(shown + lines)[: self.SHOW_LINES]

    def merge(self, other: Skips) -> None:
        for key, count in other.counts.items():
            self.add(*key, count, other.by_reason[key])

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def lines(self) -> list[str]:
        """One line per file and reason: how many records it cost and where the first ones are."""
        out = []
        for (file, reason), count in self.counts.items():
            where = self.by_reason[(file, reason)]
            more = count - len(where)
            at = ", ".join(map(str, where)) + (f" and {more} more" if more else "")
            s = "s" if count != 1 else ""
            out.append(f"{file}: {count} record{s} skipped, {reason} (line{s} {at})")
        return out


# --- server-side samples: results/<run-id>/samples.jsonl ------------------------------------------
# A scrape interval is longer than a burst's queue lasts, so the run reads its engines itself.
# While a load phase runs, servescope/prometheus/sampler.py reads every engine's lever gauges and the counters
# the report uses from the exporter's page (the same collectors Prometheus scrapes) every
# SAMPLE_INTERVAL_MS, and appends one SampleRecord per engine instance and read. A read that got no
# values is written with `missing` saying why, never filled in; a read that came late leaves a gap
# longer than the interval, which readers treat as missing too.
SAMPLES = "samples.jsonl"
# `python -m loadgen knee` writes its search (levels, verdicts, the knee, the binding resource) beside the records.
KNEE = "knee.json"
# knee.json's "over": what the search varied (loadgen/knee.py writes it; the report's plan reads it)
KNEE_CONCURRENCY, KNEE_RATE = "concurrency", "rate"


@dataclass
class SampleRecord:
    """One read of an engine's gauges and counters while a phase ran: a line of samples.jsonl."""

    t: float  # epoch seconds (the clock of RequestRecord.started_at): the middle of the read
    read_s: float  # how long the read took; the engine was read somewhere inside [t - read_s/2, t + read_s/2]
    interval_s: float  # the sampling interval asked for
    engine: str  # the exporter's `engine` label
    instance: str  # the exporter's `instance` label
    phase: str | None = None  # the load phase that was running
    values: dict[str, float] = field(default_factory=dict)  # servescope series name -> value (summed over models;
    #                                                         a usage ratio: the fullest pool)
    missing: str | None = None  # why this read has no values (exporter unreachable, engine not answering)

    def to_json(self) -> str:
        return record_json(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SampleRecord:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


SAMPLE_FIELDS = (
    Field("t", "float", required=True, hi=MAX_EPOCH_S),
    Field("read_s", "float", required=True, hi=MAX_DURATION_S),
    Field("interval_s", "float", required=True, hi=MAX_DURATION_S),
    Field("engine", "str", required=True),
    Field("instance", "str", required=True),
    Field("phase", "str"),
    Field("values", "object", default={}),
    Field("missing", "str"),
)
