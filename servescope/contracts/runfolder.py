"""One run's folder on disk: created, appended to as records finish, read back through servescope/contracts/runreader.py.

What the folder holds (file names, record fields, units) is the contract, servescope/contracts/runcontract.py; its names are
importable from here as well, where every writer and reader of a run folder has always found them.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servescope.contracts.folder_writes import open_append, write_file
from servescope.contracts.runcontract import (
    ENDS_BEFORE_START,
    FOLDER_MODE,
    INDEX,
    KNEE,
    KNEE_CONCURRENCY,
    KNEE_RATE,
    MANIFEST,
    MAX_COUNT,
    MAX_DURATION_S,
    MAX_ENGINE_NUMBER,
    MAX_EPOCH_S,
    NOT_JSON,
    NOT_OBJECT,
    PHASE_FIELDS,
    PHASES,
    REQUEST_FIELDS,
    REQUESTS,
    RUN_ID,
    SAMPLE_FIELDS,
    SAMPLES,
    SCHEMA_VERSION,
    TORN,
    Field,
    PhaseRecord,
    RequestRecord,
    SampleRecord,
    Skips,
    base_phase,
    check_fields,
    check_run_id,
    new_run_id,
    trial_phase_name,
)

__all__ = [
    "ENDS_BEFORE_START",
    "FOLDER_MODE",
    "INDEX",
    "KNEE",
    "KNEE_CONCURRENCY",
    "KNEE_RATE",
    "MANIFEST",
    "MAX_COUNT",
    "MAX_DURATION_S",
    "MAX_ENGINE_NUMBER",
    "MAX_EPOCH_S",
    "NOT_JSON",
    "NOT_OBJECT",
    "PHASE_FIELDS",
    "PHASES",
    "REQUEST_FIELDS",
    "REQUESTS",
    "RUN_ID",
    "SAMPLE_FIELDS",
    "SAMPLES",
    "SCHEMA_VERSION",
    "TORN",
    "Field",
    "PhaseRecord",
    "RequestRecord",
    "SampleRecord",
    "Skips",
    "base_phase",
    "check_fields",
    "check_run_id",
    "new_run_id",
    "trial_phase_name",
    "RunFolder",
    "append_samples",
    "latest",
    "open_append",
    "read_samples",
    "write_file",
]


class RunFolder:
    """One run's folder: appends records as they finish so an interrupted run loses nothing."""

    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def create(cls, results_dir: Path, run_id: str | None = None) -> RunFolder:
        """The run's folder, its owner's alone (0700, whatever the umask): its manifest names the engines and the
        prompts, its records what was asked and answered. What is written inside is out of others' reach with it."""
        path = Path(results_dir) / check_run_id(run_id or new_run_id())
        Path(results_dir).mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=FOLDER_MODE, exist_ok=False)
        os.chmod(path, FOLDER_MODE)  # mkdir's mode passes through the umask, which may take the owner's bits too
        return cls(path)

    def append_request(self, record: RequestRecord) -> None:
        self._append(REQUESTS, record.to_json())

    def append_phase(self, record: PhaseRecord) -> None:
        self._append(PHASES, record.to_json())

    def _append(self, name: str, line: str) -> None:
        # One write per line, flushed: a crash or SIGKILL keeps every finished record.
        with open_append(self.path / name) as fh:
            fh.write(line + "\n")

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        manifest = {"schema_version": SCHEMA_VERSION, **manifest}
        write_file(self.path / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")

    def manifest(self) -> dict[str, Any]:
        from servescope.contracts.runreader import regular

        path = self.path / MANIFEST
        if path.exists() and not regular(path):
            raise ValueError(f"{path}: not a regular file")  # a FIFO would hold the reader forever
        return json.loads(path.read_text())

    def requests(self, skips: Skips | None = None) -> Iterator[RequestRecord]:
        """Every record that meets the contract, in file order; the others are counted in skips (warned if None)."""
        yield from self._read(REQUESTS, RequestRecord, skips)

    def phases(self, skips: Skips | None = None) -> Iterator[PhaseRecord]:
        yield from self._read(PHASES, PhaseRecord, skips)

    def _read(self, name: str, cls, skips: Skips | None) -> Iterator:
        from servescope.contracts.runreader import VIEWS, RunData  # the engine loads only when something reads

        data = RunData(self.path, files=(name,))
        try:
            yield from data.records(VIEWS[name], cls)
        finally:
            data.close()
        if skips is not None:
            skips.merge(data.skips)
        else:
            for line in data.skips.lines():
                warnings.warn(f"{self.path}/{line}", stacklevel=3)


# ---------------------------------------------------------------- reading: the contract, checked once


def latest(results_dir: Path) -> RunFolder:
    runs = (
        sorted(p for p in Path(results_dir).iterdir() if (p / MANIFEST).exists()) if Path(results_dir).is_dir() else []
    )
    if not runs:
        raise FileNotFoundError(
            f"no run folder with a {MANIFEST} under {results_dir}: run `make up` or a loadgen scenario first"
        )
    return RunFolder(runs[-1])


def append_samples(folder: RunFolder, records: list[SampleRecord]) -> None:
    """One read's records in one write: a crash keeps every finished read."""
    if records:
        folder._append(SAMPLES, "\n".join(r.to_json() for r in records))


def read_samples(folder: RunFolder, skips: Skips | None = None) -> Iterator[SampleRecord]:
    """The samples through the same reader as the other records; a line that is not a sample is skipped and counted
    (warned about at the end, as for requests and phases, unless the caller collects the skips)."""
    yield from folder._read(SAMPLES, SampleRecord, skips)
