"""Long steps' estimates come from this machine: the step's last duration here, or its own progress rate."""

from __future__ import annotations

import json

from servescope.stack import llamacpp
from servescope.stack.progress import Step, StepTimes, remaining_from_rate
from tests.conftest import wait_until


def run_step(times: StepTimes, key: str = "llama.cpp build", **kwargs) -> list[str]:
    lines: list[str] = []
    with Step("building", emit=lines.append, key=key, times=times, **kwargs):
        pass
    return lines


def test_the_first_time_there_is_no_estimate_and_the_next_says_the_last(tmp_path):
    times = StepTimes(tmp_path / "step-times.json")
    first = run_step(times)
    assert first[0] == "→ building"
    times.record("llama.cpp build", 1410.0)  # as a real build's exit would
    assert run_step(times)[0] == "→ building (last time on this machine: 23m30s)"


def test_durations_are_kept_per_step_and_only_the_last_few(tmp_path):
    times = StepTimes(tmp_path / "t.json")
    for seconds in range(1, 9):
        times.record("vLLM warm-up", float(seconds))
    times.record("weights conversion", 117.0)
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["vLLM warm-up"] == [4.0, 5.0, 6.0, 7.0, 8.0]
    assert times.last("weights conversion") == 117.0 and times.last("nothing") is None


def test_a_failed_step_keeps_no_duration(tmp_path):
    times = StepTimes(tmp_path / "t.json")
    try:
        with Step("building", emit=lambda _: None, key="k", times=times):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert times.last("k") is None


def test_a_damaged_history_is_no_estimate_not_a_failure(tmp_path):
    path = tmp_path / "t.json"
    for text in ("{not json", "[1, 2]", '{"k": "x"}', '{"k": [-5, "a", 1e99]}'):
        path.write_text(text)
        assert StepTimes(path).last("k") is None
        assert run_step(StepTimes(path), key="k")[0] == "→ building"


def test_remaining_time_is_derived_from_the_rate_so_far_once_past_the_start():
    assert remaining_from_rate(600, 0.5) == 600
    assert remaining_from_rate(60, 0.25) == 180
    assert remaining_from_rate(10, 0.01) is None  # the first percent of a build is configuration
    assert remaining_from_rate(10, None) is None and remaining_from_rate(10, 1.0) is None


def test_heartbeats_carry_the_builds_progress_and_its_remaining_time(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("[  3%] Building C object\n[ 40%] Building CXX object ggml.cpp.o\n")
    lines: list[str] = []
    step = Step(
        "building",
        interval=0.05,
        emit=lines.append,
        detail=llamacpp.build_progress(log),
        fraction=llamacpp.build_fraction(log),
    )
    with step:
        step.started -= 120  # as if two minutes had passed: 40 % in 120 s leaves about 180 s at that rate
        # The beat thread is already running: a beat may come before the line above; the first after it is the one.
        assert wait_until(lambda: any(line.startswith("…") and "about 3m0" in line for line in lines), 10), lines
    beat = next(line for line in lines if line.startswith("…") and "about 3m0" in line)
    assert "[40%]" in beat and "left at its rate so far" in beat
