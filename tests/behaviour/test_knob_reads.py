"""Every knob the code reads is in the knob table (servescope/contracts/knob_defaults.py): environment and knobs.get() reads."""

from __future__ import annotations

import ast

from servescope.contracts import knob_defaults, knobs

REPO = knobs.REPO_ROOT
PACKAGES = ("servescope", "loadgen", "report", "exporter", "stack", "bench", "dashboards")
# Environment that is not a servescope knob: other programs' own variables, passed through as they are.
NOT_KNOBS = {
    "CMAKE_ARGS": "llama.cpp's build reads it; the stack adds to what the user set",
    "OPENBLAS_NUM_THREADS": "OpenBLAS's own; the load generator sets 1 where the user set nothing (loadgen/__main__.py)",
    "PIP_FIND_LINKS": "pip's own; the vLLM venv build keeps the user's wheel mirrors",
    "PYTHONPATH": "Python's own; the painter process inherits the caller's import path",
}


# servescope/contracts/knobs.py's readers, each taking the knob's name first.
READERS = ("get", "get_int", "get_int_in", "get_port", "get_choice", "get_positive", "path")
# A knob table read once at an entry (servescope/contracts/settings.KnobTable): its readers and its ["NAME"], on the
# names the code gives a table (knobs, table, knob; self.knobs in the settings module).
TABLE_READERS = ("text", "int", "int_in", "port", "choice", "positive", "path", "switch")
TABLES = ("knobs", "table", "knob")


def _is_table(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id in TABLES) or (
        isinstance(node, ast.Attribute) and node.attr in TABLES
    )


def _literal(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def reads(tree: ast.AST) -> list[tuple[str, int]]:
    """(name, line) of every read by literal name: os.environ.get/[...]/in, os.getenv, knobs.get/get_int/get_positive/path."""
    out = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Call) and node.args:
            fn = node.func
            if isinstance(fn, ast.Attribute) and fn.attr in ("get", "pop", "setdefault") and _is_environ(fn.value):
                name = _literal(node.args[0])
            elif isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and fn.value.id == "knobs":
                name = _literal(node.args[0]) if fn.attr in READERS + TABLE_READERS else None
            elif isinstance(fn, ast.Attribute) and fn.attr in TABLE_READERS and _is_table(fn.value):
                name = _literal(node.args[0])
            elif isinstance(fn, ast.Attribute) and fn.attr == "getenv":
                name = _literal(node.args[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value):
            name = _literal(node.slice)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_table(node.value):
            name = _literal(node.slice)
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.ops[0], (ast.In, ast.NotIn))
            and _is_environ(node.comparators[0])
        ):
            name = _literal(node.left)
        if name:
            out.append((name, node.lineno))
    return out


def unlisted(table: set[str]) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for name, line in reads(ast.parse(path.read_text())):
                if name not in table and name not in NOT_KNOBS:
                    found.append(f"{path.relative_to(REPO)}:{line}: {name}")
    return found


def table() -> set[str]:
    return set(knob_defaults.DEFAULTS)


def test_every_knob_read_is_in_the_table():
    assert unlisted(table()) == [], "read but not in servescope/contracts/knob_defaults.py: add it there with its help"


def test_a_knob_left_out_of_the_table_is_found():
    names = unlisted(table() - {"VLLM_TORCH_INDEX", "GRAFANA_TOKEN"})
    assert any(n.endswith(": VLLM_TORCH_INDEX") for n in names)
    assert any(n.startswith("dashboards/annotations.py") and n.endswith(": GRAFANA_TOKEN") for n in names)


def all_read_names() -> set[str]:
    return {
        name
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        for name, _ in reads(ast.parse(path.read_text()))
    }


def test_every_engine_adapters_knob_is_in_the_table():
    """The adapters name their knobs in attributes (url_env, port_env, ...) that targets and the exporter read by
    variable, which the literal scan above cannot see."""
    from servescope import engines

    named = {
        (kind.name, attr, value)
        for kind in engines.ENGINES.values()
        for attr in ("url_env", "port_env", "proxy_port_env", "api_key_env")
        if isinstance(value := getattr(kind, attr, None), str) and value
    }
    assert {attr for _, attr, _ in named} >= {"url_env", "port_env"}  # the attributes are still there to read
    assert [n for n in named if n[2] not in table()] == []


def test_every_exception_is_still_read():
    """An entry no module reads any more is a stale excuse waiting to hide a new knob of that name."""
    assert set(NOT_KNOBS) - all_read_names() == set()


def test_no_exception_is_also_a_knob():
    """A name in both would be documented as a knob and excused as not one: one of them is wrong."""
    assert set(NOT_KNOBS) & table() == set()


def test_every_read_form_is_seen():
    code = (
        'import os\nos.environ.get("A")\nos.getenv("B")\nos.environ["C"]\n"D" in os.environ\n'
        'knobs.get("E", "")\nknobs.get_int("F")\nos.environ["G"] = "x"\nknobs.get_port("H")\n'
    )
    assert [n for n, _ in reads(ast.parse(code))] == ["A", "B", "C", "D", "E", "F", "H"]


def test_any_text_in_a_typed_knob_is_its_value_within_bounds_or_one_line_naming_it(monkeypatch):
    """Property (fixed seed): the typed readers (knobs.get_int_in, get_port, get_choice, path) give a value within
    the knob's bounds, or a KnobError of one line that starts with the knob's name; never another exception."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    texts = st.sampled_from(["8000", "0", "65536", "-1", " 80 ", "1e3", "0x50", "٣", "", "on", "/tmp/x"]) | st.text(
        st.characters(exclude_characters="\x00"), max_size=12
    )

    @settings(
        derandomize=True, max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(text=texts)
    def read(text):
        monkeypatch.setenv("ROUTER_PORT", text)
        monkeypatch.setenv("REPLICAS_PIN", text)
        monkeypatch.setenv("SERVESCOPE_STATE", text)
        for key, reader, check in (
            ("ROUTER_PORT", knobs.get_port, lambda v: 1 <= v <= 65535),
            ("REPLICAS_PIN", lambda k: knobs.get_choice(k, ("0", "1")), lambda v: v in ("0", "1")),
            ("SERVESCOPE_STATE", knobs.path, lambda v: "\n" not in str(v) and str(v).strip()),
        ):
            try:
                value = reader(key)
            except knobs.KnobError as exc:
                assert str(exc).startswith(f"{key}=") and "\n" not in str(exc), exc
                continue
            assert check(value), (key, text, value)

    read()


def test_every_load_generator_options_knob_is_in_the_table():
    """An option names its knob in an attribute (Option(knob=...)), which the literal scan above cannot see."""
    from loadgen import options

    named = {option.knob for option in options.OPTIONS if option.knob}
    assert {"LOADGEN_ENGINE", "MAX_TOKENS"} <= named
    assert named - table() == set()
