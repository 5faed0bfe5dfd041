"""The test tree mirrors the code: every tests/<path>/test_<x>.py outside the named folders tests a module <path>/<x>.py."""

from __future__ import annotations

from pathlib import Path

from tests.paths import REPO, TESTS

# Folders whose files are named for something other than one module (tests/README.md says which).
NOT_MIRRORED = ("behaviour", "e2e", "fixtures")


def module_for(folder: Path, name: str) -> Path | None:
    """The module `name` names in `folder` (relative to tests/), if any: <folder>/<name>.py, a package <folder>/<name>/,
    the folder's __main__.py for `main`, or a test helper of that name beside the test (tests/harness.py, a double)."""
    candidates = [REPO / folder / f"{name}.py", REPO / folder / name / "__init__.py", TESTS / folder / f"{name}.py"]
    if name == "main":
        candidates.append(REPO / folder / "__main__.py")
    return next((path for path in candidates if path.is_file()), None)


def module_under_test(test: Path) -> Path | None:
    """test_<module>.py, or test_<module>_<aspect>.py for a file that tests one aspect of it (its fuzz, its hostile
    input, one feature): the longest leading part of the name that is a module wins."""
    folder, words = test.parent.relative_to(TESTS), test.stem.removeprefix("test_").split("_")
    for end in range(len(words), 0, -1):
        found = module_for(folder, "_".join(words[:end]))
        if found is not None:
            return found
    return None


def mirrored_tests() -> list[Path]:
    return [
        path
        for path in sorted(TESTS.rglob("test_*.py"))
        if path.relative_to(TESTS).parts[0] not in NOT_MIRRORED and "__pycache__" not in path.parts
    ]


def test_every_test_file_outside_the_named_folders_mirrors_a_module():
    orphans = [str(path.relative_to(REPO)) for path in mirrored_tests() if module_under_test(path) is None]
    assert not orphans, (
        "test files that mirror no module (move to tests/<module path>/test_<module>[_<aspect>].py, "
        f"or to tests/behaviour/ and list them in tests/README.md): {orphans}"
    )


def test_every_behaviour_suite_is_listed_in_the_tests_readme():
    listed = (TESTS / "README.md").read_text()
    behaviour = TESTS / "behaviour"
    missing = [
        str(path.relative_to(behaviour))
        for path in sorted(behaviour.rglob("test_*.py"))
        if f"`{path.relative_to(behaviour)}`" not in listed
    ]
    assert not missing, f"behaviour suites not listed in tests/README.md (one line each): {missing}"


def test_the_rule_finds_modules_aspects_packages_helpers_and_refuses_the_rest():
    cases = {
        "servescope/report/test_plan.py": "servescope/report/plan.py",
        "servescope/report/test_plan_bounds.py": "servescope/report/plan.py",
        "loadgen/test_client_metrics.py": "loadgen/client_metrics.py",  # a module, not client.py's "metrics" aspect
        "servescope/test_workloads.py": "servescope/workloads/__init__.py",
        "loadgen/test_main.py": "loadgen/__main__.py",
        "test_harness.py": "tests/harness.py",
        "doubles/test_recorded_engine.py": "tests/doubles/recorded_engine.py",
        "servescope/test_no_such_module.py": None,
        "loadgen/test_open_loop_honesty.py": None,
    }
    found = {test: module_under_test(TESTS / test) for test in cases}
    assert {test: path and str(path.relative_to(REPO)) for test, path in found.items()} == cases
