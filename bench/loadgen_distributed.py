"""Distributed load: TTFT/ITL error against the synthetic server's stamps at 256 and 1,024 streams over 4 workers, every request in the one run folder, tokens per client CPU-second, beside vLLM's client."""

from __future__ import annotations

import argparse
import math
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from bench.loadgen_accuracy import (
    Window,
    accuracy_row,
    content_aligned,
    errors_vs_server,
    loadgen_burst,
    paired_streams,
    percentile,
    vllm_available,
    vllm_bench,
)
from servescope.contracts import knobs
from servescope.contracts.runfolder import RunFolder
from tests.doubles.synthetic_openai import SyntheticProcess

# The accuracy server's timing. The truth is its own stamps (a write's, as it starts): a token every 50 ms to 1,024
# streams (~20,000 writes/s from one Python process, its threads fighting for one GIL on the cores the clients use)
# left writes seconds late and stamped well before they left; every 200 ms keeps that truth close to the wire.
TTFT_S, ITL_S, TOKENS = 0.5, 0.2, 16
CAPACITY_TOKENS = 1000
GOAL_STREAMS, GOAL_TTFT_MEDIAN_MS, GOAL_TTFT_P99_MS = 1024, 2.0, 10.0
STALL_S = 10  # each stream of the killed-worker burst waits this long after its first chunk: all are in flight
REPO = Path(__file__).resolve().parent.parent


def _servescope(
    server: SyntheticProcess, streams: int, rounds: int, tokens: int, prompts: str, workers: int
) -> tuple[list[dict], Window]:
    records, _phases, window = loadgen_burst(
        server,
        size=streams,
        bursts=rounds,
        max_tokens=tokens,
        http_client="geventhttpclient",
        prompts=prompts,
        timeout=1800,
        workers=workers,
        warmup=0,  # as vllm bench serve: the window is the load alone (connects come before a burst's barrier)
    )
    return records, window


def _split(records: list[dict], server: SyntheticProcess, prompts: str) -> str:
    """Where the TTFT error is: send stamp -> the request's arrival at the server (kernel stamp), and the server's
    first write -> the client's stamp of it (the rest). On one host both clocks are CLOCK_MONOTONIC / CLOCK_REALTIME."""
    epoch_of_monotonic = time.time() - time.monotonic()
    send, receive = [], []
    for record, stream in paired_streams(records, server.url, prompts):
        sent = (stream["t_arrival"] + epoch_of_monotonic - record["started_at"]) * 1000
        send.append(sent)
        receive.append((record["ttft_s"] - (stream["writes"][0] - stream["t_arrival"])) * 1000 - sent)
    if not send:
        return "TTFT error split: no request paired with its stream"
    return (
        f"  TTFT error split, ms p50/p99/max: send stamp -> arrival at the server {percentile(send, 0.5):.3f}/"
        f"{percentile(send, 0.99):.3f}/{max(send):.3f}; server's first write -> client's stamp "
        f"{percentile(receive, 0.5):.3f}/{percentile(receive, 0.99):.3f}/{max(receive):.3f}"
    )


def _window_row(label: str, streams: int, window: Window, extra: str = "") -> str:
    rate = window.tokens / window.wall_s if window.wall_s and window.wall_s > 0 else math.nan
    return (
        f"{label:<26} {streams:>5} {window.tokens:>8} {window.wall_s:>8.2f} {rate:>9.0f} {window.cpu_s:>7.2f} "
        f"{window.tokens_per_cpu_s:>10.0f}  {extra}"
    )


def _label(workers: int) -> str:
    return f"servescope/{workers}w" if workers else "servescope/1proc"


def _accuracy(streams: int, workers: int, rounds: int) -> tuple[str, dict | None]:
    """One servescope run against the accuracy server: its rows, and the goal's figures when it is the goal's."""
    label = _label(workers)
    prompts = f"synthetic:16x{streams}"  # one prompt per stream of a round: each record paired with its stream
    with SyntheticProcess("--ttft", str(TTFT_S), "--itl", str(ITL_S), "--tokens", str(TOKENS)) as server:
        records, _window = _servescope(server, streams, rounds, TOKENS, prompts, workers)
        ok = [r for r in records if r["ok"]]
        vs_server = errors_vs_server(ok, server.url, prompts)
        ttfts, itls = [r["ttft_s"] for r in ok], [gap for r in ok for gap in r["itl_s"]]
        row = accuracy_row(label, streams, len(ok), ttfts, itls, server.stats(), vs_server, (TTFT_S, ITL_S))
        split = _split(ok, server, prompts)
    # Every request of every worker in the one folder: as many records as requests sent, none failed.
    expected = streams * rounds
    complete = len(records) == expected == len(ok)
    by_worker = dict(sorted(Counter(r.get("worker") for r in records).items()))
    folder = f"  run folder: {len(records)}/{expected} records, {len(ok)} ok" + (
        f", by worker {by_worker}" if workers else ""
    )
    goal = None
    if vs_server[0]:
        goal = {"median": statistics.median(vs_server[0]), "p99": percentile(vs_server[0], 0.99), "complete": complete}
    return "\n".join([row, split, folder]), goal


def _vllm_accuracy(streams: int, rounds: int) -> str:
    with SyntheticProcess("--ttft", str(TTFT_S), "--itl", str(ITL_S), "--tokens", str(TOKENS)) as server:
        result, _window = vllm_bench(
            server, concurrency=streams, prompts=streams * rounds, output_len=TOKENS, timeout=1800
        )
        ttfts, itls = content_aligned(result)
        return accuracy_row(
            "vllm bench serve*", streams, result.get("completed", 0), ttfts, itls, server.stats(), truth=(TTFT_S, ITL_S)
        )


def _capacity(streams: int, client: int | str) -> tuple[str, Window, float]:
    """Tokens per client CPU-second: one burst from a server streaming CAPACITY_TOKENS as fast as it can; and the
    share of gaps that are 0 (tokens that came in one read with the one before: the more, the fewer reads)."""
    with SyntheticProcess("--ttft", "0", "--itl", "0", "--tokens", str(CAPACITY_TOKENS)) as server:
        if client == "vllm":
            result, window = vllm_bench(
                server, concurrency=streams, prompts=streams, output_len=CAPACITY_TOKENS, timeout=1800
            )
            gaps = content_aligned(result)[1]
            label = "vllm bench serve"
        else:
            records, window = _servescope(server, streams, 1, CAPACITY_TOKENS, f"synthetic:16x{streams}", client)
            gaps = [gap for r in records for gap in r["itl_s"]]
            label = _label(client)
    return label, window, (sum(1 for gap in gaps if gap == 0) / len(gaps) if gaps else math.nan)


def _killed_worker(streams: int, workers: int) -> tuple[str, bool]:
    """One burst of N streams over the workers; worker 1 is killed (SIGKILL) once every stream is in flight. Every
    request must be in the one run folder: worker 1's failed as worker_lost, the others' complete."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        SyntheticProcess("--ttft", "0.05", "--itl", "0.05", "--tokens", "8") as server,
    ):
        prompts = Path(tmp) / "prompts.txt"
        prompts.write_text("".join(f"q{i} [[fault:stall={STALL_S}]]\n" for i in range(streams)))
        command = [
            sys.executable,
            "-m",
            "loadgen",
            "burst",
            "--engine",
            f"vllm={server.url}",
            "--workers",
            str(workers),
        ]
        command += ["--burst-size", str(streams), "--prompts", str(prompts), "--max-tokens", "8", "--warmup", "0"]
        command += ["--metrics-port", "0", "--results", tmp, "--run-id", "run"]  # not --quiet: it names the workers
        proc = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "SAMPLE_INTERVAL_MS": "0"},
        )
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
        try:
            pid, deadline = None, time.monotonic() + 120
            while pid is None and time.monotonic() < deadline:
                try:
                    match = re.match(r"\[.*\] worker 1: pid (\d+)", lines.get(timeout=1))
                except queue.Empty:
                    continue
                pid = int(match.group(1)) if match else None
            while server.counters()["requests"] < streams and time.monotonic() < deadline:
                time.sleep(0.1)
            in_flight = server.counters()["requests"]
            if pid is None or in_flight < streams:
                raise RuntimeError(f"killed-worker round: worker 1 not seen or {in_flight}/{streams} streams in flight")
            os.kill(pid, signal.SIGKILL)
            rc = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        records = list(RunFolder(Path(tmp) / "run").requests())
    lost = [r for r in records if r.error_kind == "worker_lost"]
    by_worker = Counter(r.worker for r in records)
    complete = (
        rc == 0
        and len(records) == streams
        and {r.worker for r in lost} == {1}
        and len(lost) == by_worker[1]
        and all(r.ok for r in records if r.worker != 1)
    )
    return (
        f"killed worker 1 of {workers} with {streams} streams in flight: exit {rc}, {len(records)}/{streams} records "
        f"in the run folder, {len(lost)} failed worker_lost (worker 1 had {by_worker[1]}), "
        f"{sum(r.ok for r in records)} ok from the other workers: {'none lost' if complete else 'NOT complete'}"
    ), complete


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen_distributed", description=__doc__)
    parser.add_argument("--streams", default="256,1024", help="concurrent streams (burst size), comma-separated")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="bursts per level for the accuracy figures")
    parser.add_argument("--no-single", action="store_true", help="skip the one-process load generator")
    parser.add_argument("--no-vllm", action="store_true", help="skip vLLM's own client")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.streams.split(",") if x]
    with_vllm = not args.no_vllm and vllm_available() and not knobs.get("SERVESCOPE_BENCH_NO_VLLM", "")
    clients: list[int | str] = [args.workers] + ([] if args.no_single else [0])
    print(
        f"accuracy: synthetic server, TTFT {TTFT_S * 1000:.0f} ms, ITL {ITL_S * 1000:.0f} ms, {TOKENS} tokens; bursts "
        f"of N streams x {args.rounds} rounds; servescope over {args.workers} worker processes (--workers) and in "
        f"one. error = reported - truth, ms (columns as bench.loadgen_accuracy: vs configured, the server's lateness, "
        f"vs the server's own stamps). load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    )
    print(f"{'':<28}{'--- vs configured ---':^44} {'srv late':^17} {'--- vs server stamps ---':^39}")
    print(
        f"{'client':<18} {'conc':>4} {'n':>5} {'TTFT med':>10} {'TTFT p99':>10} {'ITL med':>10} {'ITL p99':>10} "
        f"{'p50':>8} {'p99':>8} {'TTFT med':>9} {'TTFT p99':>9} {'ITL med':>9} {'ITL p99':>9} {'queued':>8}"
    )
    goal: dict | None = None
    failures = 0
    for streams in levels:
        for workers in clients:
            try:
                rows, figures = _accuracy(streams, workers, args.rounds)
            except RuntimeError as exc:
                print(f"{_label(workers):<18} {streams:>4} failed: {exc}", flush=True)
                failures += 1
                continue
            print(rows, flush=True)
            if workers and streams == GOAL_STREAMS:
                goal = figures
        if with_vllm:
            try:
                print(_vllm_accuracy(streams, args.rounds), flush=True)
            except RuntimeError as exc:
                print(f"{'vllm bench serve':<18} {streams:>4} failed: {exc}", flush=True)
                failures += 1
    print(
        f"\ncapacity: synthetic server streaming {CAPACITY_TOKENS} tokens per request as fast as it can (TTFT 0, ITL "
        f"0), one burst of N streams. Window: from just before the client's first chat request to the server's last "
        f"completed stream; tokens = what the server streamed in it; CPU s = the client's process tree (master and "
        f"workers) user+system CPU in it. load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'client':<26} {'conc':>5} {'tokens':>8} {'wall s':>8} {'tok/s':>9} {'CPU s':>7} {'tok/CPU-s':>10}  "
        f"{'0 gaps':>6}"
    )
    for streams in levels:
        for client in clients + (["vllm"] if with_vllm else []):
            try:
                label, window, zero = _capacity(streams, client)
            except RuntimeError as exc:
                print(f"{client!s:<26} {streams:>5} failed: {exc}", flush=True)
                failures += 1
                continue
            print(_window_row(label, streams, window, f"{zero:>6.3f}"), flush=True)
    print(
        "0 gaps: share of inter-token gaps that are 0 (a token read with the one before it). A client that falls "
        "behind a server streaming as fast as it can reads many tokens per read and spends less CPU per token; "
        "one that keeps up reads fewer per read"
    )
    if with_vllm:
        print(
            "* vllm bench serve: TTFT and ITL under our definitions from its own per-request stamps (as in "
            "bench.loadgen_accuracy); it keeps no per-request send time, so it has no column against the server's stamps"
        )
    else:
        print("vLLM's client skipped: ~/.cache/servescope/venv-vllm or its tokenizer is missing (or --no-vllm)")
    killed = None
    if args.workers >= 2:
        try:
            line, killed = _killed_worker(max(levels), args.workers)
            print(f"\n{line}", flush=True)
        except RuntimeError as exc:
            print(f"\nkilled-worker round failed: {exc}", flush=True)
            failures += 1
    if goal is not None:
        met = goal["median"] <= GOAL_TTFT_MEDIAN_MS and goal["p99"] <= GOAL_TTFT_P99_MS and goal["complete"]
        met = met and killed is not False
        print(
            f"goal, {GOAL_STREAMS} streams over {args.workers} workers: TTFT error vs the server's stamps median "
            f"{goal['median']:+.3f} ms (<= {GOAL_TTFT_MEDIAN_MS:g}), p99 {goal['p99']:+.3f} ms (<= "
            f"{GOAL_TTFT_P99_MS:g}), every request in the one run folder: {'yes' if goal['complete'] else 'NO'}, "
            f"none lost with a worker killed: {'n/a' if killed is None else 'yes' if killed else 'NO'}: "
            f"{'met' if met else 'NOT met'}"
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
