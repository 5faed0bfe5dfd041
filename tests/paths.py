"""Where the checkout and the recorded fixtures are, for every test file wherever it sits in tests/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
RUNS = FIXTURES / "runs"
