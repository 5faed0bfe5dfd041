"""Every module says in its docstring what it is for, and every dataclass what it is.

A dataclass without a docstring gets one made at import: Python 3.11's dataclasses call inspect.signature on the
class for it, in every process that imports the module (a load generator's start-up imports 80 of them).
"""

from __future__ import annotations

import ast

import pytest

from tests.behaviour.test_structure_imports import module_files


def dataclass_decorated(node: ast.ClassDef) -> bool:
    return any(ast.unparse(d).split("(")[0] in ("dataclass", "dataclasses.dataclass") for d in node.decorator_list)


FILES = module_files()


@pytest.mark.parametrize("module", sorted(FILES))
def test_a_module_says_what_it_is_for_and_its_dataclasses_what_they_are(module):
    tree = ast.parse(FILES[module].read_text())
    assert ast.get_docstring(tree), f"{module}: no module docstring"
    undocumented = [
        f"{node.name} (line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and dataclass_decorated(node) and ast.get_docstring(node) is None
    ]
    assert not undocumented, f"{module}: dataclasses without a docstring: {', '.join(undocumented)}"
