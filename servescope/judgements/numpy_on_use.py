"""numpy, imported when first used: a module that computes on arrays only for long runs leaves it unloaded in a short one."""

from __future__ import annotations

import importlib
import types


class _OnUse(types.ModuleType):
    """Stands for numpy where a module imports it as `np`: the first name read from it imports numpy and takes numpy's
    names (later reads are plain lookups); a name numpy itself loads when asked (numpy.random) is asked of numpy.
    Why: numpy's import is 0.05 CPU s, a tenth of a 4-request run (`quick`, the knee and `tune` make them by the dozen),
    whose end-of-run summary makes no array (its few values are sorted as Python floats: stats.SORTED_IN_PYTHON)."""

    def __getattr__(self, name: str):
        numpy = importlib.import_module("numpy")
        self.__dict__.update((key, value) for key, value in vars(numpy).items() if not key.startswith("__"))
        return getattr(numpy, name)


numpy = _OnUse("numpy", "numpy, imported when a name is first read from it (servescope/judgements/numpy_on_use.py)")
