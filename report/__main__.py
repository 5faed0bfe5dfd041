"""Entry point for `python -m report`."""

import sys

from report.cli import main

sys.exit(main())
