"""`servescope <verb>`: every verb reaches its package's command with the same flags, and says what it is called."""

from __future__ import annotations

import subprocess
import sys

import pytest

from servescope import command


def servescope(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # A child process per call: the dispatcher sets the program name once, and loadgen's import patches sockets.
    return subprocess.run(
        [sys.executable, "-m", "servescope.command", *argv], capture_output=True, text=True, timeout=timeout
    )


def test_help_lists_every_verb_under_its_group():
    proc = servescope("--help")
    assert proc.returncode == 0
    for verb in command.VERBS:
        assert f"  {verb.name} " in proc.stdout, verb.name
    assert "servescope quick http://HOST:PORT" in proc.stdout


def test_no_verb_prints_the_list_and_fails():
    proc = servescope()
    assert proc.returncode == 2 and "usage: servescope <verb>" in proc.stdout


def test_an_unknown_verb_is_one_line_with_the_nearest():
    proc = servescope("kne")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "servescope: no verb 'kne' (did you mean knee?); `servescope --help` lists them"
    ]


def test_every_command_of_the_stack_and_the_load_generator_has_a_verb():
    from loadgen.verbs import COMMANDS
    from servescope.stack import cli as stack_cli

    assert set(stack_cli.COMMANDS) | set(COMMANDS) | {"quick", "webui"} <= set(command.BY_NAME)


@pytest.mark.parametrize(
    ("verb", "usage"),
    [
        ("knee", "usage: servescope knee "),
        ("compare", "usage: servescope compare "),
        ("report", "usage: servescope report "),
        ("up", "usage: servescope "),
        ("exporter", "usage: servescope exporter "),
        ("dashboards", "usage: servescope dashboards "),
        ("quick", "usage: servescope quick "),
    ],
)
def test_a_verbs_help_is_its_packages_own_under_the_name_typed(verb, usage):
    proc = servescope(verb, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(usage), proc.stdout[:200]


def test_a_verb_passes_its_flags_through_unchanged():
    # The load generator's own check of a flag: the same one line and exit status as `python -m loadgen knee`.
    proc = servescope("knee", "--duration", "-3")
    direct = subprocess.run(
        [sys.executable, "-m", "loadgen", "knee", "--duration", "-3"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == direct.returncode == 2
    assert proc.stderr.replace("servescope knee", "X") == direct.stderr.replace("python -m loadgen knee", "X")


def test_version():
    proc = servescope("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("servescope ")


def test_a_subcommand_of_a_verb_says_both_words():
    proc = servescope("exporter", "check", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: servescope exporter check "), proc.stdout[:200]
