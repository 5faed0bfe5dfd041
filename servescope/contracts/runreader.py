"""The one reader of a run folder's JSONL: DuckDB streams each file once and checks every line against the contract.

Why DuckDB: a long run's requests.jsonl is gigabytes, more than Python objects can hold. DuckDB parses JSON in
C++ on every core, streams it, keeps what it read in a columnar table (spilling past its memory limit), and answers
aggregates over it, so the report asks questions instead of loading records. pyarrow, measured beside it, took more
CPU and memory to hold the table, fails the whole file at one mistyped value, and would leave the querying to Python
(the figures: docs/pieces.md).

Each line lands in a table with either typed columns or the reason it was refused; `requests` and `phases` are
views of the accepted rows, numbered in the order the report takes them (SEQ: requests as sent). Lines are parsed with typed columns, which would read
"12" as 12 or true as 1.0; a regex and string searches over the raw line send every line where that could have
happened to the full check (each field parsed as JSON and its type looked at), so what is accepted is exactly what
the contract allows. Both checks are generated from the contract's field table (servescope.contracts.runcontract): the rule is
written once.

A long run is read once: past RUN_INDEX_MIN_MB of requests the tables are kept beside the JSONL (runcontract.INDEX)
and later readers open them (the load generator's end-of-run summary is the first), so a report on a long run
does not parse its JSON again (bench/report_scale.py measures both ways; docs/pieces.md has the figures).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
import weakref
import zlib
from collections.abc import Iterator
from pathlib import Path

from servescope.contracts import runcontract
from servescope.contracts.runcontract import MAX_ENGINE_NUMBER, NOT_JSON, NOT_OBJECT, TORN, Field, Skips
from servescope.text import numbers


def engine():
    """DuckDB as this reader uses it: connect, execute, fetch, cursors and its errors, loaded by whoever reads (not by
    every importer: the load generator imports this module).
    duckdb 2's package is its C extension (`_duckdb`) with a relational API in Python built around it at import, which
    no reader here uses and which is most of the import's cost (0.07 CPU s of a 4-request run's 0.6, docs/pieces.md).
    The extension itself is taken where it is there; any other layout, the package as usual."""
    try:
        import _duckdb as duckdb
    except ImportError:
        import duckdb
    return duckdb


# Each file of a run folder, the view of its accepted lines (the table of all of them: <view>_lines), its fields.
VIEWS = {runcontract.REQUESTS: "requests", runcontract.PHASES: "phases", runcontract.SAMPLES: "samples"}
SPECS = {
    "requests": runcontract.REQUEST_FIELDS,
    "phases": runcontract.PHASE_FIELDS,
    "samples": runcontract.SAMPLE_FIELDS,
}
# Each view's column SEQ numbers its records from 1 in the order the report takes them. Requests: as sent (started_at),
# ties by arrival within a burst, then by the record itself (_number_sql), numbered once read (any reading order
# gives the same numbers, so the JSON reader may read on every core); the other files: as written (the line).
SEQ = "seq"
SEQ_ORDER = {"requests": "started_at, coalesce(arrival_index, 0)"}
# Memory the engine may use before it spills to its temporary directory; the report process's peak stays near
# this plus the plots, whatever the size of the run.
MEMORY_LIMIT = "1GB"
# Building the index writes every row group to the index file as it is read, so the engine can drop the pages it
# wrote; with the reading limit it held them, on top of the report's imports and the figure painter started beside
# it. A row group is held whole until it is written: at the engine's default size (122,880 rows) one of 256-token
# requests is most of a gigabyte, so the index's are INDEX_ROW_GROUP_ROWS. Up to FILE_BACKED_BYTES of JSONL the build
# holds INDEX_MEMORY_LIMIT: at 256 MB the engine spent a tenth more CPU making room, and the build's peak at 320 MB
# (with the painter beside it) stays under the report's own, which comes after (51,200 requests:
# bench/report_scale.py; docs/pieces.md); past it the build keeps the reading limit (the bench measures both sizes).
INDEX_MEMORY_LIMIT = "320MB"
INDEX_ROW_GROUP_ROWS = 16_384
ONE_THREAD_BYTES = 8 << 20
FILE_BACKED_BYTES = 512 << 20  # JSONL past this is read into a compressed database file (RunData)
# Lines are read whole (a CSV scan with a delimiter no JSON line can hold: raw control characters are invalid
# JSON) so that each keeps its line number and a bad one costs only itself.
_NO_DELIMITER = "\x01\x02\x03\x04"
_MAX_LINE_BYTES = 8 << 20  # a record of ~400,000 tokens at full precision
_TYPE_WORDS = {
    "VARCHAR": "a string",
    "BIGINT": "an integer",
    "UBIGINT": "an integer",
    "DOUBLE": "a number",
    "BOOLEAN": "true/false",
    "ARRAY": "a list",
    "OBJECT": "an object",
    "NULL": "null",
}
_JSON_TYPES = {  # the json_type() values each kind of field accepts
    "str": ("VARCHAR",),
    "int": ("BIGINT", "UBIGINT"),
    "float": ("BIGINT", "UBIGINT", "DOUBLE"),
    "bool": ("BOOLEAN",),
    "object": ("OBJECT",),
}
_KIND_WORDS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "object": "an object",
}
# Beside each number list: its count, sum, min and max, and every LIST_SAMPLE_EVERY-th value from an offset that
# moves with the line (an even sample of any pool of lists, taken while the list is in memory).
LIST_SUMMARY = {"n": "len({})", "sum": "list_sum({})", "min": "list_min({})", "max": "list_max({})"}
LIST_SAMPLE_EVERY = 64
_SQL_TYPES = {"str": "VARCHAR", "int": "BIGINT", "float": "DOUBLE", "bool": "BOOLEAN", "object": "JSON"}


def _q(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _type_word(expr: str) -> str:
    cases = " ".join(f"WHEN {_q(t)} THEN {_q(w)}" for t, w in _TYPE_WORDS.items())
    return f"(CASE {expr} {cases} ELSE lower({expr}) END)"


def _struct(spec: tuple[Field, ...], typed: bool) -> str:
    types = {f.name: ("DOUBLE[]" if f.kind == "floats" else _SQL_TYPES[f.kind] if typed else "JSON") for f in spec}
    return _q("{" + ", ".join(f'"{name}": "{t}"' for name, t in types.items()) + "}")


def _range_checks(f: Field, value: str, summarized: bool = False) -> list[tuple[str, str]]:
    """[(condition, reason)] on a field's typed value (NULL passes): the same whichever way it was parsed.
    summarized: a number list is judged by its summary columns (<name>_n, _min, _max), computed once."""
    if f.kind == "floats":
        n, low, high = (
            (f"{f.name}_n", f"{f.name}_min", f"{f.name}_max")
            if summarized
            else (f"len({value})", f"list_min({value})", f"list_max({value})")
        )
        return [
            (
                f"{n} > 0 AND NOT ({low} >= {numbers.sql_double(f.lo)} AND {high} <= {numbers.sql_double(f.hi)})",
                _q(f"{f.name}: a value out of range ({f.lo:g} to {f.hi:g})"),
            )
        ]
    if f.kind in ("int", "float"):  # NaN and infinities fail BETWEEN
        return [
            (
                f"NOT ({value} BETWEEN {numbers.sql_double(f.lo)} AND {numbers.sql_double(f.hi)})",
                _q(f"{f.name}: out of range ({f.lo:g} to {f.hi:g})"),
            )
        ]
    return []


def _strict_checks(spec: tuple[Field, ...]) -> str:
    """The contract, checked in full on a line parsed with every field as JSON (j) beside its raw text (line):
    the first failing rule's reason in field order, '' for a blank line, NULL for a record that meets it."""
    first = spec[0].name  # a required field: NULL may mean the line is not an object at all
    checks = [
        ("j IS NULL AND trim(line) = ''", "''"),
        ("j IS NULL AND json_valid(line)", _q(NOT_OBJECT)),
        ("j IS NULL", _q(NOT_JSON)),
        (f"j.{first} IS NULL AND json_type(line) <> 'OBJECT'", _q(NOT_OBJECT)),
    ]
    for f in spec:
        col = f"j.{f.name}"
        if f.required:
            checks.append((f"{col} IS NULL", _q(f"missing {f.name}")))
        if f.kind == "floats":
            # Parsed as DOUBLE[], which would read "0.2" as 0.2 and true as 1.0: the raw text must hold numbers only.
            raw_type = f"json_type(line, '$.{f.name}')"
            checks.append(
                (
                    f"{col} IS NULL AND coalesce({raw_type}, 'NULL') <> 'NULL'",
                    f"{_q(f'{f.name}: expected a list of numbers, got ')} || {_type_word(raw_type)}",
                )
            )
            checks.append(
                (
                    f"regexp_matches(line, {_q(_LIST_OF_NON_NUMBERS.format(name=f.name))})",
                    _q(f"{f.name}: expected a list of numbers, got a list"),
                )
            )
            checks += _range_checks(f, col)
            continue
        jtype = f"json_type({col})"
        allowed = ", ".join(_q(t) for t in _JSON_TYPES[f.kind])
        checks.append(
            (
                f"{col} IS NOT NULL AND {jtype} NOT IN ({allowed})",
                f"{_q(f'{f.name}: expected {_KIND_WORDS[f.kind]}, got ')} || {_type_word(jtype)}",
            )
        )
        checks += _range_checks(f, f"TRY_CAST({col} AS DOUBLE)")
        if f.kind == "object":
            checks.append(
                (
                    f"{col} <> '{{}}' AND EXISTS (SELECT 1 FROM json_tree({col}) "
                    f"WHERE type IN ('BIGINT', 'UBIGINT', 'DOUBLE') "
                    f"AND NOT abs(TRY_CAST(value AS DOUBLE)) <= {numbers.sql_double(MAX_ENGINE_NUMBER)})",
                    _q(f"{f.name}: holds a number that is not finite or beyond 2^63"),
                )
            )
    checks += _cross_checks(spec, "TRY_CAST(j.{} AS DOUBLE)")
    return "CASE " + " ".join(f"WHEN {c} THEN {r}" for c, r in checks) + " END"


def _cross_checks(spec: tuple[Field, ...], value: str) -> list[tuple[str, str]]:
    names = {f.name for f in spec}
    if {"started_at", "ended_at"} <= names:
        return [(f"{value.format('ended_at')} < {value.format('started_at')}", _q(runcontract.ENDS_BEFORE_START))]
    return []


# A list holding anything but numbers: a quote, a letter other than an exponent's e, a nested [ or {.
_LIST_OF_NON_NUMBERS = r'"{name}"\s*:\s*\[[^\]]*[^-+0-9.eE,\s\]]'


def _suspect_pattern(spec: tuple[Field, ...]) -> str:
    """A regex for the lines a typed parse could read leniently ("12" as 12, true as 1.0, 12.5 as 13, a number past
    BIGINT as NULL...): with _suspect_strings it misses none of them and may match good lines (the full check passes
    those).

    Each pattern is anchored on a key (every alternative starts with a quote, so the regex engine skips from quote to
    quote: a number list, which holds none, costs it nothing); engine stats are free-form, so every number after their
    key is looked at."""

    def keys(*kinds: str) -> str:
        return "|".join(f.name for f in spec if f.kind in kinds)

    # Groups do not capture: RE2 answers a match with no captures from its DFA.
    value = r'"(?:{keys})"\s*:\s*'
    number = r"[:,\[]\s*-?"  # where a JSON number can start
    huge = r"(?:[0-9]{19,}|[0-9.]+[eE]\+?0*(?:1[89]|[2-9][0-9]|[1-9][0-9]{2,})|NaN|Infinity)"  # >= 10^18, not finite
    patterns = [
        value.format(keys=keys("str")) + r'[^"n\s]',  # a string field that is not a string or null
        value.format(keys=keys("int", "float")) + r"[^-0-9n\s]",  # a number field that is not a number or null
        value.format(keys=keys("int")) + r"-?(?:[0-9]*[.eE]|[0-9]{19,})",  # a fraction, an exponent, past BIGINT
        value.format(keys=keys("bool")) + r"[^tfn\s]",
        value.format(keys=keys("floats")) + r"[^\[n\s]",
        value.format(keys=keys("object")) + r"[^{n\s]",
        value.format(keys=keys("object")) + r"\{.*" + number + huge,
    ]
    return "|".join(f"(?:{p})" for p in patterns if '"(?:)"' not in p)


# Characters no JSON number holds, each the start of another value: a string, true, false, null, a list, an object.
_NOT_IN_NUMBERS = ('"', "t", "f", "n", "[", "{")


def _suspect_strings(spec: tuple[Field, ...]) -> list[str]:
    """Conditions on the raw line by string search (memchr speed, where a regex walks every byte of a long list): an
    escape (it could spell a key no pattern sees), and a number list holding anything but numbers: a string ("0.2")
    or true/false (the typed parse would read them as numbers), null, a list or an object (it would leave a hole).

    The list's text is its body (_summaries); a key written any other way than `"name":[` or twice (spaces, in engine
    stats too) sends the line to the full check."""
    checks = ["contains(line, '\\u')"]
    for f in spec:
        if f.kind == "floats":
            key, at, body = _q(chr(34) + f.name + chr(34)), f"{f.name}_at", f"{f.name}_body"
            checks.append(
                f"strpos(line, {key}) <> {at} OR split_part(line, {key}, 3) <> '' "  # not first as "name":[, or twice
                f"OR {' OR '.join(f'contains({body}, {_q(c)})' for c in _NOT_IN_NUMBERS)}"
            )
    return checks


def within(name: str, i: int) -> str:
    """The column holding how many of a number list's values are at or under the reader's i-th limit."""
    return f"{name}_within{i}"


def _summaries(spec: tuple[Field, ...], limits: tuple[float, ...] = ()) -> list[str]:
    """Computed once per line before the checks and the columns that use them: each number list's summaries
    (_list_summaries) and its raw text (_list_text)."""
    return _list_summaries(spec, limits) + _list_text(spec)


def _list_summaries(spec: tuple[Field, ...], limits: tuple[float, ...] = ()) -> list[str]:
    """Each number list's count, sum, min and max (LIST_SUMMARY) and how many of its values are within each limit,
    from the typed parse k."""
    out = []
    for f in spec:
        if f.kind == "floats":
            out += [f"{agg.format('k.' + f.name)} AS {f.name}_{name}" for name, agg in LIST_SUMMARY.items()]
            out += [
                f"len(list_filter(k.{f.name}, lambda g: g <= {numbers.sql_double(limit)})) AS {within(f.name, i)}"
                for i, limit in enumerate(limits)
            ]
    return out


def _list_text(spec: tuple[Field, ...]) -> list[str]:
    """Where `"name":[` first appears in the raw line and the text after it up to the next ']' (the list's body)."""
    out = []
    for f in spec:
        if f.kind == "floats":
            key = chr(34) + f.name + chr(34) + ":["
            out.append(f"strpos(line, {_q(key)}) AS {f.name}_at")
            out.append(f"split_part(split_part(line, {_q(key)}, 2), ']', 1) AS {f.name}_body")
    return out


def _raw_suspect(spec: tuple[Field, ...]) -> str:
    """The condition on a line's raw text (and its lists' _list_text) that sends it to the full check."""
    return " OR ".join([f"regexp_matches(line, {_q(_suspect_pattern(spec))})"] + _suspect_strings(spec))


def _fast_columns(
    spec: tuple[Field, ...], limits: tuple[float, ...] = (), numbered: bool = False
) -> tuple[str, str, list[str]]:
    """(suspect condition, reason for an unsuspected line, typed value columns) from the typed parse k and the
    summaries; numbered: with an empty SEQ column beside them."""
    suspect = " OR ".join(["k IS NULL"] + [f"k.{f.name} IS NULL" for f in spec if f.required] + [_raw_suspect(spec)])
    checks = [c for f in spec for c in _range_checks(f, f"k.{f.name}", summarized=True)] + _cross_checks(spec, "k.{}")
    reason = "CASE " + " ".join(f"WHEN {c} THEN {r}" for c, r in checks) + " END" if checks else "NULL"
    columns = []
    for f in spec:
        value = f"k.{f.name}"
        if f.name == "instance":
            value = "coalesce(k.instance, k.engine)"  # a record without one is its engine's only instance
        elif f.default == {}:
            value = f"coalesce({value}, '{{}}'::JSON)"
        elif f.default == []:
            value = f"coalesce({value}, []::DOUBLE[])"
        elif f.default is not None:
            value = f"coalesce({value}, {_q(f.default) if isinstance(f.default, str) else repr(f.default)})"
        columns.append(f"{value}::{'DOUBLE[]' if f.kind == 'floats' else _SQL_TYPES[f.kind]} AS {f.name}")
        if f.kind == "floats":
            # Each list's count, sum, min and max, taken while it is in memory: a pool's totals then cost a row
            # scan, not a pass over every value.
            columns += [f"{f.name}_{name}" for name in LIST_SUMMARY]
            columns += [within(f.name, i) for i in range(len(limits))]
            every = LIST_SAMPLE_EVERY
            offset = f"1 + hash(k.started_at) % {every}"  # moves from line to line (lines are numbered later)
            columns.append(f"list_slice(k.{f.name}, {offset}, {f.name}_n, {every}) AS {f.name}_sample")
    if numbered:
        columns.append(f"NULL::BIGINT AS {SEQ}")  # numbered once every line is read (_number_sql)
    return suspect, reason, columns


def _lines(path: Path, rejects: str | None = None) -> str:
    """The file's lines, each whole, in order (blank lines too: NULL); rejects: the scan sets aside the lines that are
    not text, in tables named after it."""
    options = (
        f"columns={{'line': 'VARCHAR'}}, delim={_q(_NO_DELIMITER)}, quote='', escape='', header=false, "
        f"auto_detect=false, new_line='\\n', strict_mode=false, max_line_size={_MAX_LINE_BYTES}, "
        f"buffer_size={2 * _MAX_LINE_BYTES}"
    )
    if rejects:
        options += (
            f", ignore_errors=true, store_rejects=true, rejects_table={_q(rejects + '_errors')}, "
            f"rejects_scan={_q(rejects + '_scans')}"
        )
    return f"read_csv({_q(str(path))}, {options})"


def _ingest_sql(
    table: str,
    path: Path | None,
    spec: tuple[Field, ...],
    rejects: str | None,
    limits: tuple[float, ...] = (),
    order: str | None = None,
) -> list[str]:
    """Statements that read one JSONL file into table: a typed parse of every line (fast), then the full check of
    the few lines the typed parse could have read leniently (their raw text is kept for it). No file (path None):
    the same table, empty.

    A row's rowid + 1 is its line number: the scan keeps the file's order and gives blank lines a row too (kept, with
    the reason '': no row is ever deleted, so no checkpoint can renumber the rest). Asking
    the scan for numbered lines (WITH ORDINALITY) or for rejected lines would make it single-threaded, so the
    second (rejects) is only asked for when the first read failed on a line that is not text at all.
    order: the file's send order (SEQ_ORDER), by which its accepted rows are numbered last (_number_sql)."""
    lines = _lines(path, rejects) if path is not None else "(SELECT NULL::VARCHAR AS line LIMIT 0)"
    suspect, reason, columns = _fast_columns(spec, limits, numbered=order is not None)
    read = (
        f"CREATE TABLE {table} AS "
        f"WITH src AS (SELECT coalesce(line, '') AS line, TRY(from_json(line, {_struct(spec, typed=True)})) AS k "
        f"FROM {lines}), "
        f"summed AS (SELECT *, {', '.join(_summaries(spec, limits))} FROM src), "
        f"flagged AS (SELECT *, {suspect} AS suspect FROM summed) "
        f"SELECT CASE WHEN suspect THEN line END AS raw, CASE WHEN NOT suspect THEN {reason} END AS reason, "
        f"{', '.join(columns)} FROM flagged"
    )
    if path is None:  # no line to check or number: the checks' plan alone cost a short run's summary 0.025 CPU-s
        return [read]
    return [
        read,
        f"CREATE TEMP TABLE {table}_checks AS SELECT rid, {_strict_checks(spec)} AS reason "
        f"FROM (SELECT rowid AS rid, raw AS line, TRY(from_json(raw, {_struct(spec, typed=False)})) AS j "
        f"FROM {table} WHERE raw IS NOT NULL)",
        f"UPDATE {table} SET reason = c.reason, raw = NULL FROM {table}_checks c WHERE {table}.rowid = c.rid",
        f"DROP TABLE {table}_checks",
    ] + (_number_sql(table, spec, order, in_file_order=True) if order is not None else [])


def _clean_sql(
    table: str, path: Path, spec: tuple[Field, ...], limits: tuple[float, ...] = (), order: str | None = None
) -> tuple[str, str]:
    """(scan, read) for a file with no line a typed parse could read leniently, the common case: the same table as
    _ingest_sql's, its values parsed by DuckDB's JSON reader (in parallel, with no line held as a string), while the
    scan of the raw lines counts them and asks whether any is blank or suspect (the checks _ingest_sql makes, on the
    text alone). The reader refuses a line that is not one JSON object (a torn or malformed one, two objects, one
    split over lines, a key written twice, a list inside a number list) and skips a blank one; otherwise it yields
    one row per line: when it yields as many rows as the scan counted lines, every line is a row. In file order
    (its row numbers the line numbers) unless the file has a send order (order): then the reader is free to interleave
    the rows its threads read, and _number_sql numbers them after."""
    text = ", ".join(_list_text(spec))
    scan = (
        f"SELECT count(*), count(*) FILTER (WHERE {_raw_suspect(spec)}) "
        f"FROM (SELECT line{', ' + text if text else ''} FROM {_lines(path)})"
    )
    types = ", ".join(f"{_q(f.name)}: {_q('DOUBLE[]' if f.kind == 'floats' else _SQL_TYPES[f.kind])}" for f in spec)
    records = (
        f"read_json({_q(str(path))}, format='newline_delimited', columns={{{types}}}, "
        f"maximum_object_size={_MAX_LINE_BYTES})"
    )
    _, reason, columns = _fast_columns(spec, limits, numbered=order is not None)
    summaries = ", ".join(["k"] + _list_summaries(spec, limits))
    read = (
        f"CREATE TABLE {table} AS SELECT NULL::VARCHAR AS raw, {reason} AS reason, {', '.join(columns)} "
        f"FROM (SELECT {summaries} FROM (SELECT r AS k FROM {records} r))"
    )
    return scan, read


def _ingest_clean(
    con, table: str, path: Path, spec: tuple[Field, ...], limits: tuple[float, ...], order: str | None = None
) -> bool:
    """Read a clean file (_clean_sql) into table, its scan first; False, and no table left, when the file is not
    clean (the caller reads it the full way: every line its own check, each refusal its reason).
    Why: the line-by-line read parses each line string on one thread; here the JSON reader parses on every core.
    The scan runs before the read, not beside it: side by side, four threads on two cores took more CPU than the two
    one after the other (docs/pieces.md), and a file the scan finds unclean is not parsed twice. A file with a send
    order (order) is read without keeping the file's order and numbered after (_number_sql): kept under the build's
    memory limit, the order held the read to one thread."""
    duckdb = engine()

    scan_sql, read_sql = _clean_sql(table, path, spec, limits, order)
    try:
        lines, suspect = con.execute(scan_sql).fetchone()
    except duckdb.Error:
        return False  # not text, or a line past the line size: the full way says which
    if suspect:
        return False
    try:
        if order is not None:
            con.execute("SET preserve_insertion_order = false")
        con.execute(read_sql)
    except duckdb.Error:
        con.execute(f"DROP TABLE IF EXISTS {table}")
        return False
    finally:
        if order is not None:
            con.execute("RESET preserve_insertion_order")
    rows, missing = con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE {' OR '.join(f'{f.name} IS NULL' for f in spec if f.required)}) "
        f"FROM {table}"
    ).fetchone()
    if rows != lines or missing:
        con.execute(f"DROP TABLE IF EXISTS {table}")
        return False
    for statement in _number_sql(table, spec, order, in_file_order=False) if order is not None else ():
        con.execute(statement)
    return True


def _number_sql(table: str, spec: tuple[Field, ...], order: str, in_file_order: bool) -> list[str]:
    """Statements that number the accepted rows of table (column SEQ, from 1) in the file's send order, ties broken by
    a hash of each record's values (its number lists by their summaries: hashing every gap cost a third of the read)
    and, where the rows are in file order, by the line. Records alike in all of those can differ only in their gaps'
    order or in gaps their summaries do not show; between two such records the order is the reader's.
    Sorted into a table of row ids, whose own row numbers are the ranks: a window's row_number() over the same key
    took five times as long (it carried the hashed columns through its sort)."""
    values = [f.name for f in spec if f.kind != "floats"]
    values += [f"{f.name}_{name}" for f in spec if f.kind == "floats" for name in LIST_SUMMARY]
    key = f"{order}, hash({', '.join(values)})" + (", rowid" if in_file_order else "")
    ranks = f"{table}_ranks"
    return [
        f"CREATE TEMP TABLE {ranks} AS SELECT rowid AS rid FROM {table} WHERE reason IS NULL ORDER BY {key}",
        f"UPDATE {table} SET {SEQ} = r.rowid + 1 FROM {ranks} r WHERE {table}.rowid = r.rid",
        f"DROP TABLE {ranks}",
    ]


def _settings(con) -> None:
    con.execute("SET enable_progress_bar = false")  # the report's output is its own


def _ingest(con, view: str, path: Path | None, limits: tuple[float, ...]) -> str | None:
    """Read one file of the view (None or not there: the same table, empty) into its table <view>_lines; the name of
    the table of lines the scan itself set aside (line, error_message), or None when it set none aside. A view with a
    send order (SEQ_ORDER) has its accepted rows numbered by it in column SEQ."""
    table, spec, order = f"{view}_lines", SPECS[view], SEQ_ORDER.get(view)
    if path is None or not path.exists():
        for statement in _ingest_sql(table, None, spec, None, limits, order):
            con.execute(statement)
        return None
    if _ingest_clean(con, table, path, spec, limits, order):
        return None
    try:
        for statement in _ingest_sql(table, path, spec, None, limits, order):
            con.execute(statement)
        return None
    except engine().InvalidInputException:
        # A line that is not UTF-8 text (or is past the line size) fails the parallel scan: read again, one
        # thread, with the scan setting such lines aside (and counting them).
        con.execute(f"DROP TABLE IF EXISTS {table}")
        con.execute(f"DROP TABLE IF EXISTS {table}_checks")
        rejects = f"{table}_rejects"
        for statement in _ingest_sql(table, path, spec, rejects, limits, order):
            con.execute(statement)
        # The scan's own table is a temporary one: kept with the lines it describes.
        con.execute(f"CREATE TABLE {table}_set_aside AS SELECT line, error_message FROM {rejects}_errors")
        return f"{table}_set_aside"


_BUILDING = "building"  # the index being built, attached under this name as the connection's default database


def _open_index(partial: Path, config: dict) -> object:
    """A connection whose default database is a new index file at partial, its row groups INDEX_ROW_GROUP_ROWS."""
    duckdb = engine()

    con = duckdb.connect(":memory:", config=config)
    try:
        _settings(con)
        con.execute(f"ATTACH {_q(str(partial))} AS {_BUILDING} (ROW_GROUP_SIZE {INDEX_ROW_GROUP_ROWS})")
        con.execute(f"USE {_BUILDING}")
    except duckdb.Error:
        con.close()
        raise
    return con


class UnreadableRun(ValueError):
    """A run folder this reader will not open (a FIFO where a JSONL should be): one line for the terminal."""


def regular(path: Path) -> bool:
    """Whether `path` is a regular file (following a link): never open a FIFO, a device or a folder as a record."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


# --- the run's index: the JSONL read once, kept beside it (runcontract.INDEX) ---
INDEX_MIN_MB = 32  # the RUN_INDEX_MIN_MB knob's default: smaller runs (~16,000 requests) read fast from the JSONL
_INDEX_FORMAT = "3"  # raise when what the index holds changes in a way the reading rules' text does not show
_ABSENT = "absent"
_ENDS_BYTES = 64 << 10  # the head and the tail of each JSONL that the index's stamp hashes


def index_memory_limit() -> str:
    """The index build's memory limit: RUN_INDEX_MEMORY_MB, else INDEX_MEMORY_LIMIT. A higher one builds faster and
    peaks higher (docs/pieces.md has both measured)."""
    from servescope.contracts import knobs

    setting = knobs.get("RUN_INDEX_MEMORY_MB", "").strip()
    if not setting:
        return INDEX_MEMORY_LIMIT
    try:
        megabytes = int(setting)
    except ValueError:
        megabytes = 0
    if megabytes < 64:
        raise ValueError(f"RUN_INDEX_MEMORY_MB={setting!r}: expected whole megabytes, at least 64")
    return f"{megabytes}MB"


def _wants_index(folder: Path) -> bool:
    """A run worth an index: its requests.jsonl at or past RUN_INDEX_MIN_MB (`off`: never)."""
    from servescope.contracts import knobs

    setting = knobs.get("RUN_INDEX_MIN_MB", "").strip().lower() or str(INDEX_MIN_MB)
    if setting == "off":
        return False
    try:
        threshold = float(setting) * (1 << 20)
    except ValueError:
        raise ValueError(f"RUN_INDEX_MIN_MB={setting!r}: expected megabytes or off") from None
    requests = folder / runcontract.REQUESTS
    return requests.exists() and requests.stat().st_size >= threshold


def _stamps(folder: Path) -> dict[str, str]:
    """Each file's size, modification time (what changes when a run appends) and a hash of its head and tail (what
    an edit in place that keeps both changes, at either end), or absent."""
    stamps = {}
    for name in VIEWS:
        try:
            with open(folder / name, "rb") as fh:
                st = os.fstat(fh.fileno())
                digest = hashlib.sha256(fh.read(_ENDS_BYTES))
                if st.st_size > _ENDS_BYTES:
                    fh.seek(max(_ENDS_BYTES, st.st_size - _ENDS_BYTES))
                    digest.update(fh.read(_ENDS_BYTES))
            stamps[name] = f"{st.st_size}:{st.st_mtime_ns}:{digest.hexdigest()[:32]}"
        except FileNotFoundError:
            stamps[name] = _ABSENT
    return stamps


def _fingerprint() -> str:
    """The reading rules and the engine that applied them: an index made under others is made again."""
    duckdb = engine()

    text = [_INDEX_FORMAT, duckdb.__version__]
    for view, spec in SPECS.items():
        text += _ingest_sql(f"{view}_lines", None, spec, None, (), SEQ_ORDER.get(view))
        text += _clean_sql(f"{view}_lines", Path("-"), spec, (), SEQ_ORDER.get(view))
    return hashlib.sha256("\n".join(text).encode()).hexdigest()


def _seal_path(index: Path) -> Path:
    return index.with_name(runcontract.INDEX_SEAL)


def _checksum(index: Path) -> str:
    """The index file's CRC-32, read whole (2.4 GB/s here: 0.06 s for 51,200 requests' index, a twentieth of the
    report that opens it; reading every column back through the engine took 0.43 s)."""
    crc = 0
    with open(index, "rb") as fh:
        while block := fh.read(1 << 20):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def _seal(index: Path) -> None:
    """Beside the index, what it was when made or last read whole: size, modification time, checksum. Best effort:
    a reader without it reads the index whole first (a folder that takes no writes keeps none)."""
    from servescope.contracts.folder_writes import write_file

    try:
        st = os.stat(index)
        seal = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "crc32": _checksum(index)}
        write_file(_seal_path(index), json.dumps(seal) + "\n")
    except OSError:
        pass


def _sealed(index: Path) -> bool | None:
    """Whether the index is byte for byte what it was sealed as: True, False (its checksum differs: damaged where no
    writer went, a flip on the disk, a copy that kept its times), or None (no seal that describes the file as it is
    now: read it whole to know)."""
    try:
        with open(_seal_path(index), "rb") as fh:
            seal = json.loads(fh.read(4096))
        st = os.stat(index)
        if not isinstance(seal, dict) or [seal.get("size"), seal.get("mtime_ns")] != [st.st_size, st.st_mtime_ns]:
            return None
        return seal.get("crc32") == _checksum(index)
    except (OSError, ValueError):
        return None


def _meta_problem(meta: dict[str, str]) -> str | None:
    """The index's own description read as a schema, like a record (a crafted or damaged one is never trusted with
    the reader's state): limits a list of finite numbers, each file's stamp text, each set-aside table its name."""
    try:
        limits = json.loads(meta.get("limits", ""))
        if not isinstance(limits, list) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in limits
        ):
            return "its limits are not a list of numbers"
    except (TypeError, ValueError):
        return "its limits are not JSON"
    for name, view in VIEWS.items():
        if not isinstance(meta.get(f"file {name}"), str):
            return f"no stamp of {name}"
        if meta.get(f"set aside {name}") not in ("", f"{view}_set_aside"):
            return f"no set-aside table of {name}"
    return None


def _attach(con, index: Path) -> tuple[dict[str, str] | None, str | None]:
    """Attach the run's index to con as `run`: (what it says of itself, None) if it was made by these rules from the
    files as they are now. Else it is left detached: (None, None) when there is none or it is stale or foreign (made
    from other files or under other rules: read again, nothing to say), (None, why) when it cannot be read.

    DuckDB checks each block's checksum when a query reads it, so a damaged block would fail the report halfway.
    An index is used as it is only when its seal beside it (size, modification time, CRC-32) describes it byte for
    byte; one without such a seal (written to since it was made, its seal gone) is read whole here first: every
    column of every table it holds, as the tables it must be, and sealed again. A damage that kept the file's size
    and times (a flip on the disk, a copy) fails its checksum: made again."""
    try:
        mode = os.stat(index).st_mode
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, _why(exc)
    if not stat.S_ISREG(mode):
        return None, "not a regular file"  # a FIFO would hold the reader forever
    duckdb = engine()

    problem = None
    try:
        con.execute(f"ATTACH {_q(str(index))} AS run (READ_ONLY)")
        meta = dict(con.execute("SELECT name, value FROM run.index_meta").fetchall())
        current = meta.get("fingerprint") == _fingerprint() and all(
            meta.get(f"file {n}") == v for n, v in _stamps(index.parent).items()
        )
        if current:
            problem = _meta_problem(meta)
        if current and problem is None:
            sealed = _sealed(index)
            if sealed is False:
                problem = "its checksum is not the one it was sealed with"
            elif sealed is None:
                problem = _verify(con, meta)
                if problem is None:
                    _seal(index)  # read whole and sound: the next reader need not
    except (duckdb.Error, OSError, ValueError, TypeError) as exc:
        current, problem = False, _why(exc)
    if current and problem is None:
        return meta, None
    con.execute("DETACH DATABASE IF EXISTS run")
    return None, problem


def _verify(con, meta: dict[str, str]) -> str | None:
    """Read every value of the attached index (its blocks' checksums are checked as they are read): why it cannot
    be used, or None. Its tables must be tables (not views of something else) with the columns this reader makes."""
    kinds = dict(
        con.execute(
            "SELECT table_name, 'table' FROM duckdb_tables() WHERE database_name = 'run' "
            "UNION ALL SELECT view_name, 'view' FROM duckdb_views() WHERE database_name = 'run'"
        ).fetchall()
    )
    tables = [f"{view}_lines" for view in VIEWS.values()]
    tables += [meta[f"set aside {name}"] for name in VIEWS if meta.get(f"set aside {name}")]
    for table in tables:
        if kinds.get(table) != "table":
            return f"no table {table}"
        columns = [
            row[0]
            for row in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE database_name = 'run' AND table_name = ?", [table]
            ).fetchall()
        ]
        con.execute(f"SELECT count(*), {', '.join(f'sum(hash({c}))' for c in columns)} FROM run.{table}").fetchall()
    return None


def _why(exc: Exception) -> str:
    return (getattr(exc, "strerror", None) or str(exc)).splitlines()[0]


class RunData:
    """A run folder's JSONL files read into DuckDB: per file a table <view>_lines (a row per line: the reason it was
    refused, '' for a blank line, or NULL) and a view of the accepted lines (VIEWS), numbered in the report's order
    (SEQ).

    A run whose requests.jsonl passes the index threshold (INDEX_MIN_MB) is read once into the run's index
    (runcontract.INDEX, beside the JSONL it copies) and every later reader opens that instead of parsing the JSON again,
    as long as the index was made by this reader from the files as they are now (their sizes and modification times,
    and a fingerprint of the reading rules). The JSONL stays the record: the index can be deleted at any time."""

    def __init__(
        self,
        folder: Path,
        files: tuple[str, ...] = (runcontract.REQUESTS, runcontract.PHASES),
        memory_limit: str = MEMORY_LIMIT,
        limits: tuple[float, ...] = (),
    ):
        """limits: each number list's values at or under each are counted while the list is in memory (columns
        within(name, i)): a question asked of every value (an SLO's gap limit) then costs a column, not a pass. A run
        read from its index has the limits the index was made with (self.limits)."""
        self.folder = Path(folder)
        self.limits = tuple(float(x) for x in limits)
        self.skips = Skips()
        for name in VIEWS:
            path = self.folder / name
            if os.path.lexists(path) and not regular(path):
                raise UnreadableRun(f"{path}: not a regular file: a run's records are files")
        self._tmp = tempfile.mkdtemp(prefix="servescope-run-")
        size = sum((self.folder / name).stat().st_size for name in files if (self.folder / name).exists())
        self._size = size
        self._config = {"memory_limit": memory_limit, "temp_directory": str(Path(self._tmp) / "spill")}
        if size < ONE_THREAD_BYTES:
            self._config["threads"] = 1  # a few hundred records: a second thread costs more than it parses
        duckdb = engine()

        index, meta = self.folder / runcontract.INDEX, None
        if runcontract.REQUESTS in files and _wants_index(self.folder):
            self.con = duckdb.connect(":memory:", config=self._config)
            _settings(self.con)
            meta, problem = _attach(self.con, index)
            # A folder that takes no writes (read-only, frozen) is read without one, silently: nothing to say there.
            if meta is None and os.access(self.folder, os.W_OK) and self._make_index(index, quiet=problem is not None):
                meta, _ = _attach(self.con, index)
            if problem is not None:  # damaged: the JSONL is the record, the index only a copy of it
                what = "rebuilt" if meta is not None else "read from the JSONL without it"
                print(f"run folder {self.folder}: index unreadable ({problem}): {what}", file=sys.stderr)
            if meta is None:
                self.con.close()
        if meta is not None:
            self.limits = tuple(json.loads(meta["limits"]))
            tables = {name: f"run.{view}_lines" for name, view in VIEWS.items()}
            read = {name: meta[f"file {name}"] != _ABSENT for name in VIEWS}
            set_aside = {
                name: f"run.{meta[f'set aside {name}']}" if meta[f"set aside {name}"] else None for name in VIEWS
            }
        else:
            # Small runs are read into memory. A run whose records would not fit in the memory limit goes to a
            # database file in the temporary directory instead: the engine writes it compressed as it reads,
            # where memory would spill uncompressed pages to disk and read them back on every pass: reading takes as
            # long, and every later pass over the gaps is faster. Below the threshold memory reads faster
            # (bench/report_scale.py measures both; docs/pieces.md has the figures).
            database = str(Path(self._tmp) / "run.duckdb") if size > FILE_BACKED_BYTES else ":memory:"
            self.con = duckdb.connect(database, config=self._config)
            _settings(self.con)
            tables = {name: f"{view}_lines" for name, view in VIEWS.items()}
            read = {name: name in files and (self.folder / name).exists() for name in VIEWS}
            set_aside = {
                name: _ingest(self.con, view, self.folder / name if read[name] else None, self.limits)
                for name, view in VIEWS.items()
            }
        self._closer = weakref.finalize(self, _remove, self.con, self._tmp)
        for name, view in VIEWS.items():
            self._view(view, tables[name])
            if name in files and read[name]:
                self._count_skips(tables[name], name, set_aside[name])

    def close(self) -> None:
        self._closer()

    def _view(self, view: str, table: str) -> None:
        seq = "" if view in SEQ_ORDER else f"rowid + 1 AS {SEQ}, "  # numbered as read (SEQ_ORDER), else by line
        self.con.execute(f"CREATE VIEW {view} AS SELECT {seq}* EXCLUDE (raw, reason) FROM {table} WHERE reason IS NULL")

    def _make_index(self, index: Path, quiet: bool = False) -> bool:
        """Read every file of the run into a new index beside them (written under a temporary name, renamed when
        complete: a reader never sees half of one), sealed with the modification time it records. False, and nothing
        left behind, where the folder refuses it (one line unless `quiet`: the caller says it)."""
        duckdb = engine()

        partial = index.with_name(f".{index.name}.{os.getpid()}.{threading.get_ident()}.partial")
        # Whole, even seconds: a time every file system keeps exactly (FAT's is two seconds).
        sealed = (int(time.time()) // 2 * 2) * 1_000_000_000
        try:
            stamps = _stamps(self.folder)  # before reading: a file that grows meanwhile leaves a stale index
            config = {k: v for k, v in self._config.items() if k != "threads"}
            # A caller's own limit stands; so does the reading limit for a run past FILE_BACKED_BYTES.
            if config["memory_limit"] == MEMORY_LIMIT and self._size <= FILE_BACKED_BYTES:
                config["memory_limit"] = index_memory_limit()
            con = _open_index(partial, config)
            try:
                # Written once, read by every later report: compressing it cost a third of the build (51,200
                # requests: bench/report_scale.py), for a file a quarter smaller. Its readers do not decompress either.
                con.execute("SET force_compression = 'uncompressed'")
                meta = {"fingerprint": _fingerprint(), "limits": json.dumps(self.limits), "sealed": str(sealed)}
                for name, view in VIEWS.items():
                    path = self.folder / name
                    rejects = _ingest(con, view, path if path.exists() else None, self.limits)
                    meta[f"file {name}"] = stamps[name]
                    meta[f"set aside {name}"] = rejects or ""
                con.execute("CREATE TABLE index_meta (name VARCHAR, value VARCHAR)")
                con.executemany("INSERT INTO index_meta VALUES (?, ?)", list(meta.items()))
                con.execute(f"CHECKPOINT {_BUILDING}")
            finally:
                con.close()
            os.utime(partial, ns=(sealed, sealed))
            os.replace(partial, index)
            _seal(index)
            return True
        except (OSError, duckdb.Error) as exc:
            if not quiet:
                print(f"run folder {self.folder}: no index kept ({_why(exc)}); read without one", file=sys.stderr)
            return False
        finally:
            for leftover in (partial, partial.with_name(partial.name + ".wal")):
                leftover.unlink(missing_ok=True)

    def _count_skips(self, table: str, name: str, set_aside: str | None) -> None:
        """Refused lines by reason, at their physical line numbers (a line the scan set aside shifts the rest)."""
        rejected = (
            self.con.execute(f"SELECT line, error_message FROM {set_aside} ORDER BY line").fetchall()
            if set_aside
            else []
        )
        shifts = [line for line, _ in rejected]

        def physical(n: int) -> int:
            for line in shifts:
                if line <= n:
                    n += 1
            return n

        # The last line read (blank lines have no row left: the highest line number, not the count of rows).
        last = max(
            [
                physical(
                    self.con.execute(
                        f"SELECT coalesce(max(rowid) + 1, 0) FROM {table} WHERE reason IS DISTINCT FROM ''"
                    ).fetchone()[0]
                )
            ]
            + shifts
        )
        found: dict[str, list] = {}
        for line, message in rejected:
            reason = TORN if line == last else _rejected_reason(message)
            entry = found.setdefault(reason, [0, []])
            entry[0] += 1
            entry[1].append(line)
        rows = self.con.execute(
            f"SELECT reason, count(*), list(rowid + 1 ORDER BY rowid)[:{Skips.SHOW_LINES}], max(rowid + 1) "
            f"FROM {table} WHERE reason <> '' GROUP BY reason ORDER BY min(rowid)"
        ).fetchall()
        for reason, count, lines, highest in rows:
            lines = [physical(n) for n in lines]
            if reason == NOT_JSON and physical(highest) == last:
                # A run killed mid-write leaves at most one torn last line: skip it, keep the rest.
                torn = found.setdefault(TORN, [0, []])
                torn[0] += 1
                torn[1].append(last)
                count -= 1
                lines = [n for n in lines if n != last]
                if not count:
                    continue
            entry = found.setdefault(reason, [0, []])
            entry[0] += count
            entry[1].extend(lines)
        for reason, (count, lines) in sorted(found.items(), key=lambda kv: min(kv[1][1] or [math.inf])):
            self.skips.add(name, reason, count, sorted(lines)[: Skips.SHOW_LINES])

    def records(
        self,
        view: str,
        cls,
        where: str = "",
        params: list | None = None,
        order: str = SEQ,
        con=None,
        skip: tuple[str, ...] = (),
    ) -> Iterator:
        """The accepted rows of a view as contract dataclasses, in batches (small selections: each is a Python
        object). con: a cursor with views of its own (a run with phases left out); skip: fields left at their
        default instead of being fetched."""
        spec = SPECS[view]
        names = [f.name for f in spec if f.name not in skip]
        objects = {f.name: f.default for f in spec if f.kind == "object" and f.name not in skip}
        cur = con if con is not None else self.con.cursor()
        cur.execute(
            f"SELECT {', '.join(names)} FROM {view} {('WHERE ' + where) if where else ''} ORDER BY {order}",
            params or [],
        )
        while batch := cur.fetchmany(10_000):
            for row in batch:
                data = dict(zip(names, row, strict=True))
                for name, default in objects.items():
                    data[name] = json.loads(data[name]) if data[name] is not None else (None if default is None else {})
                yield cls(**data)


def _rejected_reason(message: str) -> str:
    """A line the line scan itself refused, in a few words (not the message: one reason line per kind)."""
    if "unicode" in message.lower():
        return "not UTF-8 text"
    if "maximum line size" in message.lower():
        return f"a line longer than {_MAX_LINE_BYTES >> 20} MB"
    return "an unreadable line"


def _remove(con, tmp: str) -> None:
    con.close()
    shutil.rmtree(tmp, ignore_errors=True)
