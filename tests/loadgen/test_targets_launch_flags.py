"""The run records the serving flags the native stack started an engine with, so the report quotes what ran."""

from __future__ import annotations

import json
import os

import psutil

from loadgen.targets import launch_flags
from servescope.host import pidrecords
from servescope.report.load import _flags_from_argv


def write_record(directory, name: str, url: str, cmdline: list[str]) -> None:
    """A native stack pid record of this test's own process (alive, same start time)."""
    record = {"name": name, "pid": os.getpid(), "create_time": psutil.Process().create_time(), "url": url}
    (directory / f"{name}.json").write_text(json.dumps({**record, "cmdline": cmdline}))


def test_the_engines_launch_flags_come_from_its_native_record_with_credentials_masked(tmp_path):
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--max-num-seqs", "2", "--api-key", "s3cret"]
    write_record(tmp_path, "vllm", "http://127.0.0.1:8009", [*argv, "--hf-token=t0ken", "--port", "8009"])
    records = pidrecords.live(tmp_path)

    flags = launch_flags("http://localhost:8009", records)
    assert "s3cret" not in json.dumps(flags) and "t0ken" not in json.dumps(flags)
    parsed = _flags_from_argv(flags)
    assert parsed["--max-num-seqs"] == "2" and parsed["--api-key"] == "***" and parsed["--hf-token"] == "***"
    # Another port is another engine: nothing recorded for it.
    assert launch_flags("http://127.0.0.1:8081", records) == []
