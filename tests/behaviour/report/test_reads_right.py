"""The report of each kind of run reads right (issue 40): recorded runs of a comparison (what `make up` runs), a knee,
quick and a sweep. Its first sections are the answers of that kind of run, a section with nothing to say on it is
named at the end with why, latency is per load level, the HTML cuts no text, and counts agree with their nouns."""

from __future__ import annotations

import html
import re

import pytest

from servescope.report import render, sections
from servescope.report.load import load
from servescope.report.outline import NOT_IN_THIS_RUN
from tests.paths import RUNS

NO_PROMETHEUS = "http://127.0.0.1:9"
TABLE = "The sequential-vs-burst table"
VERDICT, GOODPUT = "Verdict: which knob to move", "Goodput under the SLOs"
REPLICAS = "Replicas for a traffic (predicted from this knee)"
# Each recorded run's first sections after the summary: the answers of its kind.
FIRST = {
    "compare-vllm-llamacpp": [TABLE, VERDICT, GOODPUT],
    "knee-vllm": [GOODPUT, REPLICAS, VERDICT],
    "quick-llamacpp": [GOODPUT, REPLICAS, VERDICT],
    "sweep-llamacpp": [VERDICT, GOODPUT, "Latency"],
}
LEVELS = {"knee-vllm": ["1 user", "2 users", "3 users", "4 users"], "quick-llamacpp": ["1 user", "2 users"]}
LEVELS["sweep-llamacpp"] = ["1 user", "2 users", "4 users"]


@pytest.fixture(scope="module")
def reports() -> dict[str, tuple[render.Document, dict]]:
    built = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PLAN_TRACE", "")  # the replicas section says why it planned nothing: no trace simulated here
        for name in FIRST:
            run = load(RUNS / name)
            try:
                built[name] = sections.build(run, NO_PROMETHEUS, figures=False)
            finally:
                run.close()
    return built


def headings(doc: render.Document) -> list[tuple[int, str]]:
    return [(int(n), t) for n, t in re.findall(r"^## (\d+)\. (.+)$", render.markdown(doc), re.M)]


@pytest.mark.parametrize("name", list(FIRST))
def test_the_first_sections_are_the_answers_of_the_runs_kind(reports, name):
    """Issue 40: a knee or quick report's first screen was mostly an empty section 2, "No sequential or burst phases
    in this run". Now each kind opens on its answers and the numbers close up where a section is left out."""
    doc, numbers = reports[name]
    found = headings(doc)
    assert [n for n, _ in found] == list(range(1, len(found) + 1))
    titles = [t for _, t in found]
    assert titles[: 1 + len(FIRST[name])] == ["Summary", *FIRST[name]]
    left_out = {x["section"]: x["why"] for x in numbers["left_out"]}
    if name != "compare-vllm-llamacpp":
        assert TABLE not in titles and "no sequential or burst phases" in left_out[TABLE]
        assert titles[-1] == NOT_IN_THIS_RUN and titles[-2] == "Setup"
    for title in left_out:  # named once, at the end, with why; its own empty text nowhere
        assert title not in titles and f"- {title}: {left_out[title]}" in render.markdown(doc)
    assert "No sequential or burst phases in this run" not in render.markdown(doc)


@pytest.mark.parametrize("name", list(FIRST))
def test_latency_is_per_load_level_where_the_run_had_several(reports, name):
    """Issue 40: the Latency table pooled the 1-user and 2-user levels into one row (TTFT p50 1,640 ms, p95 5,830 ms:
    neither level's)."""
    doc, numbers = reports[name]
    groups = numbers["latency"]["groups"]
    assert [g["level"] for g in groups] == LEVELS.get(name, [""] * len(groups))
    md = render.markdown(doc)
    latency = md[md.index(". Latency\n") : md.index("\n## ", md.index(". Latency\n"))]
    assert ("| Engine | Scenario | Load | Metric |" in latency) == (name in LEVELS)
    for level in LEVELS.get(name, []):
        assert len(re.findall(rf"^\| \w+ \| \w+ \| {level} \| ", latency, re.M)) == 4 + 1 + 1  # metrics, fails, lengths


@pytest.mark.parametrize("name", list(FIRST))
def test_the_html_cuts_no_text(reports, name):
    """Issue 40: the HTML Summary cut its lines with "..." where the page had room."""
    doc, numbers = reports[name]
    page = render.html_page(doc)
    text = html.unescape(re.sub(r"<[^>]+>", "\n", page))
    cut = [line for line in text.splitlines() if line.rstrip().endswith(("...", "\u2026"))]
    assert not cut, cut
    assert "text-overflow" not in page and "ellipsis" not in page
    for engine in numbers["summary"]:  # every summary line whole in the page
        for line in engine["lines"]:
            assert html.escape(line, quote=False) in page or line in text


def test_the_summarys_fairness_flag_is_the_whole_warning(reports):
    """The comparison's fairness warning (precisions differ) was cut at 220 characters in the summary."""
    _, numbers = reports["compare-vllm-llamacpp"]
    flags = [line for s in numbers["summary"] for line in s["lines"] if line.startswith("Flag: fairness: ")]
    assert flags and all(line.removeprefix("Flag: fairness: ") in numbers["fairness_warnings"] for line in flags)
    assert any(len(line) > 220 for line in flags)  # long enough that the old clip would have cut it


COUNTED = "users|requests|phases|engines|repetitions|measurements|records|messages|plots|samples|levels|passes"


@pytest.mark.parametrize("name", list(FIRST))
def test_counts_agree_with_their_nouns(reports, name):
    """Issue 40: "Knee: 1 users"; and "(s)" wherever a count was not known to be one or many. The replicas section
    is servescope/report/plan.py's (its own words)."""
    doc, _ = reports[name]
    md = render.markdown(doc)
    plan_start = md.find(f". {REPLICAS}")
    if plan_start >= 0:
        md = md[:plan_start] + md[md.index("\n## ", plan_start) :]
    assert "(s)" not in md
    assert not re.findall(rf"(?<![\d.,]){1} ({COUNTED})\b", md), re.findall(rf"(?<![\d.,])1 ({COUNTED})\b", md)
