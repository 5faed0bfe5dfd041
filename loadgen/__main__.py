"""`python -m loadgen`: see loadgen/cli.py."""

from loadgen.cli import main  # noqa: I001 - Locust first (gevent monkey-patching)

import sys

sys.exit(main())
