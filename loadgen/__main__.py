"""`python -m loadgen`: see loadgen/cli.py (and loadgen/quick.py for `quick`, which starts no Locust of its own)."""

import sys

if sys.argv[1:2] == ["quick"]:
    # quick only drives child processes: no Locust, no gevent monkey-patching under its signal handling.
    from loadgen.quick import main

    sys.exit(main(sys.argv[2:]))

from loadgen.cli import main  # noqa: E402, I001 - Locust first (gevent monkey-patching)

sys.exit(main())
