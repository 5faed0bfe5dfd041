"""bench/observer_effect.py: the harness itself, on the synthetic server (real engines are measured by `make bench`)."""

from __future__ import annotations

import re

import pytest

from bench import observer_effect


@pytest.mark.slow
def test_sampling_on_and_off_interleave_and_the_figure_is_printed(capsys):
    assert observer_effect.main(["--synthetic", "--pairs", "1", "--duration", "2"]) == 0
    out = capsys.readouterr().out
    trials = re.findall(r"sampling (on |off)\s+([\d.]+) tok/s\s+samples\s+(\d+)", out)
    assert [t[0].strip() for t in trials] == ["on", "off"]
    on, off = trials
    assert int(on[2]) >= 10 and int(off[2]) == 0  # 100 ms reads while on, none while off
    assert float(on[1]) > 0 and float(off[1]) > 0
    assert re.search(r"^vllm\s+[\d.]+\s+[\d.]+\s+[+-][\d.]+%", out, re.M)


def test_no_engine_and_nothing_cached_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SERVESCOPE_CACHE", str(tmp_path))
    monkeypatch.setenv("VLLM_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("LLAMACPP_URL", "http://127.0.0.1:2")
    assert observer_effect.main([]) == 0
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("observer effect skipped: no vLLM-CPU or llama.cpp answers")
