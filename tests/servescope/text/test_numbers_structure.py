"""servescope/text/numbers.py is the one home of number formatters: no other module defines one (a whole-tree rule).

The rule, read from each module's syntax tree (every package of the import rule's PACKAGES, bench too): a function
(a `def` at any depth, or a `lambda`) outside servescope/text/numbers.py is a number formatter when

- its name says so: `pct`, `percent`, `ms`, `num`/`num3`, `n`, `s`, `fmt…`, or `format_` + a number's word
  (`format_pct`, `format_seconds`, ...), leading underscores aside (`format_table`, `format_budget` lay out rows:
  not flagged); or
- its shape says so: it only branches, assigns and returns (no loop, `with` or `try`), and every value it returns is
  text (an f-string, a choice `a if c else b` or a sum `a + b` of such) made of short literal pieces (a unit, a
  missing-value word: at most 12 characters each), bare names (a unit, a sign) and number fields, at least one:
  a field on an expression of names and literals (`float`, `int`, `abs` and `round` the only calls; no attribute or
  item read) with a number's format spec (a precision, a separator or a number type: `{v:.1%}`, `{v:g}`,
  `{v:.{digits}f}`, `{s % 60:02d}`) or arithmetic (`{v * 1000:.1f}`, `{seconds // 60}`). A sentence with a number in
  it, a method describing its object (`self.x`), a checksum read in a loop, text built from calls are not formatters.

Such a function is a second definition of a format: call servescope/text/numbers.py instead (add the form there,
parameterised, when it is new).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.paths import REPO

PACKAGES = ("servescope", "loadgen", "exporter", "bench", "dashboards")  # as the import rule's (tests/behaviour)
HOME = "servescope/text/numbers.py"
NUMBER_WORDS = "pct|percent|ms|millis|milliseconds|seconds|duration|num|number|rate|ratio|bytes|size|count"
FORMATTER_NAME = re.compile(rf"^_*(pct|percent|ms|num\d*|n|s|fmt\w*|format_({NUMBER_WORDS})\w*)$")
CALLS = frozenset({"float", "int", "abs", "round"})  # what a formatted field may call on its number
LITERAL_CHARS = 12  # a unit or a missing-value word; a longer literal piece makes the text a sentence
NUMBER_SPEC = re.compile(r"[.,_]|[bdeEfFgGnoxX%]$")  # a precision, a separator or a number type ends the spec
ARITHMETIC = (ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
STATEMENTS = (ast.If, ast.Return, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Pass)


def _plain(value: ast.AST) -> bool:
    """An expression of names and literals: no attribute or item read, no call but float, int, abs and round."""
    for part in ast.walk(value):
        if isinstance(part, (ast.Attribute, ast.Subscript)):
            return False
        if isinstance(part, ast.Call) and not (isinstance(part.func, ast.Name) and part.func.id in CALLS):
            return False
    return True


def _spec(field: ast.FormattedValue) -> str:
    """A field's format spec as written, a nested field as {}: ".{}f", "02d", "<{}"."""
    if field.format_spec is None:
        return ""
    parts = field.format_spec.values if isinstance(field.format_spec, ast.JoinedStr) else [field.format_spec]
    return "".join(p.value if isinstance(p, ast.Constant) else "{}" for p in parts)


def _number_field(node: ast.AST) -> bool:
    """A field that formats a number: a number's spec (a precision, a separator or a number type: `.1%`, `g`, `02d`,
    `,.0f`), or arithmetic (`{seconds // 60}`; `+` aside: it joins text as well)."""
    if not isinstance(node, ast.FormattedValue) or node.conversion != -1 or not _plain(node.value):
        return False
    value = node.value
    arithmetic = isinstance(value, ast.BinOp) and isinstance(value.op, ARITHMETIC) or isinstance(value, ast.UnaryOp)
    return bool(NUMBER_SPEC.search(_spec(node))) or arithmetic


def _field(node: ast.FormattedValue) -> bool:
    """A field a number's text may hold: a number field, or a bare name (a unit, a sign chosen above)."""
    return _number_field(node) or (isinstance(node.value, ast.Name) and node.conversion == -1 and not _spec(node))


def _short(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) <= LITERAL_CHARS


def _number_text(node: ast.AST) -> bool:
    """A number as text: a short literal, an f-string of fields and short literals, or a choice or sum of those."""
    if isinstance(node, ast.IfExp):
        return _number_text(node.body) and _number_text(node.orelse)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _number_text(node.left) and _number_text(node.right)
    if isinstance(node, ast.JoinedStr):
        return all(_field(v) if isinstance(v, ast.FormattedValue) else _short(v) for v in node.values)
    return _short(node)


def _formats(node: ast.AST) -> bool:
    return any(_number_field(part) for part in ast.walk(node))


def _shaped_like_one(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> bool:
    if isinstance(fn, ast.Lambda):
        return _number_text(fn.body) and _formats(fn.body)
    body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
    statements = [s for node in body for s in ast.walk(node) if isinstance(s, ast.stmt)]
    if not all(isinstance(s, STATEMENTS) for s in statements):
        return False
    returned = [s.value for s in statements if isinstance(s, ast.Return)]
    return (
        bool(returned)
        and all(v is not None and _number_text(v) for v in returned)
        and any(_formats(v) for v in returned if v is not None)
    )


def formatters(path: Path, shown_as: str) -> list[str]:
    """`file:line: name (why)` for each function of a module the rule calls a number formatter."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            why = "name" if FORMATTER_NAME.match(node.name) else "shape" if _shaped_like_one(node) else None
            if why:
                found.append(f"{shown_as}:{node.lineno}: {node.name} (by its {why})")
        elif isinstance(node, ast.Lambda) and _shaped_like_one(node):
            found.append(f"{shown_as}:{node.lineno}: lambda (by its shape)")
    return found


def formatters_outside_home(root: Path = REPO) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            shown_as = path.relative_to(root).as_posix()
            if shown_as != HOME:
                found.extend(formatters(path, shown_as))
    return found


def test_no_number_formatter_is_defined_outside_the_numbers_module():
    found = formatters_outside_home()
    assert not found, "number formatters outside " + HOME + " (call it instead):\n" + "\n".join(found)


def test_the_numbers_module_is_where_the_rule_finds_its_formatters():
    assert formatters(REPO / HOME, HOME), "the rule finds nothing in the numbers module: it has stopped seeing any"


@pytest.mark.parametrize(
    "source",
    [
        'def _pct(v):\n    return "n/a" if v is None else f"{v:.1%}"\n',
        "def _num(value, form):\n    return form.format(value)\n",  # by its name, whatever its body
        "def fmt_latency(x):\n    return str(x)\n",
        'def shown(value, digits=4):\n    return "not measured" if value is None else f"{value:.{digits}f}"\n',
        'def _users(n):\n    return f"{n:g} user" + ("" if n == 1 else "s")\n',
        "def elapsed(seconds):\n    seconds = int(seconds)\n"
        '    return f"{seconds}s" if seconds < 9 else f"{seconds // 60}m{seconds % 60:02d}s"\n',
        "def outer(unit):\n    def tick(v):\n"
        '        if v is None:\n            return "-"\n        return f"{v * 100:.3g}%"\n'
        "    return tick\n",
        'rows = sorted(values, key=lambda v: f"{abs(v):.2f} ms")\n',
        'def ci(lo, hi, unit):\n    return f" [95% CI {lo:.2f}{unit}-{hi:.2f}{unit}]" if lo is not None else ""\n',
    ],
)
def test_the_rule_catches_a_formatter_by_its_name_or_its_shape(tmp_path, source):
    path = tmp_path / "module.py"
    path.write_text(source)
    assert len(formatters(path, "module.py")) == 1


@pytest.mark.parametrize(
    "source",
    [
        'def format_table(rows):\n    return "\\n".join(rows)\n',
        'def _oversized(kv):\n    return f"; the KV pool peaked at {kv:.1%}, oversized for this load"\n',
        'class Slo:\n    def text(self):\n        return f"{self.limit:.2f}s"\n',
        "def _checksum(fh):\n    crc = 0\n    while block := fh.read(1):\n        crc += len(block)\n"
        '    return f"{crc:08x}"\n',
        # it reads its rows: not a number's text
        'def summary(rows):\n    return f"{len(rows)} rows, {_ok(rows):.0%} ok"\n',
    ],
)
def test_the_rule_leaves_other_functions_alone(tmp_path, source):
    path = tmp_path / "module.py"
    path.write_text(source)
    assert formatters(path, "module.py") == []
