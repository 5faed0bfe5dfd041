"""servescope/report/outline.py's walk: sections built by stage, numbered by their place among those with something to say."""

from __future__ import annotations

import pytest

from servescope.contracts.settings import ReportSettings
from servescope.report.load import load
from servescope.report.outline import Context, ReportSection, walk
from servescope.report.render import Paragraph, Section, markdown
from tests.paths import RUNS

BUILT: list[str] = []


class First(ReportSection):
    stage = 1

    def build(self, ctx):
        BUILT.append("First")
        return "first"

    def to_json(self, data):
        return {"first": data}

    def section(self, data):
        return Section("First").add(Paragraph(data))


class Silent(ReportSection):
    """Nothing to say on any run: left out, its key still in the JSON."""

    def build(self, ctx):
        BUILT.append("Silent")
        return None

    def to_json(self, data):
        return {"silent": data}


class Last(ReportSection):
    def build(self, ctx):
        BUILT.append("Last")
        return ctx.of(First) + " then last"  # rests on another section's data: that one is built once

    def section(self, data):
        return Section("Last").add(Paragraph(data))


class Quiet(ReportSection):
    """Built, with nothing to say on this run (a knee run's sequential-vs-burst table): named, with why, at the end."""

    def build(self, ctx):
        return []

    def section(self, data):
        return Section("Quiet").add(Paragraph("nothing"))

    def silent(self, data):
        return None if data else "nothing of its kind ran"


class Itself(ReportSection):
    def build(self, ctx):
        return ctx.of(Itself)


@pytest.fixture
def ctx():
    BUILT.clear()
    run = load(RUNS / "seed-vllm-ollama")
    yield Context(run, "http://127.0.0.1:9", figures=False, settings=ReportSettings.from_env())
    run.close()


def test_numbers_follow_the_order_and_a_silent_section_takes_none(ctx):
    sections, numbers = walk((First(), Silent(), Last()), ctx)
    assert [(s.number, s.title) for s in sections] == [(1, "First"), (2, "Last")]
    assert numbers == {"first": "first", "silent": None, "left_out": []}  # Last says nothing in report.json
    assert BUILT == ["Silent", "Last", "First"]  # stage 0 first; First built once, when Last asked for it
    assert "## 2. Last" in markdown_of(sections) and "first then last" in markdown_of(sections)


def test_a_section_with_nothing_to_say_follows_the_others_and_the_numbers_close_up(ctx):
    sections, numbers = walk((Quiet(), First(), Last()), ctx)
    assert [(s.number, s.title) for s in sections] == [(1, "First"), (2, "Last"), (3, "Not in this run")]
    assert numbers["left_out"] == [{"section": "Quiet", "why": "nothing of its kind ran"}]
    md = markdown_of(sections)
    assert md.index("## 1. First") < md.index("## 3. Not in this run") and "- Quiet: nothing of its kind ran" in md
    assert "nothing\n" not in md  # its own text is not rendered: the reason stands for it


def test_a_section_resting_on_itself_is_an_error_not_a_hang(ctx):
    with pytest.raises(RuntimeError, match="rests on itself"):
        walk((Itself(),), ctx)


def test_a_figure_is_asked_for_only_once_the_figures_are_collected(ctx):
    with pytest.raises(RuntimeError, match="before the figures were collected"):
        ctx.plots.figure("table", "caption")
    ctx.plots.collect()
    assert ctx.plots.figure("table", "caption") == []  # not drawn (figures=False): no figure, no error


def test_a_bad_slo_is_refused_before_anything_is_built():
    from servescope.judgements import slo

    run = load(RUNS / "seed-vllm-ollama")
    try:
        with pytest.raises(slo.SloError):
            Context(run, "http://127.0.0.1:9", figures=False, slo_spec="ttft_p95<=", settings=ReportSettings.from_env())
    finally:
        run.close()


def markdown_of(sections: list[Section]) -> str:
    from servescope.report.render import Document

    return markdown(Document("t", "s", sections))
