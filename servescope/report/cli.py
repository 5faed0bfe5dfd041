"""`python -m servescope.report`: the comparison report for one run folder (or two), written next to the raw records."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from servescope.contracts.settings import ReportSettings
from servescope.contracts.thresholds import NoiseRule
from servescope.contracts.urls import redact
from servescope.judgements import slo
from servescope.report import load, tuning
from servescope.report.painter import Painter, figure_timeout_s
from servescope.text import command_name, printable, words


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=command_name.prog("python -m servescope.report"),
        description=__doc__,
        epilog="python -m servescope.report check --baseline RUN [--run RUN]: the regression gate (its --help: what it compares "
        "and its exit codes)",
    )
    p.add_argument("--run", metavar="ID|PATH", help="run folder to report on (default: the latest under --results)")
    p.add_argument("--baseline", metavar="ID|PATH", help="a second run to compare against (comparison mode)")
    p.add_argument(
        "--results", metavar="DIR", type=Path, default=None, help="where run folders live (default: SERVESCOPE_RESULTS)"
    )
    p.add_argument(
        "--prometheus",
        metavar="URL",
        default=None,
        help="Prometheus for the gauges (default: http://127.0.0.1:${PROMETHEUS_PORT})",
    )
    p.add_argument(
        "--slo",
        metavar="SPEC",
        help="judge goodput against these SLOs instead of the run's own (servescope/judgements/slo.py: e.g. ttft_p95<=0.5)",
    )
    p.add_argument(
        "--table-only",
        action="store_true",
        help="print the sequential-vs-burst table to the terminal and write nothing",
    )
    return p


def _gap_limits(manifest: dict, override: str | None, settings: ReportSettings) -> tuple[float, ...]:
    # goodput, unused here: the goodput section's modules imported on the reading thread, while the engine reads the run
    from servescope.report import goodput, run_slo  # noqa: F401

    return run_slo.manifest_gap_limits(manifest, override, settings.slo)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [
        "plan"
    ]:  # `python -m servescope.report plan KNEE_RUN...`: replicas for a traffic (servescope/report/plan.py)
        from servescope.report import plan

        return plan.main(argv[1:])
    if argv[:1] == ["check"]:  # a subcommand beside the report's own options, which stay as they were
        from servescope.report import check

        return check.main(argv[1:])
    args = parser().parse_args(argv)
    settings = ReportSettings.from_env()  # the report's entry: the knobs, read once
    run = baseline = None
    started = time.monotonic()
    try:
        NoiseRule.current()  # the rule that flags phases is knobs: a bad one is one line
        figure_timeout_s()
    except ValueError as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    try:
        path = load.resolve(args.run, args.results or load.results_dir())
        if tuning.is_tune_folder(path):  # a `make tune` folder: its trajectory (each step's runs report alone)
            written = tuning.write(path)
            print(f"report: wrote {', '.join(p.name for p in written)} for the tune in {path}", file=sys.stderr)
            print(path / "report.html")
            return 0
        if args.table_only:
            from servescope.report import table

            run = load.load(path)
            sys.stdout.write(table.render_text(table.build(run), run.run_id))
            return 0
        # The figures' painter starts first: its process imports matplotlib on the other core meanwhile. The engine
        # reads the run folder on its own threads (it lets go of the GIL) while Python imports the report's sections
        # (imported here, after the reading started, for that reason).
        Painter.shared()
        with ThreadPoolExecutor(1) as reader:
            reading = reader.submit(load.load, path, lambda manifest: _gap_limits(manifest, args.slo, settings))
            from servescope.report import render, sections

            run = reading.result()
        baseline = load.load(load.resolve(args.baseline, args.results or load.results_dir())) if args.baseline else None
        url = args.prometheus or settings.prometheus_url
        print(
            f"report: run {run.run_id}: {words.count(run.request_count, 'request')}, "
            f"{words.count(len(run.phases), 'phase')}; "
            f"querying {printable.line(redact(url))} and drawing plots",
            file=sys.stderr,
        )
        doc, numbers = sections.build(run, url, baseline, slo_spec=args.slo, settings=settings)
        written = render.write(run.path, doc, numbers)
    except (load.RunError, slo.SloError) as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"report: cannot write the report: {exc.strerror or exc} ({getattr(exc, 'filename', '')})", file=sys.stderr
        )
        return 1
    except (KeyboardInterrupt, RuntimeError) as exc:
        # DuckDB answers Ctrl-C inside a query with RuntimeError("Query interrupted"): the same Ctrl-C.
        if isinstance(exc, RuntimeError) and str(exc) != "Query interrupted":
            raise
        # The report ends here: a second Ctrl-C, or the signal DuckDB passes on once its query stopped, must not
        # kill it halfway through saying so.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if Painter._shared is not None:
            Painter._shared.stop()  # not waited on at exit: what it draws is not wanted any more
        print("\nreport: interrupted (Ctrl-C): the report was not written", file=sys.stderr)
        return 130
    finally:
        for opened in (run, baseline):
            if opened is not None:
                opened.close()  # the engine's temporary files go now, not at exit
    for warning in run.warnings:
        print(f"report: warning: {warning}", file=sys.stderr)
    gauge = numbers["gauges"]
    if not gauge["available"]:
        print(f"report: no gauge data: {gauge['reason']}", file=sys.stderr)
    from servescope.report import summary

    print(f"report: {summary.TITLE}\n{summary.text(summary_of(numbers))}", end="", file=sys.stderr)
    print(
        f"report: wrote {', '.join(p.name for p in written)} and {words.count(len(numbers['plots']), 'plot')} "
        f"in {time.monotonic() - started:.1f}s",
        file=sys.stderr,
    )
    print(run.path / "report.html")
    return 0


def summary_of(numbers: dict) -> list:
    """The summary section's engines back from report.json's numbers (what `make up` prints as well)."""
    from servescope.report import summary

    return [summary.EngineSummary(**s) for s in numbers.get("summary", [])]


if __name__ == "__main__":
    sys.exit(main())
