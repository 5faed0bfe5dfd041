"""`python -m loadgen`: see loadgen/cli.py (and loadgen/quick.py for `quick`, which starts no Locust of its own)."""

import gc
import os
import sys

if sys.argv[1:2] == ["quick"]:
    # quick only drives child processes: no Locust, no gevent monkey-patching under its signal handling.
    from loadgen.quick import main

    sys.exit(main(sys.argv[2:]))

# What the imports build (Locust, gevent, the modules' functions and tables) lives as long as the process: no
# collection while it is built, and frozen after, so no later one walks it again (a collection's pause inside a run
# grows with the objects it walks; the imports' own collections were a tenth of a short run's CPU).
gc.disable()
# numpy (a long run's end-of-run summary computes on arrays with it) starts OpenBLAS's thread pool, one thread per
# core that spins after each call: a tenth of a short run's CPU, taken from the engine beside it. The load generator
# does no linear algebra worth a second thread; a value the user set stands.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
from loadgen import startup  # noqa: E402 - imports nothing of gevent's or Locust's

startup.without_the_web_ui()
# One plugin scan; no TLS context and no ZeroMQ until used.
with startup.entry_points_scanned_once(), startup.certificates_loaded_on_use(), startup.rpc_loaded_on_use():
    from loadgen.cli import main  # noqa: E402, I001 - Locust first (gevent monkey-patching)
startup.stop_without_naming_the_caller()

gc.freeze()
gc.enable()
sys.exit(main())
