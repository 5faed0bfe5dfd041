"""`.env.example` and docs/knobs.md, both generated from the knob table in servescope/contracts/knob_defaults.py.

python -m servescope.contracts.knob_table --write   # regenerate .env.example and docs/knobs.md
python -m servescope.contracts.knob_table --check   # exit 1 when either committed file is stale (the tests run it)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from servescope.contracts.knob_defaults import GROUPS, HEADER, Group
from servescope.contracts.knobs import REPO_ROOT

ENV_EXAMPLE = REPO_ROOT / ".env.example"
PAGE = REPO_ROOT / "docs" / "knobs.md"
HEAD = """# Knobs

Every knob with its default, as servescope/contracts/knob_defaults.py sets it (this page and `.env.example` are generated from
it by `python -m servescope.contracts.knob_table --write`; the tests fail when either is stale). Put overrides in `.env` or the
environment: environment > `.env` > the defaults. The Makefile and Compose read `.env.example`; the native stack and the
load generator's options read the same table through servescope/contracts/knobs.py.
"""


def _comment(text: str) -> list[str]:
    return [f"# {line}".rstrip() for line in text.splitlines()]


def env_example(groups: tuple[Group, ...] = GROUPS, header: str = HEADER) -> str:
    """The KEY=VALUE file Compose and the Makefile read: each knob under its help as comment lines."""
    lines = _comment(header)
    for group in groups:
        lines += ["", f"# --- {group.title} ---", *_comment(group.note)]
        if group.note:
            lines.append("")  # the note is the group's, not its first knob's
        for knob in group.knobs:
            if knob.paragraph:
                lines.append("")
            lines += [*_comment(knob.help), f"{knob.name}={knob.default}"]
    return "\n".join(lines) + "\n"


def page(groups: tuple[Group, ...] = GROUPS) -> str:
    lines = [HEAD]
    for group in groups:
        lines += [f"## {group.title}", ""]
        if group.note:
            lines += [" ".join(group.note.splitlines()), ""]
        lines += ["| knob | default | what it does |", "|---|---|---|"]
        for knob in group.knobs:
            cell = " ".join(knob.help.splitlines()).replace("|", "\\|") or "—"
            value = f"`{knob.default}`" if knob.default else "(empty)"
            lines.append(f"| `{knob.name}` | {value} | {cell} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def generated() -> dict[Path, str]:
    return {ENV_EXAMPLE: env_example(), PAGE: page()}


def stale() -> list[Path]:
    return [path for path, text in generated().items() if not path.is_file() or path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m servescope.contracts.knob_table", description=__doc__.splitlines()[0]
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if args.check:
        for path in stale():
            print(f"{path} is stale: run python -m servescope.contracts.knob_table --write", file=sys.stderr)
        return 1 if stale() else 0
    for path, text in generated().items():
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
