"""How the user called a command (`servescope knee` or `python -m loadgen knee`), for the usage lines it prints."""

from __future__ import annotations

# Set once by the `servescope` dispatcher before it hands over; None under `python -m <package>`.
_invoked_as: str | None = None


def invoked_as(prog: str) -> None:
    """The dispatcher's word for the command it is about to run (e.g. "servescope plan")."""
    global _invoked_as
    _invoked_as = prog


def prog(module_form: str) -> str:
    """The program name a parser shows: what the dispatcher said, else the `python -m` form it was started by."""
    return _invoked_as or module_form


def subcommand(word: str) -> None:
    """A command that hands on to a subcommand of its own (`servescope exporter check`): its word follows."""
    global _invoked_as
    if _invoked_as:
        _invoked_as = f"{_invoked_as} {word}"
