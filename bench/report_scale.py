"""`make report` at scale: wall time and peak memory of `python -m report` on generated run folders of 51,200 and
1,000,000 requests x 256 tokens (goals: 3 s; 30 s and 2 GB), beside the list-based report it replaced.

A run ends with the load generator's summary table, which reads the run folder as the report does and leaves the
run's index (servescope/runreader.py) beside its JSONL; the report then opens the index. Each size is measured that
way: the summary once (timed: the run's last step), the report --repeat times (the goal is judged on their median),
and once more without an index (RUN_INDEX_MIN_MB=off: a run killed before its summary, or a folder copied without
it)."""

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
from pathlib import Path

import duckdb

from servescope import knobs
from servescope.runfolder import INDEX, REQUEST_FIELDS, REQUESTS, PhaseRecord, RunFolder

REPO = Path(__file__).resolve().parent.parent
CACHE = knobs.path("SERVESCOPE_CACHE") / "bench" / "report-scale"  # generated once, reused (~2.7 GB at 1 M)
GENERATOR_VERSION = 2  # bump when the generated records change: cached folders are rebuilt
OLD_REPORT = "6364460"  # the last commit whose report held every record in Python lists
T0 = 1796000000.0
RATE_PER_S = 300.0  # requests sent per second, spread over the engines
GOALS = {51_200: (3.0, None), 1_000_000: (30.0, 2048)}  # requests -> (wall s, peak RSS MiB)


def generate(path: Path, requests: int, tokens: int, decimals: int) -> None:
    """A run folder as the load generator writes it (two engines, one open-loop phase each, 0.5% failures), built
    by DuckDB in a few seconds: every number comes from a hash of the request index, so it is the same each time."""
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    folder = RunFolder.create(tmp.parent, tmp.name)

    def u(*parts: str) -> str:  # a uniform number in [0, 1) from the hash of its arguments
        return f"(hash({', '.join(parts)}) % 1000003) / 1000003.0"

    gaps = tokens - 1
    values = {
        "engine": "engine",
        "instance": "engine",
        "scenario": "'rate'",
        "phase": f"'rate-{RATE_PER_S:g}rps'",
        "api": "'openai'",
        "model": "'HuggingFaceTB/SmolLM2-135M-Instruct'",
        "prompt_set": f"'synthetic:{tokens}'",
        "prompt_set_sha256": "'" + "5e" * 32 + "'",
        "prompt_id": "'p' || ((i // 2) % 64)",  # both engines get every prompt
        "max_tokens": str(tokens),
        "started_at": f"{T0} + i / {RATE_PER_S}",
        "ok": "NOT failed",
        "status": "CASE WHEN failed AND i % 2 = 0 THEN 503 ELSE 200 END",
        "error": "CASE WHEN NOT failed THEN NULL WHEN i % 2 = 0 THEN 'server busy' ELSE 'stream ended without [DONE]' END",
        "ttft_s": f"round(0.04 + {u('i', '1')} * 0.12, {decimals})",
        "e2e_s": f"round(0.04 + {u('i', '1')} * 0.12, {decimals}) + list_sum(itl_s)",
        "itl_s": "itl_s",
        "tpot_s": f"CASE WHEN NOT failed THEN list_sum(itl_s) / {gaps} END",
        "output_tokens": f"CASE WHEN NOT failed THEN {tokens} END",
        "prompt_tokens": "24",
        "tokens_source": "'usage'",
        "content_chunks": "len(itl_s) + 1",
        "arrival_index": "NULL",
        "engine_stats": (
            "CASE WHEN engine = 'llamacpp' AND NOT failed THEN json_object('timings', json_object('prompt_n', 24, "
            "'prompt_ms', 11.5, 'predicted_n', "
            f"{tokens}, 'predicted_ms', round(list_sum(itl_s) * 1000, 3), 'cache_n', 0)) ELSE '{{}}'::JSON END"
        ),
    }
    assert list(values) == [f.name for f in REQUEST_FIELDS], "the generator writes every field of the contract"
    # Gaps: 4-34 ms with a slow tail (one in 50 up to 10x); a failed stream stops a third of the way.
    gap = f"round((0.004 + {u('i', 'k')} * 0.03) * CASE WHEN {u('k', 'i', '7')} < 0.02 THEN 10 ELSE 1 END, {decimals})"
    columns = ", ".join(f"{sql} AS {name}" for name, sql in values.items())
    con = duckdb.connect(config={"memory_limit": "1GB"})
    con.execute("SET enable_progress_bar = false")
    con.execute(
        f"COPY (SELECT {columns} FROM (SELECT i, failed, CASE WHEN i % 2 = 0 THEN 'vllm' ELSE 'llamacpp' END AS engine, "
        f"list_transform(range(CASE WHEN failed THEN {gaps // 3} ELSE {gaps} END), lambda k: {gap}) AS itl_s "
        f"FROM (SELECT i, {u('i', '3')} < 0.005 AS failed FROM range({requests}) t(i)))) "
        f"TO '{tmp / REQUESTS}' (FORMAT JSON)"
    )
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
            "command": f"generated: {requests} requests x {tokens} tokens, gaps rounded to {decimals} decimals",
            "status": "complete",
            "started_at": T0,
            "engines": {
                "vllm": {"kind": "vllm", "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "quantization": "float32"},
                "llamacpp": {
                    "kind": "llamacpp",
                    "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
                    "quantization": "Q4_1",
                },
            },
        }
    )
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def folder_for(requests: int, tokens: int, decimals: int) -> Path:
    path = CACHE / f"v{GENERATOR_VERSION}-{requests}x{tokens}-d{decimals}"
    for stale in CACHE.glob(f"v*-{requests}x{tokens}-d{decimals}"):
        if stale != path:  # an older generator's folder: gigabytes nobody will read again
            shutil.rmtree(stale, ignore_errors=True)
    if not (path / "manifest.json").exists():
        started = time.monotonic()
        print(f"generating {path} ...", flush=True)
        generate(path, requests, tokens, decimals)
        print(f"  {time.monotonic() - started:.1f}s, requests.jsonl {_size(path / REQUESTS)}", flush=True)
    return path


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
    """(wall s, CPU s, peak RSS MiB, exit code, last stderr line) of `python -m report` on run, from code_dir."""
    with socket.socket() as sock:  # a port nothing listens on: the report notes "no gauge data" and goes on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    return _timed(code_dir, ["-m", "report", "--run", str(run), "--prometheus", closed], index)


# What `python -m loadgen` runs last: its summary table, read back from the run folder.
_SUMMARY = """
import os, sys
from loadgen.summary import print_summary
from servescope.runfolder import RunFolder
with open(os.devnull, "w") as out:
    print_summary(RunFolder(sys.argv[1]), out)
"""


def end_of_run(run: Path) -> tuple[float, float, float, int, str]:
    """The load generator's summary on run, without an index: it makes one."""
    (run / INDEX).unlink(missing_ok=True)
    return _timed(REPO, ["-c", _SUMMARY, str(run)], index=True)


def _timed(code_dir: Path, args: list[str], index: bool) -> tuple[float, float, float, int, str]:
    env = {**os.environ, "RUN_INDEX_MIN_MB": "" if index else "off"}
    command = [sys.executable, *args]
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, *command], cwd=code_dir, capture_output=True, text=True, env=env
    )
    result = json.loads(out.stdout)
    last = (result["err"].strip().splitlines() or [""])[-1]
    return result["wall"], result["cpu"], result["peak_kib"] / 1024, result["rc"], last


def probe() -> float:
    """CPU seconds of a fixed pure-Python loop: how fast this host is right now (it drifts on a shared machine)."""
    started = time.process_time()
    total = 0
    for i in range(10_000_000):
        total += i
    return time.process_time() - started


def _size(path: Path) -> str:
    size = path.stat().st_size
    return f"{size / 2**30:.2f} GB" if size >= 2**30 else f"{size / 2**20:.0f} MB"


def _row(n: int, run: Path, label: str, result: tuple, verdict: str = "") -> int:
    """Print one measured step; 1 when it failed (its exit code and last line printed under it)."""
    wall, cpu, rss, rc, last = result
    print(
        f"{n:>10,} {_size(run / REQUESTS):>15} {label:<31} {wall:>7.1f} {cpu:>6.1f} {rss:>9.0f}  {verdict}", flush=True
    )
    if rc != 0:
        print(f"  exit {rc}: {last}")
    return int(rc != 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report_scale", description=__doc__)
    parser.add_argument("--sizes", default="51200,1000000", help="requests per generated run folder")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--decimals", type=int, default=6, help="gaps rounded to this many decimals (6: 1 us)")
    parser.add_argument("--no-old", action="store_true", help="skip the list-based report")
    parser.add_argument("--repeat", type=int, default=3, help="reports per folder (the median is judged)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    print(
        f"python -m report on generated run folders ({args.tokens} tokens per request, gaps to {args.decimals} "
        f"decimals, two engines, 0.5% failed); no Prometheus. {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.2f} (wall time stretches with it; CPU s, user + system of the report process, its "
        f"threads and its figure painter process). Peak RSS: the report and its painter together (sampled every "
        f"20 ms), or the largest process's ru_maxrss if higher."
    )
    compiled(REPO)
    old = None if args.no_old else old_report_code()
    print(f"{'requests':>10} {'requests.jsonl':>15} {'step':<31} {'wall s':>7} {'CPU s':>6} {'peak MiB':>9}  goal")
    failures = 0
    try:
        for n in sizes:
            run = folder_for(n, args.tokens, args.decimals)
            failures += _row(n, run, "loadgen's summary (makes index)", end_of_run(run))
            if not (run / INDEX).exists():
                print("  no index made")
                failures += 1
            # The host's speed drifts (the same CPU-bound loop took 1.1-2.2 s within an hour here): each run's wall
            # time is printed beside that loop's, and the goal is judged on the median of the runs.
            runs = [(probe(), *measure(REPO, run)) for _ in range(args.repeat)]
            speed, wall, cpu, rss, rc, last = sorted(runs, key=lambda r: r[1])[len(runs) // 2]
            rss = max(r[3] for r in runs)
            goal_s, goal_mib = GOALS.get(n, (None, None))
            met = (goal_s is None or wall <= goal_s) and (goal_mib is None or rss <= goal_mib)
            goal = "" if goal_s is None else f"<= {goal_s:g} s" + (f", <= {goal_mib} MiB" if goal_mib else "")
            verdict = f"{goal} {'met' if met else 'NOT met'}" if goal else ""
            failures += _row(n, run, "report (opens the index)", (wall, cpu, rss, rc, last), verdict)
            if len(runs) > 1:
                print(
                    f"  {len(runs)} runs, wall s (the reference loop's CPU s just before): "
                    + ", ".join(f"{r[1]:.1f} ({r[0]:.2f})" for r in runs)
                    + "; median shown"
                )
            if rc == 0:  # read before another report writes its own report.json over it
                summary = json.loads((run / "report.json").read_text())["latency"]["groups"]
                itl = {g["instance"]: g["metrics"]["itl_s"] for g in summary}
                print(
                    "  ITL p50/p99 ms: "
                    + ", ".join(
                        f"{i} {m['p50'] * 1000:.3f}/{m['p99'] * 1000:.3f} (n={m['n']:,})" for i, m in itl.items()
                    )
                )
            failures += _row(n, run, "report, no index (reads JSONL)", measure(REPO, run, index=False))
            # The list-based report needs ~35 GB at 1 M requests: it runs on the small folder only.
            if old is not None and n <= 100_000:
                failures += _row(n, run, f"report, lists ({OLD_REPORT})", measure(old, run))
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
