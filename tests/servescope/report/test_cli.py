"""`python -m servescope.report` end to end on crafted runs: the files it writes, no Prometheus, bad input, comparison mode."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from servescope.report import cli, sections
from servescope.report.load import load
from servescope.workloads import prompts
from tests.conftest import free_port
from tests.harness import run_cli
from tests.paths import REPO, RUNS


def test_full_report_without_prometheus(tmp_path, capsys):
    run = tmp_path / "live"
    shutil.copytree(RUNS / "live-failures", run)
    url = f"http://127.0.0.1:{free_port()}"
    assert cli.main(["--run", str(run), "--prometheus", url]) == 0
    err = capsys.readouterr().err
    assert f"no gauge data: Prometheus at {url} is unreachable" in err
    assert (
        "report: warning: requests.jsonl: 1 record skipped, torn last record (run killed mid-write?) (line 47)" in err
    )

    md = (run / "report.md").read_text()
    # The answers first, the setup last; numbers come from the order. Without gauge data the gauges' section has
    # nothing to say: it is named, with why, in the closing section and the others move up.
    for title in (
        "1. Summary",
        "2. The sequential-vs-burst table",
        "3. Verdict",
        "4. Goodput under the SLOs",
        "5. Latency",
        "6. Sweeps and bursts",
        "7. Comparison",
        "8. Workloads",
        "9. Engine-side cross-check",
        "10. Setup",
        "11. Not in this run",
    ):
        assert f"## {title}" in md
    assert f"- Gauges over the run: no gauge data: Prometheus at {url} is unreachable" in md
    assert "no verdict can be made: the gauges had no data" in md
    assert "1 x HTTP 503: server busy: no free slot; 1 x stream ended without [DONE]" in md
    assert "refused: max_tokens differ (sequential 64, burst 48)" in md
    assert "ignore_eos is not applied alike (vllm=unknown, llamacpp=on)" in md
    assert "burst of 5 > LLAMACPP_PARALLEL=1" in md
    assert "knee at concurrency 4" in md

    html = (run / "report.html").read_text()
    assert not re.search(r"""(src|href)=["']?(https?:|//|[^"'#d][^"']*\.png)""", html)  # nothing external
    pngs = sorted(p.name for p in run.glob("*.png"))
    assert html.count("data:image/png;base64,") == len(pngs) >= 5
    assert {"sequential_burst_table.png", "latency.png", "sweeps.png", "ttft_by_arrival.png"} <= set(pngs)

    numbers = json.loads((run / "report.json").read_text())  # strict JSON: no NaN
    assert numbers["plots"] == pngs
    rows = {(r["instance"], r["phase"]): r for r in numbers["table"]["rows"]}
    assert rows[("llamacpp", "burst-1")]["n_failed"] == 2
    groups = {(g["instance"], g["scenario"]): g for g in numbers["latency"]["groups"]}
    assert groups[("llamacpp", "burst")]["metrics"]["ttft_s"]["p50"] == pytest.approx(0.30)
    assert numbers["gauges"]["available"] is False


def test_bad_run_is_one_line_and_exit_2(tmp_path):
    proc = run_cli("report", "--run", "nope", "--results", str(tmp_path), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"report: no run folder 'nope' (looked for the path and under {tmp_path})"
    ]
    proc = run_cli("report", "--results", str(tmp_path / "none"), "--table-only", timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "run `make up`" in proc.stderr


def test_unreadable_manifest_is_one_line(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "manifest.json").write_text("{not json")
    assert cli.main(["--run", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "manifest.json: unreadable" in err[0] and "no requests.jsonl" in err[0]


def test_unreadable_manifest_still_reports_the_records(tmp_path, capsys):
    """Regression: a corrupt manifest used to stop the report (exit 2) though every record was readable."""
    shutil.copytree(RUNS / "seed-vllm-ollama", tmp_path / "r")
    (tmp_path / "r" / "manifest.json").write_text('{"engines": {"vllm": {"kind"')
    assert cli.main(["--run", str(tmp_path / "r"), "--prometheus", f"http://127.0.0.1:{free_port()}"]) == 0
    assert "manifest.json: unreadable" in capsys.readouterr().err
    numbers = json.loads((tmp_path / "r" / "report.json").read_text())
    assert numbers["run"]["requests"] == 20


def slower_copy(src: Path, dst: Path, seconds: float) -> None:
    """The same run with every vLLM request `seconds` slower end to end."""
    shutil.copytree(src, dst)
    lines = []
    for line in (dst / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["engine"] == "vllm":
            r["e2e_s"] += seconds
        lines.append(json.dumps(r))
    (dst / "requests.jsonl").write_text("\n".join(lines) + "\n")
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["run_id"] = "slower"
    (dst / "manifest.json").write_text(json.dumps(manifest))


def test_comparison_mode_pairs_by_prompt(tmp_path):
    slower_copy(RUNS / "seed-vllm-ollama", tmp_path / "slower", 1.0)
    current, baseline = load(RUNS / "seed-vllm-ollama"), load(tmp_path / "slower")
    url = f"http://127.0.0.1:{free_port()}"
    _, numbers = sections.build(current, url, baseline, figures=False)
    comp = numbers["comparison"]
    assert comp["baseline"] == "slower" and comp["matching"] == "same engine instance and scenario in both runs"
    deltas = {(d["current"], d["scenario"], d["metric"]): d for d in comp["deltas"]}
    e2e = deltas[("seed-vllm-ollama/vllm", "burst", "e2e_s")]
    assert e2e["paired"] and e2e["n_current"] == 3
    # every prompt exactly 1 s faster than in the baseline: the paired interval collapses onto -1 s
    assert e2e["delta"] == pytest.approx(-1.0) and e2e["ci_low"] == pytest.approx(-1.0)
    assert e2e["ci_high"] == pytest.approx(-1.0) and e2e["ci_excludes_zero"]
    ttft = deltas[("seed-vllm-ollama/vllm", "burst", "ttft_s")]
    assert ttft["delta"] == 0 and not ttft["ci_excludes_zero"]
    untouched = deltas[("seed-vllm-ollama/ollama", "burst", "e2e_s")]
    assert untouched["delta"] == 0 and untouched["ci_low"] == 0 and untouched["ci_high"] == 0
    assert not deltas[("seed-vllm-ollama/vllm", "sequential", "itl_s")]["paired"]  # pooled gaps never pair


def renamed_copy(src: Path, dst: Path) -> None:
    """The run as today's loadgen records it: burst3, sequential4 and the phase sequential-four where it recorded
    seed3, seed4 and sequential-seed4, the hashes unchanged (a set's hash is of its prompts alone: test_client.py)."""
    shutil.copytree(src, dst)
    names = {**prompts.RENAMED, "sequential-seed4": "sequential-four"}
    for file in ("phases.jsonl", "requests.jsonl"):
        records = [json.loads(line) for line in (dst / file).read_text().splitlines()]
        for r in records:
            r["phase"], r["prompt_set"] = names.get(r["phase"], r["phase"]), names.get(r["prompt_set"], r["prompt_set"])
        (dst / file).write_text("".join(json.dumps(r) + "\n" for r in records))
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["run_id"] = "renamed"
    for entry in manifest["prompt_sets"]:
        entry["name"] = names[entry["name"]]
    (dst / "manifest.json").write_text(json.dumps(manifest))


def test_a_run_recorded_under_the_first_names_reports_and_matches_one_under_the_new(tmp_path, capsys):
    """seed-vllm-ollama was recorded as seed3, seed4 and sequential-seed4 (kept so): it still makes the table, and a
    run of the same prompts under the new names is the same work to the report's comparison and `report check`."""
    old = tmp_path / "old"
    shutil.copytree(RUNS / "seed-vllm-ollama", old)
    renamed_copy(old, tmp_path / "renamed")
    url = f"http://127.0.0.1:{free_port()}"
    assert cli.main(["--run", str(old), "--prometheus", url]) == 0
    md = (old / "report.md").read_text()
    table = md.split("## 2. The sequential-vs-burst table", 1)[1].split("\n## ", 1)[0]
    assert "sequential (seed4, 4 prompts)" in table and "sequential (seed3, matched set)" in table
    factors = [r["scaling_factor"] for r in json.loads((old / "report.json").read_text())["table"]["rows"]]
    assert sum(f is not None for f in factors) == 2  # each engine's burst against its seed3 sequential pass

    _, numbers = sections.build(load(tmp_path / "renamed"), url, load(old), figures=False)
    deltas = {(d["current"], d["scenario"], d["metric"]): d for d in numbers["comparison"]["deltas"]}
    assert deltas[("renamed/vllm", "burst", "e2e_s")]["paired"]  # paired by prompt: one set on both sides
    assert deltas[("renamed/vllm", "sequential", "e2e_s")]["paired"]
    capsys.readouterr()
    assert cli.main(["check", "--baseline", str(old), "--run", str(tmp_path / "renamed"), "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "different prompt sets" not in err and "PASS: none of" in out


def test_within_run_comparison_of_two_engines():
    url = f"http://127.0.0.1:{free_port()}"
    _, numbers = sections.build(load(RUNS / "seed-vllm-ollama"), url, None, figures=False)
    comp = numbers["comparison"]
    assert comp["baseline"] is None and "each against vllm" in comp["matching"]
    (e2e,) = [d for d in comp["deltas"] if d["scenario"] == "burst" and d["metric"] == "e2e_s"]
    assert e2e["median_current"] == pytest.approx(1.116994) and e2e["median_baseline"] == pytest.approx(3.647941)
    assert e2e["paired"]


def test_comparison_plot_when_an_interval_misses_its_delta(tmp_path):
    """Regression: a CI that does not hold its delta made a negative error bar and the whole report failed."""
    from servescope.report import figures, plots
    from servescope.report.compare import Delta

    d = Delta("a/vllm", "b/vllm", "rate", "itl_s", False, 10**8, 10**8, 0.03, 0.02, 0.01, 0.0102, 0.0108, 50.0)
    assert plots.compare(figures.compare([d]), tmp_path / "comparison.png") == tmp_path / "comparison.png"


def test_the_readme_names_report_sections_that_exist_and_never_by_number():
    """Section numbers come from the report's order (servescope/report/render.py): the README cites sections by their titles,
    and every title it cites is one the report writes (the reference page's own sections keep their numbers)."""
    import inspect

    from servescope.report import goodput, sections, summary, workloads

    root = REPO
    readme = "\n".join(p.read_text() for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))])
    numbered = [m.group(0) for m in re.finditer(r"(?<!seed's )(?<!seed )section \d+", readme)]
    assert not numbered, numbered
    source = inspect.getsource(sections) + inspect.getsource(goodput) + inspect.getsource(workloads) + summary.TITLE
    titles = set(re.findall(r'Section\("([^"]+)"\)', source)) | {"Goodput under the SLOs", summary.TITLE}
    cited = set(re.findall(r"(?:report's|the|its) ([A-Z][a-z]+) section", readme))
    assert cited and all(any(t.startswith(name) for t in titles) for name in cited), (cited, titles)


def test_the_summary_opens_the_report_and_says_an_slo_below_the_floor(tmp_path, capsys):
    """The first section answers (scaling with its reading, the verdict, SLO attainment, flags) in at most
    ten lines per engine, and an SLO term that fails at the run's lowest load is said to be below the floor, with
    the value measured there, instead of a column of zeros."""
    run = tmp_path / "seed"
    shutil.copytree(RUNS / "seed-vllm-ollama", run)
    assert (
        cli.main(["--run", str(run), "--prometheus", f"http://127.0.0.1:{free_port()}", "--slo", "ttft_p95<=0.001"])
        == 0
    )
    err = capsys.readouterr().err
    md = (run / "report.md").read_text()
    first = md[md.index("## 1. Summary") : md.index("## 2. ")]
    assert "Scaling: 3.13x for a burst of 3" in first and "strongly sub-linear" in first
    assert "Scaling: 1.10x" in first and "Verdict: raise OLLAMA_NUM_PARALLEL" in first
    assert "ttft_p95<=0.001 is below this engine's floor here" in first and "at 1 user" in first
    goodput_section = md[md.index("## 4. Goodput under the SLOs") : md.index("## 5. ")]
    assert "- vllm: ttft_p95<=0.001 is below this engine's floor here" in goodput_section
    numbers = json.loads((run / "report.json").read_text())
    assert all(len(s["lines"]) <= 10 for s in numbers["summary"]) and len(numbers["summary"]) == 2
    assert numbers["sections"][0] == "Summary" and numbers["sections"][-2:] == ["Setup", "Not in this run"]
    assert "report: Summary" in err and "Scaling: 3.13x" in err  # the same lines on the terminal
