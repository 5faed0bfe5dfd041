"""The native stack reads each engine's facts from its adapter (issue 43 item 4c): no engine named in native.py."""

from __future__ import annotations

import re
from pathlib import Path

from servescope import engines
from servescope.stack import native


def test_the_native_stack_names_no_engine_kind():
    text = Path(native.__file__).read_text()
    names = "|".join(re.escape(name) for name in engines.ENGINES)
    assert not re.findall(rf"\b({names})\b", text, re.IGNORECASE)
    constants = "|".join(n for n in dir(engines) if isinstance(getattr(engines, n), engines.EngineKind))
    assert not re.findall(rf"\b({constants})\b", text)  # no adapter constant either


def test_every_engine_it_runs_names_a_module_with_the_hooks_it_calls():
    assert native.NATIVE and native.STARTED
    for name, kind in native.NATIVE.items():
        module = native.hooks(name)
        needed = ["prepare", "launch_command", "launch_env"] if not kind.native.found else ["join"]
        if kind.native.found and kind.proxy_port_env:
            needed.append("exporter_args")
        missing = [hook for hook in needed if not callable(getattr(module, hook, None))]
        assert not missing, (name, kind.native.module, missing)
