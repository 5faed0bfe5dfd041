"""The end-to-end suites run in a fixed order: the native stack first (it compiles llama.cpp once into the cache's
wheelhouse), the Compose stack after it (its llama.cpp image installs that wheel)."""

from __future__ import annotations


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.get_closest_marker("compose") is not None)
