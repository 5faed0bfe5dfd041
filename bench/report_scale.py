"""`make report` at scale: wall time and peak memory of `python -m servescope.report` on generated run folders of 51,200 (and,
with --sizes 51200,1000000, 1,000,000) requests x 256 tokens, written as the load generator writes them.

Each folder is reported on first without its index (the report makes it: a folder from merged workers, an import,
an older run) and then with it, --repeat times each (the goal, GOALS, is judged on the median wall time and the
largest peak), and once with no index kept (RUN_INDEX_MIN_MB=off). The folder's size and bytes per gap are printed
beside them: a bench whose records are smaller than a real run's measures a lighter report."""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from itertools import islice
from pathlib import Path

from servescope.contracts import knobs
from servescope.contracts.runfolder import INDEX, REQUESTS, PhaseRecord, RequestRecord, RunFolder
from servescope.text import numbers

REPO = Path(__file__).resolve().parent.parent
CACHE = knobs.path("SERVESCOPE_CACHE") / "bench" / "report-scale"  # generated once, reused (gigabytes at 1 M)
GENERATOR_VERSION = 3  # bump when the generated records change: cached folders are rebuilt
OLD_REPORT = "6364460"  # the last commit whose report held every record in Python lists
T0 = 1796000000.0
RATE_PER_S = 300.0  # requests sent per second, spread over the engines
GOALS = {51_200: (3.0, 500), 1_000_000: (30.0, 2048)}  # requests -> (wall s, peak RSS MiB), with or without index
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


UPTIME_S = 4 * 86400.0  # where the generated perf_counter stamps start: a host up four days
CHUNK = 2048  # requests generated per task (each from its own seeded stream: the folder is the same however split)


def records(first: int, count: int, tokens: int) -> str:
    """Requests first .. first+count-1 as requests.jsonl lines, as the load generator makes and writes them: stamps
    on a perf_counter-like clock through loadgen.client.Measurement (so each gap is a difference of two stamps, a
    full float), the record built as loadgen/locustfile.py builds it and written by RequestRecord.to_json.

    Two engines, one open-loop phase each; gaps 4-34 ms with a slow tail (one in 50 up to 10x); 0.5% fail (a 503
    without chunks, or a stream cut a third of the way)."""
    import numpy

    from loadgen.client import ErrorKind, Measurement, StreamError

    rng = numpy.random.default_rng([first // CHUNK, tokens])
    gaps = 0.004 + rng.random((count, tokens - 1)) * 0.03
    gaps *= numpy.where(rng.random((count, tokens - 1)) < 0.02, 1 + rng.random((count, tokens - 1)) * 9, 1.0)
    ttft = 0.04 + rng.random(count) * 0.12
    failed = rng.random(count) < 0.005
    lines = []
    for row in range(count):
        i = first + row
        engine = "vllm" if i % 2 == 0 else "llamacpp"
        scheduled = T0 + i / RATE_PER_S
        t_send = UPTIME_S + i / RATE_PER_S + 0.0002
        m = Measurement(started_at=scheduled + 0.0002, t_send=t_send)
        chunks = tokens if not failed[row] else (0 if i % 2 == 0 else tokens // 3)
        if chunks:
            stamps = t_send + ttft[row] + numpy.concatenate(([0.0], numpy.cumsum(gaps[row, : chunks - 1])))
            m.content_times = stamps.tolist()
        if not failed[row]:
            m.status, m.usage_tokens, m.prompt_tokens, m.tokens_source, m.finished = 200, tokens, 24, "usage", True
            if engine == "llamacpp":
                generation_ms = (m.e2e_s - m.ttft_s) * 1000
                m.engine_stats = {
                    "timings": {
                        "cache_n": 0,
                        "prompt_n": 24,
                        "prompt_ms": round(ttft[row] * 1000, 3),
                        "predicted_n": tokens,
                        "predicted_ms": round(generation_ms, 3),
                        "predicted_per_second": round(tokens / (generation_ms / 1000), 3),
                    }
                }
        elif i % 2 == 0:
            m.status = 503
            m.fail(StreamError(ErrorKind.HTTP_5XX, "HTTP 503: server busy"))
        else:
            m.status, m.tokens_source = 200, "chunks"
            m.fail(StreamError(ErrorKind.STREAM_CUT, f"stream ended without [DONE] after {chunks} content chunks"))
        record = RequestRecord(
            engine=engine,
            instance=engine,
            scenario="rate",
            phase=f"rate-{RATE_PER_S:g}rps",
            api="openai",
            model=MODEL,
            prompt_set=f"synthetic:{tokens}",
            prompt_set_sha256="5e" * 32,
            prompt_id=f"p{(i // 2) % 64}",  # both engines get every prompt
            max_tokens=tokens,
            scheduled_at=scheduled,
            **m.record_fields(),  # the load generator's own fields, so the bench cannot drift from a real run
        )
        lines.append(record.to_json() + "\n")  # RunFolder.append_request's line
    return "".join(lines)


def generate(path: Path, requests: int, tokens: int) -> None:
    """A run folder as the load generator writes it (records()), the same each time; its chunks made on every core."""
    from concurrent.futures import ProcessPoolExecutor

    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    folder = RunFolder.create(tmp.parent, tmp.name)
    starts = range(0, requests, CHUNK)
    with open(tmp / REQUESTS, "w", encoding="utf-8") as out, ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        for text in pool.map(records, starts, [min(CHUNK, requests - s) for s in starts], [tokens] * len(starts)):
            out.write(text)
    for engine, first in (("vllm", 0), ("llamacpp", 1)):
        n = len(range(first, requests, 2))
        start, end = T0 + first / RATE_PER_S, T0 + (requests - 1) / RATE_PER_S + 8.5
        folder.append_phase(
            PhaseRecord(
                engine,
                engine,
                "rate",
                f"rate-{RATE_PER_S:g}rps",
                start,
                end,
                n,
                1,
                f"synthetic:{tokens}",
                "5e" * 32,
                tokens,
            )
        )
    folder.write_manifest(
        {
            "run_id": path.name,
            "tool": "bench/report_scale.py",
            "command": f"generated: {requests} requests x {tokens} tokens",
            "status": "complete",
            "started_at": T0,
            "engines": {
                "vllm": {"kind": "vllm", "model": MODEL, "quantization": "float32"},
                "llamacpp": {"kind": "llamacpp", "model": MODEL, "quantization": "Q4_1"},
            },
        }
    )
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


KEEP_MAX = 100_000  # folders up to this many requests are kept in CACHE and reused; larger ones (1 M: gigabytes) are
#                     generated in the temporary directory and deleted once measured, unless --keep (or an earlier
#                     --keep) put one in CACHE: a measurement then does not wait minutes for it


def kept(requests: int, tokens: int, keep: bool = False) -> bool:
    """Whether this size's folder lives in CACHE (made there if missing) rather than in a temporary directory."""
    return requests <= KEEP_MAX or keep or (CACHE / folder_name(requests, tokens) / "manifest.json").exists()


def folder_name(requests: int, tokens: int) -> str:
    return f"v{GENERATOR_VERSION}-{requests}x{tokens}"


def folder_for(requests: int, tokens: int, where: Path) -> Path:
    path = where / folder_name(requests, tokens)
    for stale in where.glob(f"v*-{requests}x{tokens}*"):
        if stale != path:  # an older generator's folder: gigabytes nobody will read again
            shutil.rmtree(stale, ignore_errors=True)
    if not (path / "manifest.json").exists():
        started = time.monotonic()
        print(f"generating {path} ...", flush=True)
        where.mkdir(parents=True, exist_ok=True)
        generate(path, requests, tokens)
        print(
            f"  {time.monotonic() - started:.1f}s, requests.jsonl {numbers.file_size((path / REQUESTS).stat().st_size)}",
            flush=True,
        )
    return path


def bytes_per_gap(lines: Iterable[str]) -> float:
    """Bytes of requests.jsonl text per inter-token gap (its comma included) over these lines' itl_s lists."""
    text = gaps = 0
    for line in lines:
        itl = json.loads(line)["itl_s"]
        text += len(json.dumps(itl, separators=(",", ":"))) - 2  # the brackets are the list's, not a gap's
        gaps += len(itl)
    return text / gaps if gaps else float("nan")


def old_report_code() -> Path | None:
    """The list-based report (report/ and servescope/ at OLD_REPORT) in a temporary directory, or None."""
    where = Path(tempfile.mkdtemp(prefix="servescope-old-report-"))
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", OLD_REPORT, "report", "servescope", ".env.example"],
        capture_output=True,
    )
    if archive.returncode != 0:
        shutil.rmtree(where)
        return None
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    compiled(where)
    return where


def compiled(code_dir: Path) -> Path:
    """code_dir's report and servescope compiled to bytecode, as pip compiles an installed package: with
    PYTHONDONTWRITEBYTECODE set (these machines set it) every report would otherwise compile its modules again,
    a cost of the environment that no report pays twice elsewhere."""
    for package in ("report", "servescope"):
        compileall.compile_dir(code_dir / package, quiet=1)
    return code_dir


# Runs the report as its only child. CPU s: RUSAGE_CHILDREN, the report and what it waited for (its figure painter).
# Peak memory: the larger of the largest process's ru_maxrss and the peak of the whole tree's RSS (the report plus
# its painter, read from /proc every 20 ms), so that two processes cannot hide half their memory.
_MEASURE = """
import json, os, resource, subprocess, sys, threading, time
def tree_kib(pid):
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass
    return total
started = time.monotonic()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
peak = [0]
def watch():
    while proc.poll() is None:
        peak[0] = max(peak[0], tree_kib(proc.pid))
        time.sleep(0.02)
threading.Thread(target=watch, daemon=True).start()
err = proc.communicate()[1]
wall = time.monotonic() - started
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "peak_kib": max(usage.ru_maxrss, peak[0]),
                  "rc": proc.returncode, "err": err[-4000:]}))
"""


def measure(code_dir: Path, run: Path, index: bool = True) -> tuple[float, float, float, int, str]:
    """(wall s, CPU s, peak RSS MiB, exit code, last stderr line) of `python -m servescope.report` on run, from code_dir."""
    with socket.socket() as sock:  # a port nothing listens on: the report notes "no gauge data" and goes on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    return _timed(code_dir, ["-m", "servescope.report", "--run", str(run), "--prometheus", closed], index)


def _timed(code_dir: Path, args: list[str], index: bool) -> tuple[float, float, float, int, str]:
    env = {**os.environ, "RUN_INDEX_MIN_MB": "" if index else "off"}
    command = [sys.executable, *args]
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, *command], cwd=code_dir, capture_output=True, text=True, env=env
    )
    result = json.loads(out.stdout)
    last = (result["err"].strip().splitlines() or [""])[-1]
    return result["wall"], result["cpu"], result["peak_kib"] / 1024, result["rc"], last


def print_row(n: int, label: str, results: list[tuple], goal: tuple[float | None, int | None] = (None, None)) -> int:
    """Print one measured step (the median wall time of its runs, the largest peak); 1 when a run failed (its exit
    code and last line printed under it)."""
    walls = sorted(r[0] for r in results)
    median = walls[len(walls) // 2]
    cpu = sorted(r[1] for r in results)[len(results) // 2]
    rss = max(r[2] for r in results)
    goal_s, goal_mib = goal
    verdict = ""
    if goal_s is not None:
        met = median <= goal_s and (goal_mib is None or rss <= goal_mib)
        verdict = f"<= {goal_s:g} s" + (f", <= {goal_mib} MiB" if goal_mib else "") + (" met" if met else " NOT met")
    runs = f"{min(walls):.1f}/{median:.1f}" if len(walls) > 1 else f"{median:.1f}"
    print(f"{n:>10,} {label:<40} {runs:>11} {cpu:>6.1f} {rss:>9.0f}  {verdict}", flush=True)
    failed = 0
    for *_, rc, last in results:
        if rc != 0:
            print(f"  exit {rc}: {last}")
            failed = 1
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report_scale", description=__doc__)
    parser.add_argument(
        "--sizes",
        default="51200",
        help="requests per generated run folder (51200,1000000 adds the 1 M folder: ~6 GB, minutes to generate)",
    )
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--old", action="store_true", help=f"also the list-based report ({OLD_REPORT})")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each report (the median is judged)")
    parser.add_argument(
        "--keep", action="store_true", help=f"keep folders past {KEEP_MAX:,} requests in {CACHE} too (1 M: ~6 GB)"
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    print(
        f"python -m servescope.report on generated run folders ({args.tokens} tokens per request, records written as the load "
        f"generator writes them, two engines, 0.5% failed); no Prometheus. {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.2f} (wall time stretches with it; CPU s: user + system of the report process, its "
        f"threads and its figure painter process). Peak RSS: the report and its painter together (sampled every "
        f"20 ms), or the largest process's ru_maxrss if higher. Wall s: min/median of --repeat runs."
    )
    compiled(REPO)
    old = old_report_code() if args.old else None
    print(f"{'requests':>10} {'step':<40} {'wall s':>11} {'CPU s':>6} {'peak MiB':>9}  goal")
    failures = 0
    try:
        for n in sizes:
            scratch = (
                None if kept(n, args.tokens, args.keep) else Path(tempfile.mkdtemp(prefix="servescope-report-scale-"))
            )
            try:
                run = folder_for(n, args.tokens, scratch or CACHE)
                with open(run / REQUESTS, encoding="utf-8") as fh:
                    per_gap = bytes_per_gap(islice(fh, 2000))
                folder = sum(f.stat().st_size for f in run.iterdir() if f.is_file() and f.name != INDEX)
                print(
                    f"{n:>10,} run folder {folder / 2**20:,.0f} MiB (requests.jsonl {numbers.file_size((run / REQUESTS).stat().st_size)}), "
                    f"{per_gap:.1f} bytes per gap (measured on its first 2,000 records)",
                    flush=True,
                )
                failures += _measure_folder(n, run, args.repeat, old)
            finally:
                if scratch is not None:
                    shutil.rmtree(scratch, ignore_errors=True)
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return 1 if failures else 0


def _measure_folder(n: int, run: Path, repeat: int, old: Path | None) -> int:
    goal = GOALS.get(n, (None, None))
    # The host's speed drifts on a shared machine: each report runs `repeat` times, first (no index: it makes one)
    # and second (opens it) in turn, and the goal is judged on the median.
    first, second = [], []
    for _ in range(repeat):
        (run / INDEX).unlink(missing_ok=True)
        first.append(measure(REPO, run))
        if not (run / INDEX).exists():
            print("  no index made by the first report")
            return 1
        second.append(measure(REPO, run))
    failures = print_row(n, "first report (no index yet: makes it)", first, goal)
    failures += print_row(n, "second report (opens the index)", second, goal)
    if second[-1][3] == 0:  # read before another report writes its own report.json over it
        groups = json.loads((run / "report.json").read_text())["latency"]["groups"]
        itl = {g["instance"]: g["metrics"]["itl_s"] for g in groups}
        print(
            "  ITL p50/p99 ms: "
            + ", ".join(f"{i} {m['p50'] * 1000:.3f}/{m['p99'] * 1000:.3f} (n={m['n']:,})" for i, m in itl.items())
        )
    failures += print_row(n, "report, no index kept (RUN_INDEX_MIN_MB=off)", [measure(REPO, run, index=False)])
    # The list-based report holds every record as Python objects, more memory than a 1 M-request run leaves: it runs
    # on the small folder only.
    if old is not None and n <= KEEP_MAX:
        failures += print_row(n, f"report, lists ({OLD_REPORT})", [measure(old, run)])
    return failures


if __name__ == "__main__":
    sys.exit(main())
