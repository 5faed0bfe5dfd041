"""The project's packages import one another without a cycle (base types at the bottom, factories at the top).

Every import counts, at module level or inside a function: an import moved into a function to dodge a cycle
still makes the two modules depend on each other, it only defers the failure to the first call. Imports under
`if TYPE_CHECKING:` count too (a type named across modules is a dependency of the design). A package's
`__init__` run before its module is not an edge; a module naming its own package (`from loadgen import
workloads`: the dispatcher in its `__init__`) is one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.paths import REPO

ROOT = REPO
PACKAGES = ("servescope", "loadgen", "exporter", "bench", "dashboards")


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the checked packages."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported_modules(tree: ast.AST, module: str, is_package: bool, files: dict[str, Path]) -> set[str]:
    """The project modules a module imports: `from a import b` depends on a.b when that is a module, else on a."""

    def known(name: str) -> str | None:
        while name and name not in files:  # `import a.b.c` of something that is not a module: its nearest package
            name = name.rpartition(".")[0]
        return name or None

    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(filter(None, (known(alias.name) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:
                sub = f"{prefix}.{alias.name}"
                found.add(sub) if sub in files else found.update(filter(None, [known(prefix)]))
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports.

    Only what a module names: `import a.b.c` runs a and a.b first, but that is Python's order, not a dependency.
    A module that imports its own package (`from loadgen import workloads`) depends on it like on any other.
    """
    files = module_files(root)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph[module] = imported_modules(tree, module, path.name == "__init__.py", files) - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles (each a path a -> b -> ... -> a) of every strongly connected group of modules (Tarjan's algorithm):
    the shortest one through each member, each cycle once."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    found: list[list[str]] = []
    seen: set[frozenset[tuple[str, str]]] = set()
    for group in groups:
        for member in sorted(group):
            path = _path_through(graph, group, member)
            edges = frozenset(zip(path, path[1:], strict=False))
            if edges not in seen:
                seen.add(edges)
                found.append(path)
    return found


def _path_through(graph: dict[str, set[str]], group: set[str], start: str) -> list[str]:
    """A shortest cycle from `start` back to itself, within its group."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    return sorted(group)  # pragma: no cover - a strongly connected group always has a cycle through its members


def test_the_packages_have_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    "files",
    [
        # module level
        {"loadgen/__init__.py": "", "loadgen/a.py": "from loadgen.b import x\n", "loadgen/b.py": "import loadgen.a\n"},
        # one side dodges it with an import inside a function: still a cycle
        {
            "loadgen/__init__.py": "",
            "loadgen/a.py": "from loadgen import b\n",
            "loadgen/b.py": "def f():\n    from loadgen.a import y\n",
        },
        # relative imports, across packages
        {
            "loadgen/__init__.py": "",
            "loadgen/a.py": "from .b import x\n",
            "loadgen/b.py": "from servescope.c import z\n",
            "servescope/__init__.py": "",
            "servescope/c.py": "from loadgen.a import w\n",
        },
    ],
)
def test_a_cycle_is_found_and_named(tmp_path, files):
    write_tree(tmp_path, files)
    found = cycles(import_graph(tmp_path))
    assert len(found) == 1
    assert found[0][0] == found[0][-1] == "loadgen.a"


def test_a_package_init_importing_its_modules_is_no_cycle(tmp_path):
    write_tree(
        tmp_path,
        {
            "loadgen/__init__.py": "",
            "loadgen/workloads/__init__.py": "from loadgen.workloads.trace import Trace\n",
            "loadgen/workloads/trace.py": "from loadgen.workloads.base import Prompt\n",
            "loadgen/workloads/base.py": "X = 1\n",
        },
    )
    assert cycles(import_graph(tmp_path)) == []


def test_importing_a_name_from_a_package_depends_on_its_init(tmp_path):
    write_tree(
        tmp_path,
        {
            "loadgen/__init__.py": "",
            "loadgen/prompts.py": "from loadgen.workloads import load\n",
            "loadgen/workloads/__init__.py": "from loadgen.workloads.trace import load\n",
            "loadgen/workloads/trace.py": "from loadgen.prompts import Prompt\n",
        },
    )
    assert cycles(import_graph(tmp_path)) == [
        ["loadgen.prompts", "loadgen.workloads", "loadgen.workloads.trace", "loadgen.prompts"]
    ]


# The floors, bottom to top (docs/architecture.md draws them): a module may import its own floor and those below;
# an app (the top floor) imports another app only through the edges listed here, each with its reason.
FLOORS = {
    "servescope": 1,  # the root package's docstring only
    "servescope.contracts": 1,  # knobs, thresholds, series names, the run folder, routing policies
    "servescope.text": 1,  # words, printable strings, usage names
    "servescope.engines": 2,  # one adapter per engine kind, on the contracts
    "servescope.host": 3,  # processes, children, CPU priority, kernel stamps, host noise, bounded HTTP
    "servescope.prometheus": 3,  # its configuration and rules generated, its API, the run sampler
    "servescope.judgements": 4,  # SLOs, the binding resource, the knee's answer, statistics
    "servescope.workloads": 4,  # prompt sets, conversations, datasets, traces, arrivals' files
    "servescope.command": 5,
    "servescope.report": 5,
    "servescope.stack": 5,
    "loadgen": 5,
    "exporter": 5,
    "dashboards": 5,
    "bench": 6,  # the repository's benchmarks (not in the wheel) drive any app
}
APPS_FLOOR = 5
LISTED_EDGES = {
    # the one command: each verb's entry point
    ("servescope.command", "dashboards.build"): "the dashboards verb",
    ("servescope.command", "exporter.cli"): "the exporter verb",
    ("servescope.command", "loadgen.cli"): "the measuring verbs",
    ("servescope.command", "loadgen.verbs"): "their help, without importing Locust",
    ("servescope.command", "servescope.report.cli"): "the reading verbs",
    ("servescope.command", "servescope.stack.cli"): "the stack's verbs",
    # a run's terminal summary and compare's extra passes read the folder as the report does
    ("loadgen.summary", "servescope.report.run_slo"): "the SLO gap limits the report counts as it reads",
    ("loadgen.summary", "servescope.report.load"): "the run folder as the report loads it",
    ("loadgen.summary", "servescope.report.table"): "the reference table, the same rows",
    ("loadgen.trials", "servescope.report.load"): "compare judges its passes as the report will",
    ("loadgen.trials", "servescope.report.table"): "the same factors and verdict rule",
    # the load generator posts its phases to Grafana as annotations
    ("loadgen.annotations", "dashboards.annotations"): "the dashboards' annotation contract",
    # `make up` checks each engine as the exporter would read it
    ("servescope.stack.compose", "exporter.check"): "the exporter's check before the comparison",
    ("servescope.stack.native", "exporter.check"): "the exporter's check before the comparison",
    # tune writes its report with the report's tuning section
    ("servescope.stack.tune", "servescope.report.tuning"): "tune's report section",
}


def floor_of(module: str) -> tuple[str, int]:
    """The floor group a module belongs to (its longest listed prefix) and that floor's number."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        group = ".".join(parts[:i])
        if group in FLOORS:
            return group, FLOORS[group]
    raise AssertionError(f"{module} is on no floor: add its package to FLOORS")


def floor_breaches(graph: dict[str, set[str]]) -> list[str]:
    """Every import that runs up a floor, or across apps outside the listed edges."""
    found = []
    for module, imported in sorted(graph.items()):
        group, floor = floor_of(module)
        for target in sorted(imported):
            target_group, target_floor = floor_of(target)
            if target_floor > floor:
                found.append(f"{module} (floor {floor}) -> {target} (floor {target_floor}): runs up")
            elif floor == target_floor == APPS_FLOOR and group != target_group:
                if (module, target) not in LISTED_EDGES:
                    found.append(f"{module} -> {target}: one app into another, not a listed edge")
    return found


def test_every_import_stays_on_its_floor_or_goes_down():
    found = floor_breaches(import_graph())
    assert not found, "floor breaches:\n" + "\n".join(found)


def test_every_listed_edge_is_still_an_import():
    graph = import_graph()
    stale = [f"{a} -> {b}" for a, b in LISTED_EDGES if b not in graph.get(a, set())]
    assert not stale, "listed edges no module makes any more (drop them):\n" + "\n".join(stale)


@pytest.mark.parametrize(
    ("graph", "breach"),
    [
        ({"servescope.contracts.knobs": {"servescope.judgements.slo"}, "servescope.judgements.slo": set()}, "runs up"),
        ({"servescope.report.plan": {"loadgen.knee"}, "loadgen.knee": set()}, "not a listed edge"),
        ({"servescope.host.children": {"servescope.stack.native"}, "servescope.stack.native": set()}, "runs up"),
    ],
)
def test_the_floor_rule_catches_an_import_up_and_one_across_apps(graph, breach):
    (found,) = floor_breaches(graph)
    assert breach in found


def test_the_floor_rule_lets_an_app_import_down_and_a_floor_import_itself():
    graph = {
        "loadgen.knee": {"servescope.judgements.slo", "servescope.contracts.knobs", "loadgen.options"},
        "servescope.judgements.slo": {"servescope.judgements.stats", "servescope.contracts.knobs"},
        "servescope.host.cpu_priority": {"servescope.prometheus.exposition"},  # one floor, two groups
    }
    assert floor_breaches(graph) == []
