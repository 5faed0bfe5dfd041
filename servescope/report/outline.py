"""The report's outline: what a section is (build, report.json part, render) and the walk that numbers them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Any

from servescope.contracts.settings import ReportSettings
from servescope.report import figures as figure_data
from servescope.report import gauges, goodput, noise
from servescope.report.load import Run
from servescope.report.painter import Painter
from servescope.report.render import Bullets, Figure, Section


class Plots:
    """The report's figures: each one's data read (figures.py) as soon as what it shows is computed, drawn meanwhile by
    the painter (a process of its own), collected once every section is built."""

    def __init__(self, painter: Painter | None, folder: Path) -> None:
        self.painter, self.folder = painter, folder
        self._drawn: dict[str, Future] = {}
        self._files: dict[str, Path | None] | None = None

    def draw(self, key: str, what: Callable[..., Any], *args: Any) -> None:
        """figures.<name>(*args) read here, drawn by plots.<name> (the same name) in the painter."""
        if self.painter is not None:
            data = what(*args)
            if data is not None:
                self._drawn[key] = self.painter.draw(what.__name__, data, self.folder / figure_data.FILES[key])

    def collect(self) -> dict[str, Path | None]:
        if self._files is None:
            self._files = self.painter.collect(self._drawn) if self.painter is not None else {}
        return self._files

    def figure(self, key: str, caption: str) -> list[Figure]:
        """The figure drawn under key (none when it was not drawn): for a section's render, after collect."""
        if self._files is None:
            raise RuntimeError(f"figure {key!r} asked for before the figures were collected")
        return [Figure(self._files[key], caption)] if self._files.get(key) else []


class Context:
    """One report in the making: what its sections read (the run, a baseline, Prometheus, the SLOs asked for, the
    knobs as the report's entry read them), the judgements more than one section rests on, each other section's data
    (built once, when first asked for), and the figures being drawn."""

    def __init__(
        self,
        run: Run,
        prometheus_url: str,
        baseline: Run | None = None,
        figures: bool = True,
        client: gauges.Prometheus | None = None,
        slo_spec: str | None = None,
        *,
        settings: ReportSettings,
    ) -> None:
        self.run, self.prometheus_url, self.baseline, self.client = run, prometheus_url, baseline, client
        self.settings = settings
        # first: a bad --slo is one line before anything is computed
        self.spec = goodput.spec_of(run, slo_spec, knob=settings.slo)
        self.plots = Plots(Painter.shared() if figures else None, run.path)
        self._built: dict[type, Any] = {}

    @cached_property
    def assessment(self) -> noise.Assessment:
        """Which phases are trusted (host noise, outliers): the table, the verdict, the summary and the setup use it."""
        return noise.assess(self.run)

    def prometheus(self) -> gauges.Prometheus:
        return self.client or gauges.Prometheus(self.prometheus_url)

    def of(self, kind: type[ReportSection]) -> Any:
        """Section kind's data on this run, built on first asking (a section resting on another's asks for it)."""
        if kind not in self._built:
            self._built[kind] = _BUILDING
            self._built[kind] = kind().build(self)
        elif self._built[kind] is _BUILDING:
            raise RuntimeError(f"{kind.__name__}'s data rests on itself")
        return self._built[kind]


_BUILDING = object()


class ReportSection:
    """One section of the report: build reads the run (every query is made there), to_json says its numbers in
    report.json, section writes its blocks from the built data alone. A section whose build returns None has
    nothing to say on this run: it is left out and takes no number (its report.json keys still say so). A section
    holds no state: the Context builds each kind once per report, for the walk and for the sections resting on it."""

    # Builds run by stage, then in the report's order. The output is the same in any order (a section asks the
    # Context for what it rests on), the time is not: 0 reads no pool of gaps (built while latency.start_pools' passes
    # run), 1 reads the pools and hands the painter a figure (drawn while the rest is computed), 2 comes after those,
    # 3 rests on the other sections.
    stage = 0

    def build(self, ctx: Context) -> Any:
        raise NotImplementedError

    def to_json(self, data: Any) -> dict[str, Any] | None:
        return None

    def section(self, data: Any) -> Section:
        raise NotImplementedError

    def silent(self, data: Any) -> str | None:
        """Why the section has nothing to say on this run, though it was built (a knee run has no sequential-vs-burst
        table): it then takes no number and is named with this reason under NOT_IN_THIS_RUN, after the sections
        that have something to say. None: it has something to say."""
        return None

    def render(self, data: Any, number: int) -> Section:
        return replace(self.section(data), number=number)


NOT_IN_THIS_RUN = "Not in this run"  # the closing section: what the sections with nothing to say would have shown


def walk(sections: Sequence[ReportSection], ctx: Context) -> tuple[list[Section], dict[str, Any]]:
    """Build every section (by stage), then, in the given order, each one's report.json keys and, for those with
    something to say, its section numbered by its place among them. Those with nothing to say on this run (silent)
    follow, one line each, in a last section: the first screen is for what the run measured."""
    for s in sorted(sections, key=lambda s: s.stage):
        ctx.of(type(s))
    ctx.plots.collect()
    rendered: list[Section] = []
    numbers: dict[str, Any] = {}
    left_out: list[dict[str, str]] = []
    for s in sections:
        data = ctx.of(type(s))
        numbers.update(s.to_json(data) or {})
        if data is None:
            continue
        why = s.silent(data)
        if why:
            left_out.append({"section": s.section(data).title, "why": why})
        else:
            rendered.append(s.render(data, len(rendered) + 1))
    if left_out:
        closing = Section(NOT_IN_THIS_RUN, [Bullets([f"{x['section']}: {x['why']}" for x in left_out])])
        rendered.append(replace(closing, number=len(rendered) + 1))
    numbers["left_out"] = left_out
    return rendered, numbers
