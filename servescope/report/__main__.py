"""Entry point for `python -m servescope.report` (`servescope report`)."""

import os
import sys

from servescope.report.cli import main

code = main()
if code == 130:
    # Interrupted: the one line is said and the painter stopped. Leave now, before interpreter shutdown: a DuckDB
    # query still ending on a pool thread can put the default SIGINT handler back and pass the signal on, which
    # killed the process by SIGINT after its line (exit -2 where 130 was returned).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)
sys.exit(code)
