"""Typed at the boundary (servescope/contracts/settings.py): the environment and the SLO specs are read where a command
starts, and handed down as values. No knob is read below an entry (but for the listed exceptions), no SLO spec is
parsed below one (but where a command line or a run folder enters)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from servescope.contracts import settings
from servescope.contracts.settings import KnobTable, LoadSettings, SamplerSettings
from tests.paths import REPO

PACKAGES = ("servescope", "loadgen", "exporter", "dashboards")
# The knob machinery itself: the table, its reader and what is generated from it, and the settings module.
KNOB_MACHINERY = (
    "servescope/contracts/knobs.py",
    "servescope/contracts/knob_defaults.py",
    "servescope/contracts/knob_table.py",
    "servescope/contracts/settings.py",
)
KNOB_READERS = ("get", "load")  # knobs.get, get_int, get_port, ..., knobs.load

# Where an SLO spec's text becomes a SloSpec (module:function): a command line, the environment's SLO knobs, or a run
# folder's record entering. Everything below receives the SloSpec.
SLO_ENTRIES = {
    "loadgen/options.py:slo_spec": "--slo's argparse type: a spec that cannot be used is the flag's one line",
    "loadgen/runplan.py:spec_of": "a run's SLOs, read with its options (RunPlan.spec; Locust's init for its /metrics)",
    "loadgen/quick.py:Settings.of": "quick's command line, with quick's own defaults",
    "servescope/report/run_slo.py:spec_of_manifest": "a run folder's recorded SLOs, and the report's --slo over them",
    "servescope/report/plan.py:_spec": "the plan command's --slo over its knee runs' recorded SLOs",
    "servescope/report/plan.py:_recorded_spec": "a knee run folder's recorded SLOs, read with its knee.json",
    "servescope/stack/tune.py:Tuner.knee": "a knee run's knee.json, read once the run ends",
}


def python_files(root: Path = REPO) -> dict[str, Path]:
    """The checked packages' modules by their path from the checkout."""
    return {
        path.relative_to(root).as_posix(): path
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
    }


def calls(tree: ast.AST, receiver: str, names: tuple[str, ...], prefix: bool = False) -> list[tuple[str, int]]:
    """(enclosing function's qualified name, line) of every `receiver.NAME(...)` call (NAME...: prefix=True)."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, [*scope, child.name])
                continue
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                fn = child.func
                named = fn.attr.startswith(names) if prefix else fn.attr in names
                if isinstance(fn.value, ast.Name) and fn.value.id == receiver and named:
                    found.append((".".join(scope) or "<module>", child.lineno))
            visit(child, scope)

    visit(tree, [])
    return found


def knob_reads(root: Path = REPO) -> list[str]:
    """`path:line` of every knobs.get*/knobs.load* call outside the knob machinery."""
    out = []
    for name, path in python_files(root).items():
        if name in KNOB_MACHINERY:
            continue
        out += [f"{name}:{line}" for _, line in calls(ast.parse(path.read_text()), "knobs", KNOB_READERS, prefix=True)]
    return out


def slo_parses(root: Path = REPO) -> list[str]:
    """`path:function` of every slo.parse / slo.resolve call (slo.py's own calls are its own)."""
    out = []
    for name, path in python_files(root).items():
        if name != "servescope/judgements/slo.py":
            out += [f"{name}:{fn}" for fn, _ in calls(ast.parse(path.read_text()), "slo", ("parse", "resolve"))]
    return out


def test_no_knob_is_read_outside_the_settings_module_and_its_listed_exceptions():
    unlisted = [read for read in knob_reads() if read.split(":")[0] not in settings.LISTED_EXCEPTIONS]
    assert unlisted == [], "read a knob below an entry: add it to servescope/contracts/settings.py and pass it down"


def test_no_slo_spec_is_parsed_below_the_entry_points():
    unlisted = sorted(set(slo_parses()) - set(SLO_ENTRIES))
    assert unlisted == [], "parse the SLO where the command line or the run folder enters, and pass the SloSpec"


def test_every_listed_exception_and_entry_is_still_there():
    """An entry nothing uses any more is a stale excuse waiting for the next read below an entry."""
    readers = {read.split(":")[0] for read in knob_reads()}
    assert set(settings.LISTED_EXCEPTIONS) - readers == set()
    assert set(SLO_ENTRIES) - set(slo_parses()) == set()


def test_the_scans_find_a_read_and_a_parse_wherever_they_are(tmp_path):
    module = tmp_path / "loadgen" / "deep.py"
    module.parent.mkdir()
    module.write_text(
        "from servescope.contracts import knobs\nfrom servescope.judgements import slo\n\n"
        "class Below:\n    def judge(self):\n        knobs.get_int('X')\n        return slo.resolve(knobs.load()['SLO'])\n"
    )
    assert knob_reads(tmp_path) == ["loadgen/deep.py:6", "loadgen/deep.py:7"]
    assert slo_parses(tmp_path) == ["loadgen/deep.py:Below.judge"]


def test_every_exception_says_why():
    assert all(len(why.split()) >= 5 for why in settings.LISTED_EXCEPTIONS.values())
    assert all(len(why.split()) >= 5 for why in SLO_ENTRIES.values())


# ---------------------------------------------------------------- the settings read once


def test_a_table_is_the_knobs_as_the_environment_set_them_when_it_was_read(monkeypatch):
    monkeypatch.setenv("ROUTER_PORT", "18090")
    table = KnobTable.from_env()
    monkeypatch.setenv("ROUTER_PORT", "18091")  # after the entry read it: not seen
    assert table.port("ROUTER_PORT") == 18090 and table["ROUTER_PORT"] == "18090"
    assert KnobTable.from_env({"ROUTER_PORT": "7"}).port("ROUTER_PORT") == 7  # a child's environment


@pytest.mark.parametrize(
    ("key", "text", "read", "says"),
    [
        ("ROUTER_PORT", "70000", lambda t: t.port("ROUTER_PORT"), "ROUTER_PORT='70000': expected a whole number"),
        ("TUNE_MAX_STEPS", "many", lambda t: t.int("TUNE_MAX_STEPS"), "TUNE_MAX_STEPS='many' is not an integer"),
        ("PLAN_SPEED", "0", lambda t: t.positive("PLAN_SPEED", "x"), "PLAN_SPEED='0': expected a number of x > 0"),
    ],
)
def test_a_bad_knob_is_said_where_it_is_asked_for_in_the_machinerys_one_line(monkeypatch, key, text, read, says):
    monkeypatch.setenv(key, text)
    table = KnobTable.from_env()  # reading the table never fails: a command that does not ask is not stopped
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        read(table)


def test_the_load_generators_settings_name_what_it_reads(monkeypatch):
    monkeypatch.setenv("LOADGEN_FAULT_WAIT_S", "7")
    monkeypatch.setenv("SAMPLE_EXPORTER_URL", "")
    monkeypatch.setenv("EXPORTER_PORT", "19464")
    load = LoadSettings.from_env()
    assert load.fault_wait_s == 7.0 and isinstance(load.sampler, SamplerSettings)
    assert load.sampler.exporter_url == "http://127.0.0.1:19464"
