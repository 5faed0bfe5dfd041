"""Run every benchmark module in bench/ that defines main(); each prints its own table."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time

import bench


def main(argv: list[str] | None = None) -> int:
    wanted = set(argv if argv is not None else sys.argv[1:])
    failures = 0
    for module_info in sorted(pkgutil.iter_modules(bench.__path__), key=lambda m: m.name):
        if module_info.name.startswith("_") or (wanted and module_info.name not in wanted):
            continue
        module = importlib.import_module(f"bench.{module_info.name}")
        if not hasattr(module, "main"):
            continue
        print(f"== bench {module_info.name}", flush=True)
        started = time.monotonic()
        rc = module.main([])
        print(
            f"== bench {module_info.name}: {'ok' if not rc else 'FAILED'} in {time.monotonic() - started:.1f}s",
            flush=True,
        )
        failures += bool(rc)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
