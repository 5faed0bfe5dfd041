"""Locust's own stats into the run folder: locust_stats.csv, locust_failures.csv, locust_exceptions.csv, locust.html."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from locust.html import get_html_report
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

from servescope.contracts.runfolder import write_file
from servescope.contracts.urls import redact


def write_locust_outputs(environment, folder: Path) -> list[Path]:
    """Locust rounds what it shows: these files are for reading alongside, never the source of a reported number."""
    folder = Path(folder)
    stats_csv = StatsCSV(environment, PERCENTILES_TO_REPORT)
    written = []
    for name, write in (
        ("locust_stats.csv", stats_csv.requests_csv),
        ("locust_failures.csv", stats_csv.failures_csv),
        ("locust_exceptions.csv", stats_csv.exceptions_csv),
    ):
        text = io.StringIO(newline="")
        write(csv.writer(text))
        written.append(write_file(folder / name, text.getvalue()))  # never through a link at the name
    host = environment.host
    environment.host = redact(host) if host else host  # the report prints the host: never credentials
    try:
        page = get_html_report(environment, show_download_link=False)
    finally:
        environment.host = host
    written.append(write_file(folder / "locust.html", page))
    return written
