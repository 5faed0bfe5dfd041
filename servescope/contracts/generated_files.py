"""Committed generated files: write them, or say which are stale (the `--write` / `--check` of each generator)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path


def write_or_check(files: Mapping[Path, str], *, check: bool, command: str, root: Path, what: str) -> int:
    """--check: 1 and one line per stale file naming `command`, else 0; otherwise write the files that differ."""
    if check:
        stale = [path for path, text in files.items() if not path.exists() or path.read_text() != text]
        for path in stale:
            print(f"{path.relative_to(root)} is stale: run `{command}`", file=sys.stderr)
        if stale:
            return 1
        print(f"{what} up to date ({len(files)} files)")
        return 0
    for path, text in files.items():
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(root)}")
    return 0


def main(argv: list[str] | None, *, module: str, doc: str, files: Mapping[Path, str], root: Path, what: str) -> int:
    """`python -m <module> [--write | --check]` for a generator whose committed files are `files`."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"write the {what} (default)")
    mode.add_argument("--check", action="store_true", help=f"exit 1 when a committed file of the {what} is stale")
    args = parser.parse_args(argv)
    return write_or_check(files, check=args.check, command=f"python -m {module} --write", root=root, what=what)
