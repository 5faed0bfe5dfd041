"""Entry point: `python -m servescope.stack up|down|status` (`servescope up|down|status`)."""

import sys

from servescope.stack.cli import main

sys.exit(main())
