"""`python -m stack` from a checkout keeps working: stack now lives in servescope.stack (`servescope stack ...` once installed)."""

import runpy

runpy.run_module("servescope.stack", run_name="__main__", alter_sys=True)
