"""The figure painter: a child process draws the report's figures from plain data; the report never imports matplotlib."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from servescope.judgements import stats
from servescope.report import painter as painter_module
from servescope.report.painter import FigureFailed, Painter, PainterStopped
from tests.harness import run_python, start_cli
from tests.paths import REPO, RUNS

BARS = {"bars": [("vLLM", "sequential", 4.0, None), ("vLLM", "burst", 2.0, 2.0)]}


def test_the_report_draws_its_figures_without_importing_matplotlib(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUNS / "seed-vllm-ollama", run)
    script = (
        "import sys; from servescope.report import cli; "
        f"rc = cli.main(['--run', {str(run)!r}, '--prometheus', 'http://127.0.0.1:9']); "
        "print(rc, 'matplotlib' in sys.modules)"
    )
    done = run_python("-c", script, timeout=120)
    assert done.stdout.split()[-2:] == ["0", "False"], done.stderr
    plots = json.loads((run / "report.json").read_text())["plots"]
    assert {"latency.png", "sequential_burst_table.png", "comparison.png"} <= set(plots)
    for name in plots:
        assert (run / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "painter" not in done.stderr  # no fallback, no lost figure


def test_a_painter_that_died_loses_its_figures_with_one_line_and_is_replaced(tmp_path, capsys):
    painter = Painter()
    assert painter.collect({"table": painter.draw("sequential_burst_table", BARS, tmp_path / "a.png")}) == {
        "table": tmp_path / "a.png"
    }
    painter._proc.kill()
    painter._proc.wait()
    drawn = {key: painter.draw("sequential_burst_table", BARS, tmp_path / f"{key}.png") for key in ("table", "latency")}
    with pytest.raises(PainterStopped):
        drawn["table"].result(timeout=10)
    assert painter.collect(drawn) == {"table": None, "latency": None}
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["report: the figure painter process stopped; figures left out: table, latency"]
    assert painter.broken
    Painter._shared = painter
    fresh = Painter.shared()
    assert fresh is not painter
    assert (
        fresh.collect({"table": fresh.draw("sequential_burst_table", BARS, tmp_path / "b.png")})["table"]
        == tmp_path / "b.png"
    )


def test_a_figure_whose_drawing_fails_raises_its_own_exception_with_the_painters_traceback(tmp_path):
    painter = Painter.shared()
    future = painter.draw("sequential_burst_table", {"bars": [("vLLM", "burst")]}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="not enough values to unpack") as failed:
        painter.collect({"table": future})
    assert "in the figure painter:" in failed.value.__notes__[0] and "plots.py" in failed.value.__notes__[0]
    # The painter goes on: the next figure is drawn.
    assert (
        painter.collect({"t": painter.draw("sequential_burst_table", BARS, tmp_path / "y.png")})["t"]
        == tmp_path / "y.png"
    )


def test_a_painter_that_answers_garbage_is_stopped_not_waited_on(tmp_path, capsys):
    """Bytes on its stdout that are not an answer (a startup hook that prints): its figures fail, none hangs."""
    painter = Painter([sys.executable, "-c", "print('Loading...', flush=True); import sys; sys.stdin.buffer.read()"])
    assert painter.collect({"table": painter.draw("sequential_burst_table", BARS, tmp_path / "t.png")}) == {
        "table": None
    }
    assert "figures left out: table" in capsys.readouterr().err
    assert painter.broken and painter._proc.wait(timeout=10) is not None


def test_data_that_does_not_pickle_fails_its_figure_alone(tmp_path):
    painter = Painter()
    bad = painter.draw("sequential_burst_table", {"bars": (bar for bar in BARS["bars"])}, tmp_path / "bad.png")
    good = painter.draw("sequential_burst_table", BARS, tmp_path / "good.png")
    with pytest.raises(FigureFailed, match="does not pickle"):
        bad.result(timeout=30)
    assert good.result(timeout=30) == tmp_path / "good.png"


def test_a_figure_that_cannot_be_written_is_the_reports_one_line_and_exit_1(tmp_path, capsys):
    from servescope.report import cli

    run = tmp_path / "run"
    shutil.copytree(RUNS / "seed-vllm-ollama", run)
    (run / "sequential_burst_table.png").mkdir()  # the figure's name taken by a folder
    assert cli.main(["--run", str(run), "--prometheus", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"report: cannot write the report: Is a directory ({run / 'sequential_burst_table.png'})"


def test_no_painter_process_means_figures_drawn_here_after_one_line(tmp_path, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise OSError("Resource temporarily unavailable")

    monkeypatch.setattr(painter_module.subprocess, "Popen", refuse)
    painter = Painter()
    assert (
        painter.collect({"t": painter.draw("sequential_burst_table", BARS, tmp_path / "t.png")})["t"]
        == tmp_path / "t.png"
    )
    assert capsys.readouterr().err.strip().splitlines() == [
        "report: figures drawn in this process, no painter process (Resource temporarily unavailable)"
    ]


@pytest.mark.parametrize(
    "values",
    [
        np.random.default_rng(1).lognormal(0, 1, 5001),
        np.round(np.random.default_rng(2).normal(10, 3, 2000), 1),  # ties
        np.array([3.0]),
        np.array([1.0, 2.0]),
        np.array([5.0] * 10 + [1.0, 100.0]),
    ],
)
def test_box_stats_are_matplotlibs(values):
    from matplotlib import cbook

    ours = stats.box_stats(values, (5, 95))
    theirs = cbook.boxplot_stats(values, whis=(5, 95))[0]
    for key in ("mean", "med", "q1", "q3", "whislo", "whishi"):
        assert ours[key] == theirs[key], key
    assert np.array_equal(ours["fliers"], theirs["fliers"])


# --- a painter that stops answering (SIGSTOP), Ctrl-C while it draws ---

STOPPED_PAINTER = """
import os, signal, sys
from pathlib import Path
from servescope.report.painter import Painter
painter = Painter()
os.kill(painter._proc.pid, signal.SIGSTOP)
out = Path(sys.argv[1])
bars = BARS_REPR
drawn = {key: painter.draw("sequential_burst_table", bars, out / f"{key}.png") for key in ("table", "latency")}
print(painter.collect(drawn), painter.broken, flush=True)
""".replace("BARS_REPR", repr(BARS))


def test_a_stopped_painter_costs_its_figures_after_the_deadline_not_the_report(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", STOPPED_PAINTER, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,  # without a deadline it waits as long as the painter is stopped: forever
        env={**os.environ, "PAINTER_FIGURE_TIMEOUT_S": "2"},
    )
    assert done.stdout.strip() == "{'table': None, 'latency': None} True", done.stderr
    assert done.stderr.strip().splitlines() == [
        "report: the figure painter drew nothing for 2 s (PAINTER_FIGURE_TIMEOUT_S) and was stopped; "
        "figures left out: table, latency"
    ]


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def test_ctrl_c_while_the_report_draws_is_one_line(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUNS / "seed-vllm-ollama", run)
    painters: list[int] = []
    with start_cli(
        *["report", "--run", str(run), "--prometheus", "http://127.0.0.1:9"],
        env={**os.environ, "PAINTER_FIGURE_TIMEOUT_S": "600"},
    ) as report:
        try:
            deadline = time.monotonic() + 60
            while not painters and report.poll() is None and time.monotonic() < deadline:
                painters = _children(report.pid)
                time.sleep(0.02)
            assert painters, "the report started no painter"
            os.kill(painters[0], signal.SIGSTOP)  # it draws nothing more: the report waits on its figures
            time.sleep(1)
            report.send_signal(signal.SIGINT)
            out, err = report.communicate(timeout=60)
        finally:
            for pid in painters:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    assert report.returncode == 130, err
    assert err.strip().splitlines()[-1] == "report: interrupted (Ctrl-C): the report was not written", err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
