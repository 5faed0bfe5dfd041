"""bench/report_scale.py's generated records: as large per gap as a real run's, read as the contract reads them, and
a report on them the same with and without the run's index."""

from __future__ import annotations

import json

import pytest

from bench import report_scale
from loadgen import client as llm
from servescope.contracts import runfolder, runreader
from servescope.contracts.runfolder import RequestRecord, RunFolder
from servescope.report import render, sections
from servescope.report.load import load
from tests.doubles.synthetic_openai import SyntheticServer


def real_record_line(tmp_path) -> str:
    """One request measured by the load generator's client against the synthetic engine, written by its writer."""
    with SyntheticServer(ttft=0.01, itl=0.004, tokens=64) as server:
        transport = llm.make_transport("geventhttpclient", server.url, timeout=10.0)
        try:
            payload = llm.chat_payload("openai", "synthetic/model", "Say OK.", 64, 0.0, True)
            m = llm.stream_chat(transport, "/v1/chat/completions", "openai", payload)
        finally:
            transport.close()
    assert m.ok, m.error
    folder = RunFolder.create(tmp_path, "real")
    folder.append_request(
        RequestRecord(
            "vllm", "vllm", "rate", "rate-1", "openai", "synthetic/model", "s", "h", "p0", 64, m.started_at, m.ok,
            m.status, ttft_s=m.ttft_s, e2e_s=m.e2e_s, itl_s=m.itl_s, tpot_s=m.tpot_s, output_tokens=m.output_tokens,
            content_chunks=len(m.content_times),
        )
    )  # fmt: skip
    return (folder.path / runfolder.REQUESTS).read_text()


def test_the_bench_writes_as_many_bytes_per_gap_as_a_real_run(tmp_path):
    real = report_scale.bytes_per_gap(real_record_line(tmp_path).splitlines())
    bench = report_scale.bytes_per_gap(report_scale.records(0, 200, 64).splitlines())
    assert real > 15  # full floats, not rounded ones
    assert bench == pytest.approx(real, rel=0.10)


def test_the_bench_records_meet_the_contract_and_carry_every_field(tmp_path):
    lines = report_scale.records(0, 300, 32).splitlines()
    assert all(set(json.loads(line)) == {f.name for f in runfolder.REQUEST_FIELDS} for line in lines)
    folder = RunFolder.create(tmp_path, "gen")
    (folder.path / runfolder.REQUESTS).write_text("\n".join(lines) + "\n")
    data = runreader.RunData(folder.path, files=(runfolder.REQUESTS,))
    try:
        assert data.skips.lines() == []
        assert data.con.execute("SELECT count(*) FROM requests").fetchone()[0] == 300
    finally:
        data.close()


def numbers(path) -> dict:
    run = load(path)
    try:
        _, out = sections.build(run, "http://127.0.0.1:9", None, figures=False)
        out = json.loads(render.json_text(out))
    finally:
        run.close()
    out.pop("plots", None)
    return out


def test_a_report_is_the_same_with_and_without_the_index(tmp_path, monkeypatch):
    path = tmp_path / "gen"
    report_scale.generate(path, 400, 32)
    monkeypatch.setenv("RUN_INDEX_MIN_MB", "off")
    without = numbers(path)
    assert not (path / runfolder.INDEX).exists()
    monkeypatch.setenv("RUN_INDEX_MIN_MB", "0")
    making = numbers(path)  # the first report: makes the index
    assert (path / runfolder.INDEX).exists()
    opening = numbers(path)
    assert without == making == opening
    assert without["latency"]["groups"]  # a report with numbers in it, not two empty ones


def test_a_clean_file_reads_the_same_by_the_fast_path_as_line_by_line(tmp_path, monkeypatch):
    path = tmp_path / "gen"
    report_scale.generate(path, 300, 32)
    monkeypatch.setenv("RUN_INDEX_MIN_MB", "off")
    tables = {}
    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(runreader, "_ingest_clean", lambda *a: False)
        data = runreader.RunData(path, files=(runfolder.REQUESTS,))
        try:
            tables[fast] = data.con.execute("SELECT rowid, * FROM requests_lines ORDER BY rowid").fetchall()
        finally:
            data.close()
    assert len(tables[True]) == 300 and tables[True] == tables[False]


def test_a_large_folder_is_kept_in_the_cache_when_asked_or_already_there(tmp_path, monkeypatch):
    monkeypatch.setattr(report_scale, "CACHE", tmp_path)
    large = report_scale.KEEP_MAX + 1
    assert report_scale.kept(report_scale.KEEP_MAX, 256)  # small ones always
    assert not report_scale.kept(large, 256)  # generated in a temporary directory, deleted once measured
    assert report_scale.kept(large, 256, keep=True)
    made = tmp_path / report_scale.folder_name(large, 256)
    made.mkdir()
    assert not report_scale.kept(large, 256)  # a folder left half made is not one to measure
    (made / runfolder.MANIFEST).write_text("{}")
    assert report_scale.kept(large, 256) and not report_scale.kept(large, 64)
