"""The run folder contract between the load generator and the report: file names, record fields, units.

results/<run-id>/
  manifest.json     RunManifest: engines (url, version, model, flags), prompt set + sha256, machine, times
  requests.jsonl    one RequestRecord per measured request (warm-up excluded), appended as they finish
  phases.jsonl      one PhaseRecord per load phase (sequential pass, burst k, ramp step, sweep level)
  locust_*.csv, locust.html   Locust's own stats (rounded by Locust: never the source of a reported number)
  report.md / report.html / report.json / *.png   written by `make report`

All durations are seconds (float); wall-clock instants are Unix epoch seconds; engine-native
durations keep the engine's own unit and say so in their key (Ollama: *_ns).
"""

from __future__ import annotations

import json
import os
import re
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
REQUESTS = "requests.jsonl"
PHASES = "phases.jsonl"
SCHEMA_VERSION = 1


@dataclass
class RequestRecord:
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
    engine_stats: dict[str, Any] = field(default_factory=dict)  # Ollama *_ns fields, llama.cpp timings

    def to_json(self) -> str:
        # Not asdict(): it deep-copies itl_s one float at a time (12 ms for a 4000-token record).
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)}, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class PhaseRecord:
    engine: str
    instance: str
    scenario: str
    phase: str  # e.g. "sequential", "burst-1", "ramp-4users", "sweep-c8"
    started_at: float  # epoch seconds: first request sent
    ended_at: float  # epoch seconds: last request finished
    requests: int
    concurrency: int  # users / burst size / sweep level; 1 for sequential
    prompt_set: str
    prompt_set_sha256: str
    max_tokens: int

    @property
    def wall_s(self) -> float:
        return self.ended_at - self.started_at

    def to_json(self) -> str:
        data = asdict(self)
        data["wall_s"] = self.wall_s
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PhaseRecord:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


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


class RunFolder:
    """One run's folder: appends records as they finish so an interrupted run loses nothing."""

    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def create(cls, results_dir: Path, run_id: str | None = None) -> RunFolder:
        path = Path(results_dir) / check_run_id(run_id or new_run_id())
        path.mkdir(parents=True, exist_ok=False)
        return cls(path)

    def append_request(self, record: RequestRecord) -> None:
        self._append(REQUESTS, record.to_json())

    def append_phase(self, record: PhaseRecord) -> None:
        self._append(PHASES, record.to_json())

    def _append(self, name: str, line: str) -> None:
        # One write per line, flushed: a crash or SIGKILL keeps every finished record.
        with open(self.path / name, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        manifest = {"schema_version": SCHEMA_VERSION, **manifest}
        tmp = self.path / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.path / MANIFEST)

    def manifest(self) -> dict[str, Any]:
        return json.loads((self.path / MANIFEST).read_text())

    def requests(self) -> Iterator[RequestRecord]:
        yield from (RequestRecord.from_dict(d) for d in _read_jsonl(self.path / REQUESTS))

    def phases(self) -> Iterator[PhaseRecord]:
        yield from (PhaseRecord.from_dict(d) for d in _read_jsonl(self.path / PHASES))


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    for lineno, line in enumerate(lines, start=1):
        line = line.strip()
        if not line:
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            if lineno == len(lines):
                # A run killed mid-write leaves at most one torn last line: skip it, keep the rest.
                warnings.warn(f"{path}:{lineno}: torn last record skipped", stacklevel=2)
                return
            raise ValueError(f"{path}:{lineno}: not a JSON record") from None


def latest(results_dir: Path) -> RunFolder:
    runs = (
        sorted(p for p in Path(results_dir).iterdir() if (p / MANIFEST).exists()) if Path(results_dir).is_dir() else []
    )
    if not runs:
        raise FileNotFoundError(
            f"no run folder with a {MANIFEST} under {results_dir}: run `make up` or a loadgen scenario first"
        )
    return RunFolder(runs[-1])


# --- server-side samples (issue 14): results/<run-id>/samples.jsonl -----------------------------
# While a load phase runs, servescope/sampler.py reads every engine's lever gauges and the counters
# the report uses from the exporter's page (the same collectors Prometheus scrapes) every
# SAMPLE_INTERVAL_MS, and appends one SampleRecord per engine instance and read. A read that got no
# values is written with `missing` saying why, never filled in; a read that came late leaves a gap
# longer than the interval, which readers treat as missing too.
SAMPLES = "samples.jsonl"


@dataclass
class SampleRecord:
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
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SampleRecord:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def append_samples(folder: RunFolder, records: list[SampleRecord]) -> None:
    """One read's records in one write: a crash keeps every finished read."""
    if records:
        folder._append(SAMPLES, "\n".join(r.to_json() for r in records))


def read_samples(folder: RunFolder) -> Iterator[SampleRecord]:
    yield from (SampleRecord.from_dict(d) for d in _read_jsonl(folder.path / SAMPLES))
