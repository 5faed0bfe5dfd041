"""The report's sections (servescope/report/sections.py): numbered in SECTIONS' order, each rendered from its built data alone."""

from __future__ import annotations

import re

from servescope.contracts.settings import ReportSettings
from servescope.report import sections, workloads
from servescope.report.load import load
from servescope.report.outline import Context
from servescope.report.render import markdown
from tests.paths import RUNS
from tests.servescope.report.test_plan import _knee_folder

NO_PROMETHEUS = "http://127.0.0.1:9"
# report.json's keys, the same since sections became objects (issue 27): "run" and "plots" are the report's own.
KEYS = {
    "run", "sections", "plots", "summary", "table", "verdict", "goodput", "plan", "latency", "gauges", "sweeps",
    "comparison", "workloads", "crosscheck", "ttft_split", "manifest", "engines", "phases", "loader_warnings", "noise",
    "fairness_warnings", "left_out",
}  # fmt: skip


def headings(doc) -> list[tuple[int, str]]:
    return [(int(n), t) for n, t in re.findall(r"^## (\d+)\. (.+)$", markdown(doc), re.M)]


def test_numbers_follow_the_order_and_a_run_without_a_knee_has_no_plan_section(tmp_path, monkeypatch):
    monkeypatch.setenv("PLAN_TRACE", "")  # a knee run says why it could not plan: the section is there regardless
    knee = load(_knee_folder(tmp_path / "k"))
    plain = load(RUNS / "seed-vllm-ollama")
    try:
        with_plan, numbers = sections.build(knee, NO_PROMETHEUS, figures=False)
        without, plain_numbers = sections.build(plain, NO_PROMETHEUS, figures=False)
    finally:
        knee.close()
        plain.close()
    for doc, said in ((with_plan, numbers), (without, plain_numbers)):
        assert [n for n, _ in headings(doc)] == list(range(1, len(headings(doc)) + 1))  # no gap where one is left out
        assert said["sections"] == [t for _, t in headings(doc)]
        assert said["sections"][-1] == "Not in this run" and said["sections"][-2] == "Setup"
    titles = [t for _, t in headings(with_plan)]
    # A knee run has no sequential-vs-burst table, and its answer is the knee: goodput with the knee and the replicas
    # it plans follow the summary, numbered 2 and 3, then the verdict.
    assert titles[:5] == ["Summary", "Goodput under the SLOs", titles[2], "Verdict: which knob to move", "Latency"]
    assert titles[2].startswith("Replicas for a traffic")
    assert not any(t.startswith("Replicas") for _, t in headings(without)) and plain_numbers["plan"] is None
    assert set(numbers) == set(plain_numbers) == KEYS


def test_every_section_renders_from_its_data_with_the_run_closed(monkeypatch, tmp_path):
    """SQL stays in build: once every section is built, the run's database can go and each still renders."""
    monkeypatch.setenv("PLAN_TRACE", "")
    run = load(_knee_folder(tmp_path / "k"))
    ctx = Context(run, NO_PROMETHEUS, figures=False, settings=ReportSettings.from_env())
    built = [(s, ctx.of(type(s))) for s in sections.SECTIONS]
    ctx.plots.collect()
    run.close()
    rendered = [s.render(data, k) for k, (s, data) in enumerate(built, 1)]
    assert [sec.number for sec in rendered] == list(range(1, len(sections.SECTIONS) + 1))
    assert all(sec.blocks for sec in rendered)


def test_the_setup_section_says_the_cpu_priority_the_run_recorded(tmp_path):
    """One line from the manifest's trials.cpu_priority (servescope/host/cpu_priority.py); a run from before it: none."""
    import json
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(RUNS / "seed-vllm-ollama", folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["trials"] = {
        "repetitions": 1,
        "cpu_priority": {
            "mode": "auto", "applied": True, "controller": "v1 cpu.shares", "weight": 10240, "multiple": 10,
            "path": "/sys/fs/cgroup/cpu/servescope", "who": {"load generator": [10], "vllm": [11]},
        },
    }  # fmt: skip
    (folder / "manifest.json").write_text(json.dumps(manifest))
    texts = []
    for path in (folder, RUNS / "seed-vllm-ollama"):
        run = load(path)
        try:
            doc, _ = sections.build(run, NO_PROMETHEUS, figures=False)
        finally:
            run.close()
        texts.append(markdown(doc))
    assert (
        "CPU priority: the engine (vllm) and the load generator ran in cgroup /sys/fs/cgroup/cpu/servescope at "
        "cpu.shares 10240 (10x a default group): other programs got the CPU when these were idle (CPU_PRIORITY=auto)."
    ) in texts[0]
    assert "CPU priority" not in texts[1]


def _section_text(doc, title: str) -> str:
    md = markdown(doc)
    start = re.search(rf"^## \d+\. {re.escape(title)}", md, re.M).start()
    end = md.find("\n## ", start + 1)
    return md[start : end if end > 0 else None]


def test_rule_paragraphs_name_only_the_engines_that_ran(tmp_path, monkeypatch):
    """A run of vLLM alone reads no llama.cpp or Ollama rule (issue 40: a 9-line paragraph about vLLM and Ollama rules
    when only llama.cpp ran); a run of vLLM and Ollama reads both, and still no llama.cpp."""
    monkeypatch.setenv("PLAN_TRACE", "")
    for folder, ran, absent in (
        (_knee_folder(tmp_path / "k"), ["vLLM-CPU", "--max-num-seqs"], ["llama.cpp", "LLAMACPP", "Ollama", "OLLAMA"]),
        (RUNS / "seed-vllm-ollama", ["vLLM-CPU", "OLLAMA_NUM_PARALLEL"], ["llama.cpp", "LLAMACPP"]),
    ):
        run = load(folder)
        try:
            doc, numbers = sections.build(run, NO_PROMETHEUS, figures=False)
        finally:
            run.close()
        rule = _section_text(doc, "Verdict: which knob to move").split("\n\n")[1]
        assert rule.startswith("The reference page's section 4") and all(name in rule for name in ran), rule
        assert not [name for name in absent if name in rule], rule
        assert numbers["verdict"]["rule"] == rule
        assert "llama.cpp" not in _section_text(doc, "Workloads")
    cross = _section_text(doc, "Engine-side cross-check")  # the vLLM and Ollama run's
    assert "cold load: Ollama load_duration" in cross and "llama.cpp reports no queue time" not in cross
    assert workloads.reuse_rule(["vllm"]).count("vLLM only with --enable-prompt-tokens-details") == 1
    assert "llama.cpp" not in workloads.reuse_rule(["vllm"]) and "llama.cpp" in workloads.reuse_rule(["llamacpp"])
