"""The engine kinds' registration lines: each names an adapter module whose EngineKind carries its knobs."""

from __future__ import annotations

import pytest

from servescope import engines
from servescope.contracts import engine_kinds, knob_defaults


def test_every_registration_line_names_an_adapter_of_that_kind_in_the_registry_in_its_order():
    assert list(engines.ENGINES) == [entry.name for entry in engine_kinds.REGISTERED]
    for entry in engine_kinds.REGISTERED:
        adapter = engines.kind(entry.name)
        assert adapter.name == entry.name
        assert (adapter.port_env, adapter.url_env, adapter.api_key_env) == (
            f"{entry.knobs}_PORT",
            f"{entry.knobs}_URL",
            f"{entry.knobs}_API_KEY" if entry.api_key else None,
        )


def test_the_knob_table_holds_each_registered_engines_port_url_and_key_rows():
    for entry in engine_kinds.REGISTERED:
        assert knob_defaults.DEFAULTS[entry.port_env] == entry.port
        assert knob_defaults.DEFAULTS[entry.url_env] == ""
        assert (entry.api_key_env in knob_defaults.DEFAULTS) is entry.api_key
    assert "OLLAMA_API_KEY" not in knob_defaults.DEFAULTS  # Ollama has no --api-key


def test_a_kind_without_a_registration_line_is_named_in_the_error():
    with pytest.raises(KeyError, match="'triton' has no line"):
        engine_kinds.registration("triton")
