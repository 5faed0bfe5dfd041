"""One document model written three ways: report.md, a self-contained report.html (inline PNGs) and report.json."""

from __future__ import annotations

import base64
import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servescope.contracts.runfolder import write_file


@dataclass
class Paragraph:
    """A paragraph of text in a report section."""

    text: str


@dataclass
class Bullets:
    """A bulleted list in a report section."""

    items: list[str]


@dataclass
class Table:
    """A table in a report section: headers, rows of cell text, and an optional caption."""

    headers: list[str]
    rows: list[list[str]]
    caption: str = ""


@dataclass
class Figure:
    """A PNG in a report section, with its caption."""

    path: Path
    caption: str


@dataclass
class Preformatted:
    """Text a report section shows as is, in a fixed-width block."""

    text: str


@dataclass
class Section:
    """One titled section of a report: its blocks in order, and its number in the report's outline."""

    title: str
    blocks: list[Any] = field(default_factory=list)
    number: int | None = (
        None  # its place in the report (servescope/report/outline.py's walk); None: a page of one section
    )

    def add(self, block: Any) -> Section:
        self.blocks.append(block)
        return self


@dataclass
class Document:
    """A whole report: title, subtitle and sections, written as report.md, report.html and report.json."""

    title: str
    subtitle: str
    sections: list[Section]

    def numbered(self) -> list[tuple[str, Section]]:
        """Each section with its heading: numbers come from the report's order (servescope/report/outline.py), never by hand."""
        return [(sec.title if sec.number is None else f"{sec.number}. {sec.title}", sec) for sec in self.sections]


def markdown(doc: Document) -> str:
    out = [f"# {doc.title}", "", doc.subtitle, ""]
    for heading, sec in doc.numbered():
        out += [f"## {heading}", ""]
        for block in sec.blocks:
            if isinstance(block, Paragraph):
                out += [block.text, ""]
            elif isinstance(block, Bullets):
                out += [f"- {item}" for item in block.items] + [""]
            elif isinstance(block, Table):
                if block.caption:
                    out += [f"*{_md_emphasis(block.caption)}*", ""]
                out.append("| " + " | ".join(_md_cell(h) for h in block.headers) + " |")
                out.append("|" + "---|" * len(block.headers))
                out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows]
                out.append("")
            elif isinstance(block, Figure):
                out += [f"![{block.caption}]({block.path.name})", "", f"*{_md_emphasis(block.caption)}*", ""]
            elif isinstance(block, Preformatted):
                out += ["```", block.text.rstrip("\n"), "```", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _md_emphasis(text: str) -> str:
    return text.replace("*", "\\*").replace("_", "\\_")


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", "<br>")


CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1200px;color:#1d2330;
line-height:1.45;padding:0 16px}
h1{margin-bottom:4px}h2{border-bottom:2px solid #dfe3ea;padding-bottom:4px;margin-top:32px}
.subtitle{color:#5b6475;margin-top:0}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px;width:100%}
th,td{border:1px solid #d5dae3;padding:4px 8px;text-align:left;vertical-align:top}
p,li,figcaption{overflow-wrap:break-word}
th{background:#f0f3f8}tr:nth-child(even) td{background:#fafbfd}
caption{caption-side:top;text-align:left;font-style:italic;color:#5b6475;padding-bottom:4px}
figure{margin:12px 0 20px}figure img{max-width:100%;border:1px solid #e3e6ec}
figcaption{color:#5b6475;font-size:13px}
pre{background:#f5f7fa;border:1px solid #dfe3ea;padding:10px;overflow-x:auto;font-size:12px}
li{margin:2px 0}code{background:#f0f3f8;padding:0 3px;border-radius:3px;font-size:90%}
.toc ul{list-style:none;padding:0;margin:4px 0 0;font-size:13px}
.toc li{display:inline-block;white-space:nowrap;margin-right:14px}
"""


def html_page(doc: Document) -> str:
    """Self-contained: styles inline and every figure a data: URI, so the file can be mailed or archived alone."""
    esc = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(doc.title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(doc.title)}</h1>",
        f'<p class="subtitle">{esc(doc.subtitle)}</p>',
    ]
    toc = "".join(f'<li><a href="#s{k}">{esc(h)}</a></li>' for k, (h, _) in enumerate(doc.numbered()))
    out.append(f'<nav class="toc"><ul>{toc}</ul></nav>')  # one line: the first screen is for the summary
    for k, (heading, sec) in enumerate(doc.numbered()):
        out.append(f'<section id="s{k}"><h2>{esc(heading)}</h2>')
        for block in sec.blocks:
            if isinstance(block, Paragraph):
                out.append(f"<p>{_inline(block.text)}</p>")
            elif isinstance(block, Bullets):
                out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in block.items) + "</ul>")
            elif isinstance(block, Table):
                cap = f"<caption>{esc(block.caption)}</caption>" if block.caption else ""
                head = "".join(f"<th>{esc(h)}</th>" for h in block.headers)
                body = "".join("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>" for row in block.rows)
                out.append(f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            elif isinstance(block, Figure):
                data = base64.b64encode(block.path.read_bytes()).decode("ascii")
                out.append(
                    f'<figure><img alt="{esc(block.caption)}" src="data:image/png;base64,{data}">'
                    f"<figcaption>{esc(block.caption)}</figcaption></figure>"
                )
            elif isinstance(block, Preformatted):
                out.append(f"<pre>{esc(block.text)}</pre>")
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _inline(text: str) -> str:
    """Escape, then turn `command` spans and **strong** spans (written for the Markdown) into <code> and <strong>."""
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)


def _clean(value: Any) -> Any:
    """JSON has no NaN/Infinity: write null rather than a file other tools refuse to parse."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def json_text(numbers: dict[str, Any]) -> str:
    return json.dumps(_clean(numbers), indent=2, allow_nan=False) + "\n"


def write(folder: Path, doc: Document, numbers: dict[str, Any]) -> list[Path]:
    """Write the three files next to the run's raw records (each whole: a crash leaves no half report)."""
    written = []
    for name, text in (
        ("report.md", markdown(doc)),
        ("report.html", html_page(doc)),
        ("report.json", json_text(numbers)),
    ):
        written.append(write_file(folder / name, text))  # whole or not at all, never through a link at the name
    return written
