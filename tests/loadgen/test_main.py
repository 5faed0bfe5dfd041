"""`python -m loadgen`'s entry: what start-up built is frozen out of the garbage collector's walks, collection still on."""

from __future__ import annotations

from tests.harness import run_python


def test_the_entry_freezes_what_its_imports_built_and_leaves_collection_on():
    probe = (
        "import gc, runpy, sys\n"
        "import loadgen.cli\n"
        "loadgen.cli.main = lambda: print(gc.get_freeze_count(), gc.isenabled()) or 0\n"
        "sys.argv = ['loadgen', 'burst']\n"
        "runpy.run_module('loadgen', run_name='__main__')\n"
    )
    out = run_python("-c", probe, timeout=60)
    assert out.returncode == 0, out.stderr
    frozen, enabled = out.stdout.split()
    assert int(frozen) > 10_000  # Locust's and gevent's objects among them
    assert enabled == "True"
