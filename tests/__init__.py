"""servescope's test suite (fast by default; `-m e2e` for the real-engine suite)."""
