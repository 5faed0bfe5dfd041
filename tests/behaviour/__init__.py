"""Behaviour suites: tests named for what the code does across modules, not for one module (listed in tests/README.md)."""
