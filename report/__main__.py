"""`python -m report` from a checkout keeps working: report now lives in servescope.report (`servescope report ...` once installed)."""

import runpy

runpy.run_module("servescope.report", run_name="__main__", alter_sys=True)
