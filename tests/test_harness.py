"""tests/harness.py, the one way tests run the CLIs: exit status and output come back, a hang is one clear error."""

from __future__ import annotations

import os

import pytest

from tests.harness import REPO, CliTimeout, cli_env, run_cli, run_python, start_cli


def test_a_failing_command_gives_back_its_exit_status_and_stderr(tmp_path):
    proc = run_cli("report", "--run", "nope", "--results", str(tmp_path), timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[0].startswith("report: ") and "nope" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_child_imports_this_repo_and_sees_the_knobs_the_test_set(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_PROBE", "set by the test")
    code = "import os, servescope.report as report; print(report.__file__); print(os.environ['HARNESS_PROBE'])"
    proc = run_python("-c", code, cwd=tmp_path, timeout=60)  # not the repo: PYTHONPATH finds it
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str(REPO / "servescope" / "report" / "__init__.py"), "set by the test"]
    assert cli_env({"PYTHONPATH": f"{REPO}{os.pathsep}/elsewhere"})["PYTHONPATH"] == f"{REPO}{os.pathsep}/elsewhere"


def test_a_run_past_its_timeout_is_killed_and_said_in_one_clear_error():
    code = "import sys, time; print('started', file=sys.stderr, flush=True); time.sleep(60)"
    with pytest.raises(CliTimeout) as caught:
        run_python("-c", code, timeout=2)
    message = str(caught.value)
    assert message.startswith("python -c import sys") and "did not finish within 2 s and was killed" in message
    assert message.endswith("its output ended:\nstarted")


def test_a_started_cli_is_stopped_when_its_block_ends_and_what_it_wrote_unread_is_kept(tmp_path):
    (tmp_path / "sleeper.py").write_text(
        "import signal, sys\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(3))\n"
        "print('unread line', file=sys.stderr, flush=True)\nprint('ready', flush=True)\nsignal.pause()\n"
    )
    with start_cli("sleeper", cwd=tmp_path) as proc:  # `-m` finds a module in its working directory
        assert proc.stdout.readline() == "ready\n"
        assert proc.poll() is None
    assert proc.returncode == 3  # SIGTERM reached it: it was stopped, not left running
    assert proc.unread == ("", "unread line\n")
