"""Entry point: `python -m stack up|down|status`."""

import sys

from stack.cli import main

sys.exit(main())
