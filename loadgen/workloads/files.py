"""A workload's file: a set shipped in loadgen/prompts/ by name, or a path; JSON arrays read whole, JSONL line by line.

Every problem is one line naming the file and the line (or the array index) it is about.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loadgen.prompts import DATA_DIR, PromptSetError


def resolve(kind: str, arg: str, default: str) -> tuple[Path, str]:
    """(path, set name): `arg` empty -> the kind's default shipped set; a shipped set's name; else a file path."""
    name = arg or default
    if "/" not in name and "." not in name:
        shipped = sorted(DATA_DIR.glob(f"{name}.json*"))
        if shipped:
            return shipped[0], name
    path = Path(name).expanduser()
    if not path.is_file():
        raise PromptSetError(f"{kind}:{arg}: no set of that name in {DATA_DIR} and no such file")
    return path, path.stem


def records(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, parsed item) per record: `FILE:LINE` of a JSONL file, `FILE[INDEX]` of a JSON array."""
    try:
        with open(path, encoding="utf-8") as fh:
            head = fh.read(4096).lstrip()
            fh.seek(0)
            if head.startswith("["):
                try:
                    items = json.load(fh)
                except json.JSONDecodeError as exc:
                    raise PromptSetError(
                        f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
                    ) from None
                for index, item in enumerate(items):
                    yield f"{path}[{index}]", item
                return
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise PromptSetError(f"{path}:{lineno}: not JSON ({exc.msg} at column {exc.colno})") from None
                yield f"{path}:{lineno}", item
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptSetError(f"{path}: cannot read ({exc})") from None
    except RecursionError:
        raise PromptSetError(f"{path}: nested too deeply to be a workload file") from None
