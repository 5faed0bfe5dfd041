"""Locust's own stats into the run folder: locust_stats.csv, locust_failures.csv, locust_exceptions.csv, locust.html."""

from __future__ import annotations

import csv
import hashlib
import io
import os
import stat
from pathlib import Path

import locust.html
from jinja2 import Environment, FileSystemBytecodeCache, FileSystemLoader, Template
from jinja2.bccache import Bucket
from locust.html import get_html_report
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

from servescope.contracts import knobs
from servescope.contracts.runfolder import write_file
from servescope.contracts.urls import redact

# Locust's report.html is a 950 KB page (its web UI's bundle inlined) that Jinja lexes and compiles on every render:
# a twentieth of a short run's CPU. Compiled once into SERVESCOPE_CACHE (Jinja's bytecode cache), the page is the same.
# The compiled code is keyed by the template file's path, size and modification time, as Jinja's own loader checks a
# template is up to date: checked against its source instead, each run would read, decode and hash the 950 KB (4 CPU
# ms, 800 page faults) only to find the code it has. A new Locust's page is a new file: compiled again.
TEMPLATE_CACHE = "jinja2"


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
    render = locust.html.render_template_from
    locust.html.render_template_from = _render_compiled_once
    try:
        page = get_html_report(environment, show_download_link=False)
    finally:
        environment.host = host
        locust.html.render_template_from = render
    written.append(write_file(folder / "locust.html", page))
    return written


def _render_compiled_once(file, build_path=locust.html.DEFAULT_BUILD_PATH, **kwargs):
    """locust.html.render_template_from, its template compiled once per Locust version (without a cache folder that
    can be made, compiled here as Locust does)."""
    cache = template_cache()
    if cache is not None:
        try:
            return compiled(cache, Path(build_path) / file).render(**kwargs)
        except OSError:  # a cache folder that cannot be read or written costs the cache, never the page
            pass
    return Environment(loader=FileSystemLoader(build_path)).get_template(file).render(**kwargs)


def compiled(cache: FileSystemBytecodeCache, path: Path) -> Template:
    """The template at `path` from the cache's code for this very file (path, size, modification time); compiled from
    its source, as Jinja's FileSystemLoader reads it, and stored when the cache has none."""
    env = Environment(loader=FileSystemLoader(path.parent))
    st = path.stat()
    key = f"{path}\0{st.st_size}\0{st.st_mtime_ns}"
    bucket = Bucket(env, hashlib.sha1(key.encode()).hexdigest(), key)  # the checksum a stored bucket must match
    cache.load_bytecode(bucket)
    if bucket.code is None:
        bucket.code = env.compile(path.read_text(encoding="utf-8"), path.name, str(path))
        cache.dump_bytecode(bucket)
    return env.template_class.from_code(env, bucket.code, env.make_globals(None))


def template_cache() -> FileSystemBytecodeCache | None:
    """SERVESCOPE_CACHE/jinja2, this user's alone (0700); None where it cannot be made, or is another user's or open
    to others: its files are compiled code this process loads, so only a folder no one else can write is trusted."""
    try:
        directory = knobs.path("SERVESCOPE_CACHE") / TEMPLATE_CACHE
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = directory.lstat()
    except (OSError, ValueError):
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return FileSystemBytecodeCache(str(directory))
