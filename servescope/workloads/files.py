"""A workload's file: a set shipped in servescope/workloads/prompts/ by name, or a path; JSON arrays read whole, JSONL line by line.

Every problem is one line naming the file and the line (or the array index) it is about. What a file may cost is
bounded before it is paid: a line (a prompt, a conversation, a trace row) is read up to WORKLOAD_MAX_LINE_MB and no
further, a JSON array (read whole) only when the file is within WORKLOAD_MAX_JSON_MB, and a record nested deeper than
MAX_JSON_DEPTH is refused (Python's JSON reader recurses; so do str() and json.dumps of what it returns). A JSONL file
itself may be any size: it is streamed, and each kind bounds what it keeps (prompts, words, requests).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from servescope.workloads.base import DATA_DIR, PromptSetError

MAX_JSON_DEPTH = 64  # a conversation is 3 deep (record, messages, message); Mooncake's rows 2
_READ_CHUNK = 1 << 16


def limit_mb(knob: str) -> float:
    """A workload limit's knob (.env.example) in megabytes; a bad one is one line."""
    from servescope.contracts import knobs

    try:
        return knobs.get_positive(knob, "megabytes")
    except ValueError as exc:
        raise PromptSetError(str(exc)) from None


def expand(text: str, what: str) -> Path:
    """A path as the user wrote it, `~` and `~user` expanded; a home that cannot be found is one line."""
    try:
        return Path(text).expanduser()
    except (RuntimeError, KeyError):  # Path.expanduser: "Could not determine home directory."
        raise PromptSetError(f"{what}: {text!r}: no such user's home directory to expand ~ in") from None


def resolve(kind: str, arg: str, default: str) -> tuple[Path, str]:
    """(path, set name): `arg` empty -> the kind's default shipped set; a shipped set's name; else a file path."""
    name = arg or default
    if "/" not in name and "." not in name:
        shipped = sorted(DATA_DIR.glob(f"{name}.json*"))
        if shipped:
            return shipped[0], name
    path = expand(name, f"{kind}:{arg}")
    if not path.is_file():
        raise PromptSetError(f"{kind}:{arg}: no set of that name in {DATA_DIR} and no such file")
    return path, path.stem


def lines(path: Path, fh: TextIO) -> Iterator[tuple[int, str]]:
    """(line number, line) of an open text file, each read up to WORKLOAD_MAX_LINE_MB and no further."""
    knob = "WORKLOAD_MAX_LINE_MB"
    limit_value = limit_mb(knob)
    limit = max(1, int(limit_value * (1 << 20)))
    lineno = 0
    while True:
        line = fh.readline(limit + 1)
        if not line:
            return
        lineno += 1
        if len(line) > limit and not line.endswith("\n"):
            raise PromptSetError(
                f"{path}:{lineno}: a line longer than {knob}={limit_value:g} MB: not a workload file, or raise {knob}"
            )
        yield lineno, line


def loads(text: str, where: str) -> Any:
    """One JSON value, nested at most MAX_JSON_DEPTH deep; else one line saying where."""
    try:
        value = json.loads(text)
    except RecursionError:
        value = None
        deep = True
    else:
        deep = _deeper_than(value, MAX_JSON_DEPTH)
    if deep:
        raise PromptSetError(f"{where}: nested more than {MAX_JSON_DEPTH} deep: not a workload record")
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether lists and objects nest past `limit` (iterative: a deep value must not cost the stack here)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def records(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, parsed item) per record: `FILE:LINE` of a JSONL file, `FILE[INDEX]` of a JSON array."""
    try:
        with open(path, encoding="utf-8") as fh:
            head = fh.read(4096).lstrip()
            fh.seek(0)
            if head.startswith("["):
                yield from _array(path, fh)
                return
            for lineno, line in lines(path, fh):
                if not line.strip():
                    continue
                try:
                    item = loads(line, f"{path}:{lineno}")
                except json.JSONDecodeError as exc:
                    raise PromptSetError(f"{path}:{lineno}: not JSON ({exc.msg} at column {exc.colno})") from None
                yield f"{path}:{lineno}", item
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptSetError(f"{path}: cannot read ({exc})") from None


def _array(path: Path, fh: TextIO) -> Iterator[tuple[str, Any]]:
    """A JSON array, read whole: only a file within WORKLOAD_MAX_JSON_MB (a size the machine can hold parsed)."""
    knob = "WORKLOAD_MAX_JSON_MB"
    limit_value = limit_mb(knob)
    limit = int(limit_value * (1 << 20))
    chunks, read = [], 0
    while chunk := fh.read(_READ_CHUNK):  # counted as read: a file's stated size may not be what it holds
        read += len(chunk)
        if read > limit:
            raise PromptSetError(
                f"{path}: a JSON array of more than {knob}={limit_value:g} MB (it is read whole): "
                f"write it as JSONL, one record a line, or raise {knob}"
            )
        chunks.append(chunk)
    try:
        items = loads("".join(chunks), str(path))
    except json.JSONDecodeError as exc:
        raise PromptSetError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    del chunks
    if not isinstance(items, list):
        raise PromptSetError(f"{path}: expected a JSON array of records")
    for index, item in enumerate(items):
        yield f"{path}[{index}]", item
