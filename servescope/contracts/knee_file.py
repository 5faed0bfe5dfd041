"""knee.json read through a schema: the fields its readers use, checked, or one line saying which is wrong.

loadgen/knee.py writes the file; a reader trusts only what passed here. The file must be a regular file (a FIFO in its
place would block a reader for ever) of at most MAX_BYTES, JSON (a nesting too deep for the parser is refused, not
a RecursionError), and its fields of the kinds below; fields not named here are left as they are, unread.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from servescope.contracts.runcontract import KNEE, KNEE_CONCURRENCY, KNEE_RATE

MAX_BYTES = 32 * 1024 * 1024  # a knee of 16 probes is about 20 kB; anything near this is not one


class KneeFileError(ValueError):
    """A knee.json that cannot be used: one line, starting with its path."""


def read(folder: Path) -> dict[str, Any]:
    """FOLDER/knee.json, checked: FileNotFoundError where there is none, KneeFileError where it is not a knee's."""
    path = Path(folder) / KNEE
    summary = _json(path)
    _check(summary, path)
    return summary


def _json(path: Path) -> Any:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once this way, and is refused below
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise KneeFileError(f"{path}: unreadable ({exc.strerror or exc})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise KneeFileError(f"{path}: not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise KneeFileError(f"{path}: unreadable ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise KneeFileError(f"{path}: more than {MAX_BYTES // (1024 * 1024)} MB: not a knee summary")
    try:
        return json.loads(data)
    except RecursionError:
        raise KneeFileError(f"{path}: JSON nested too deep to be a knee summary") from None
    except ValueError as exc:  # UnicodeDecodeError too, and an integer of more digits than Python converts
        raise KneeFileError(f"{path}: not JSON ({str(exc).splitlines()[0][:80]})") from None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check(summary: Any, path: Path) -> None:
    def bad(where: str, expected: str, value: Any) -> KneeFileError:
        shown = (
            json.dumps(value)[:60] if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
        )
        return KneeFileError(f"{path}: {where}: expected {expected}, got {shown}")

    if not isinstance(summary, dict):
        raise KneeFileError(f"{path}: not a knee summary (a JSON object with its probes)")
    if not isinstance(summary.get("probes"), list):
        raise KneeFileError(f"{path}: not a knee summary (no probes)")
    if summary.get("over") not in (KNEE_CONCURRENCY, KNEE_RATE):
        raise bad("over", f"{KNEE_CONCURRENCY!r} or {KNEE_RATE!r}", summary.get("over"))
    for key in ("engine", "instance", "spec"):
        if summary.get(key) is not None and not isinstance(summary[key], str):
            raise bad(key, "a string", summary[key])
    objective = summary.get("objective")
    if objective is not None and not (isinstance(objective, str) or (_number(objective) and 0 < objective <= 1)):
        raise bad("objective", "a share above 0 and at most 1", objective)
    knee = summary.get("knee")
    if knee is not None and not (_number(knee) and knee > 0):
        raise bad("knee", "a load above 0, or null", knee)
    for n, probe in enumerate(summary["probes"]):
        where = f"probes[{n}]"
        if not isinstance(probe, dict):
            raise bad(where, "an object", probe)
        if not isinstance(probe.get("phase"), str) or not probe["phase"]:
            raise bad(f"{where}.phase", "a phase name", probe.get("phase"))
        if not (_number(probe.get("level")) and probe["level"] > 0):
            raise bad(f"{where}.level", "a load above 0", probe.get("level"))
        if not isinstance(probe.get("trusted", False), bool):
            raise bad(f"{where}.trusted", "true or false", probe.get("trusted"))
