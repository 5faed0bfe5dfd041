"""`python -m loadgen`'s entry: what start-up built is frozen out of the garbage collector's walks, collection still on."""

from __future__ import annotations

import os

from tests.harness import in_a_fresh_interpreter


def test_the_entry_freezes_what_its_imports_built_and_leaves_collection_on():
    probe = (
        "import gc, runpy, sys\n"
        "import loadgen.cli\n"
        "loadgen.cli.main = lambda: print(gc.get_freeze_count(), gc.isenabled()) or 0\n"
        "sys.argv = ['loadgen', 'burst']\n"
        "runpy.run_module('loadgen', run_name='__main__')\n"
    )
    frozen, enabled = in_a_fresh_interpreter(probe).split()
    assert int(frozen) > 10_000  # Locust's and gevent's objects among them
    assert enabled == "True"


def test_the_entry_keeps_numpys_blas_to_one_thread_unless_the_user_chose():
    # OpenBLAS starts a spinning thread per core when numpy loads (a long run's summary computes on arrays): on a
    # 2-core host beside an engine that was a tenth of a short run's CPU, for no linear algebra.
    probe = (
        "import os, runpy, sys\n"
        "import loadgen.cli\n"
        "loadgen.cli.main = lambda: print(os.environ.get('OPENBLAS_NUM_THREADS')) or 0\n"
        "sys.argv = ['loadgen', 'burst']\n"
        "runpy.run_module('loadgen', run_name='__main__')\n"
    )
    env_without = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    assert in_a_fresh_interpreter(probe, env=env_without).split() == ["1"]
    assert in_a_fresh_interpreter(probe, env={**env_without, "OPENBLAS_NUM_THREADS": "4"}).split() == ["4"]
