"""The report's energy per phase: joules per good token and per request beside goodput, "not measured (why)" without them."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from servescope.contracts.runfolder import PhaseRecord, RunFolder
from servescope.report import cli, energy, goodput
from servescope.report.load import Run, load
from servescope.report.render import Document, markdown
from tests.conftest import free_port
from tests.paths import RUNS
from tests.servescope.judgements.test_slo import rec

MEASURED = {
    "joules": 16.0,
    "window_s": 4.0,
    "sources": [{"source": "intel-rapl", "joules": 16.0, "zones": [{"zone": "intel-rapl:0", "name": "package-0"}]}],
}


def run_of(phase_energy: dict | None, engines: tuple[str, ...] = ("vllm",)) -> Run:
    """One phase per engine of four requests, two good (ttft<=0.5) with 4 output tokens each, under this energy."""
    folder = RunFolder.create(Path(tempfile.mkdtemp()), "r")
    for instance in engines:
        record = PhaseRecord(instance, instance, "knee", "p", 100.0, 104.0, 4, 2, "s", "x", 4, energy=phase_energy)
        folder.append_phase(record)
        for ttft in (0.1, 0.2, 0.9, 0.9):
            r = rec(ttft=ttft)
            r.engine = r.instance = instance
            folder.append_request(r)
    folder.write_manifest(
        {"run_id": "r", "flags": {"slo": "ttft<=0.5"}, "engines": {e: {"kind": "vllm"} for e in engines}}
    )
    run = load(folder.path)
    shutil.rmtree(folder.path.parent)  # the engine holds what it read
    return run


def goodput_markdown(run: Run) -> str:
    spec = goodput.spec_of(run)
    sec = goodput.section(run, spec, goodput.build(run, spec), [], "Goodput under the SLOs")
    return markdown(Document("t", "s", [sec]))


def test_joules_per_good_token_is_the_phases_energy_over_its_good_output_tokens():
    run = run_of(MEASURED)
    (row,) = goodput.build(run, goodput.spec_of(run))
    assert row.result.good_tokens == 8 and row.result.requests == 4
    assert row.joules_per_good_token == pytest.approx(2.0)
    assert row.joules_per_request == pytest.approx(4.0)
    md = goodput_markdown(run)
    assert "| J/good token | J/request |" in md
    assert "| 2 | 4 |" in md
    assert "1 phase measured by intel-rapl" in md


def test_a_run_folder_without_energy_says_not_measured_and_never_a_number():
    run = run_of(None)
    (row,) = goodput.build(run, goodput.spec_of(run))
    assert row.joules_per_good_token is None
    md = goodput_markdown(run)
    assert "| not measured | not measured |" in md
    assert "Energy not measured (this run folder was written before servescope recorded energy)." in md


def test_the_recorded_reason_is_what_the_report_says():
    run = run_of({"joules": None, "reason": "not measured: permission denied reading /sys/x/energy_uj"})
    assert "Energy not measured (permission denied reading /sys/x/energy_uj)." in goodput_markdown(run)


def test_a_source_present_but_unread_is_said_beside_the_joules_of_the_others():
    gpu = {"source": "nvidia-smi", "joules": None, "reason": "not measured: nvidia-smi failed (timeout)"}
    run = run_of({**MEASURED, "sources": [*MEASURED["sources"], gpu]})
    (row,) = goodput.build(run, goodput.spec_of(run))
    assert row.energy.missing == ("not measured: nvidia-smi failed (timeout)",)
    assert "left out of those joules (present, not read): nvidia-smi failed (timeout)" in goodput_markdown(run)


def test_a_measured_phase_with_no_good_token_has_no_cost_per_token():
    run = run_of(MEASURED)
    spec = goodput.spec_of(run, "ttft<=0.01")  # nothing meets it
    (row,) = goodput.build(run, spec)
    assert row.result.good_tokens == 0 and row.joules_per_good_token is None
    assert row.joules_per_request == pytest.approx(4.0)


@pytest.mark.parametrize("joules", [-1.0, True, "16", float("nan")])
def test_a_joule_figure_that_is_no_measurement_reads_as_not_measured(joules):
    record = PhaseRecord("vllm", "vllm", "knee", "p", 0.0, 1.0, 1, 1, "s", "x", 4, energy={"joules": joules})
    found = energy.of_record(record)
    assert found.joules is None and found.text() == "not measured"


def test_of_phase_gives_the_plan_a_phases_joules_or_its_reason():
    run = run_of(MEASURED, engines=("vllm", "llamacpp"))
    assert energy.of_phase(run, "p", "vllm") == energy.Energy(16.0, sources=("intel-rapl",))
    assert energy.of_phase(run, run.phases[0]).joules == 16.0
    assert energy.of_phase(run, "sweep-c9", "vllm") is None
    with pytest.raises(ValueError, match="ran on 2 engines"):
        energy.of_phase(run, "p")
    old = energy.of_phase(run_of(None), "p")
    assert old.joules is None and old.reason == energy.NOT_RECORDED


def test_the_full_report_shows_joules_per_token_where_measured_and_not_measured_elsewhere(tmp_path, capsys):
    run = tmp_path / "live"
    shutil.copytree(RUNS / "live-failures", run)
    lines = [json.loads(line) for line in (run / "phases.jsonl").read_text().splitlines()]
    for p in lines:
        if p["instance"] == "vllm":
            p["energy"] = {**MEASURED, "joules": 120.0}
    (run / "phases.jsonl").write_text("".join(json.dumps(p) + "\n" for p in lines))
    assert cli.main(["--run", str(run), "--prometheus", f"http://127.0.0.1:{free_port()}"]) == 0
    capsys.readouterr()
    md = (run / "report.md").read_text()
    assert "J/good token" in md and "not measured (this run folder was written before servescope recorded energy" in md
    numbers = json.loads((run / "report.json").read_text())
    rows = {(r["instance"], r["phase"]): r for r in numbers["goodput"]["phases"]}
    seq = rows[("vllm", "sequential")]
    assert seq["energy_j"] == 120.0
    assert seq["joules_per_request"] == pytest.approx(120.0 / seq["requests"])
    assert seq["good_tokens"] > 0
    assert seq["joules_per_good_token"] == pytest.approx(120.0 / seq["good_tokens"])
    other = next(r for (i, _), r in rows.items() if i != "vllm")
    assert other["energy_j"] is None and other["joules_per_good_token"] is None
    assert other["energy_reason"] == energy.NOT_RECORDED
