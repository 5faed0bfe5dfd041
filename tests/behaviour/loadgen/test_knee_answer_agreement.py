"""quick, the knee command and the report give one answer for one run folder (quick and knee runs recorded on real engines).

`quick-vllm-unsettled` is the shape that once printed an unsettled boundary as a capacity: its probe budget ran out
with 2 users held once (owed a repeat) and 4 users failing, so the answer is a range, the same in all three.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from loadgen import knee as knee_search
from loadgen import quick_words
from servescope.contracts.runfolder import RunFolder
from servescope.judgements import knee_answer, slo
from servescope.report import goodput, summary
from tests.paths import RUNS

RECORDED = {
    "quick-vllm-settled": "3 users",
    "quick-vllm-unsettled": "1 to 3 users",
    "quick-llamacpp": "1 user",
    "knee-vllm": "2 users",  # a knee run on a busy host
    "knee-vllm-cpu": "2 users",
}


def answers(folder: Path) -> dict[str, str]:
    """The capacity each of the three says for the folder's knee.json."""
    knee = json.loads((folder / "knee.json").read_text())
    spec = slo.resolve(knee["spec"], knee["objective"])
    (knee_line,) = [line for line in knee_search.summary_lines(knee, spec.describe()) if line.startswith("knee: ")]
    outcome = quick_words.Outcome("vLLM-CPU 0.32.0", "http://127.0.0.1:8009", "m", spec, knee)
    outcome.records = list(RunFolder(folder).requests())
    (capacity,) = [line for line in quick_words.lines(outcome) if line.startswith("  Capacity:")]
    return {
        "knee command": knee_line.removeprefix("knee: ").split(";")[0],
        "quick": re.sub(r"^\s+Capacity:\s+", "", capacity).split(" at once")[0],
        "report summary": summary._knee_line(knee).removeprefix("Knee: ").split(" (")[0],
        "report knee section": goodput._knee_text(knee).split("knee.json): the knee is ")[1].split(" (")[0],
    }


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_quick_the_knee_and_the_report_say_the_same_capacity(name):
    said = answers(RUNS / name)
    assert set(said.values()) == {RECORDED[name]}, said


def test_an_unsettled_answer_says_so_everywhere():
    knee = json.loads((RUNS / "quick-vllm-unsettled" / "knee.json").read_text())
    assert knee["unsettled"] and knee_answer.capacity_range(knee) == (1, 3)
    more = knee_answer.unsettled_words(knee)
    assert more.startswith("not settled: about 3 more measurements")
    assert more in summary._knee_line(knee) and more in goodput._knee_text(knee)
    quick_text = (RUNS / "quick-vllm-unsettled" / "quick.txt").read_text()
    assert "1 to 3 users at once" in quick_text and more in quick_text  # what the recorded run printed
