"""bench/cpu_priority.py: the table it prints, the one line where it cannot run, and one small pair for real as root."""

from __future__ import annotations

import os
import re

import pytest

from bench import cpu_priority as bench
from servescope.host import cpu_priority
from tests.conftest import unavailable


def test_the_table_gives_each_condition_its_medians_and_the_ratios():
    trials = [
        bench.Trial(False, 4.4, 0.45, 0.43, 1.1),
        bench.Trial(True, 1.3, 1.44, 0.18, 0.4),
        bench.Trial(True, 1.1, 1.5, 0.16, 0.4),
        bench.Trial(False, 4.0, 0.5, 0.41, 1.0),
    ]
    lines = bench.table(trials, 10)
    assert re.match(r"no priority\s+2\s+4\.20 \(4\.00-4\.40\)\s+0\.42 \(0\.41-0\.43\)", lines[1])
    assert re.match(r"cgroup at 10x\s+2\s+1\.20 \(1\.10-1\.30\)\s+0\.17 \(0\.16-0\.18\)", lines[2])
    assert lines[3] == (
        "protected: the fixed work 3.50x as fast (median wall 4.20 s -> 1.20 s); the hog took 0.42 -> 0.17 cores "
        "while it ran (2.5x less)"
    )


def test_where_it_cannot_run_it_says_why_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert bench.main([]) == 0
    assert capsys.readouterr().out == "cpu_priority: not run: not root\n"


@pytest.mark.serial  # its hog spins a core
def test_one_small_pair_runs_for_real_and_leaves_no_group(capsys):
    controller = cpu_priority.find_controller()
    if os.geteuid() != 0 or controller is None or not os.access(controller.root, os.W_OK):
        unavailable("not root, or no writable cpu controller: the benchmark needs both")
    assert bench.main(["--repetitions", "1", "--rounds", "100000"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"pair 1 unprotected: wall [\d.]+ s", out) and re.search(r"pair 1 protected  : wall", out)
    assert "protected: the fixed work " in out
    assert not (controller.root / bench.GROUP).exists()
