"""`python -m exporter`: run the servescope exporter (see exporter.cli)."""

import sys

from exporter.cli import main

sys.exit(main())
