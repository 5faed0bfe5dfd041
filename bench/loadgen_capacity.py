"""Load generator capacity: streamed tokens/s one loadgen process ingests from a server sending as fast as it can, and its CPU seconds, beside vLLM's client."""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from bench.loadgen_accuracy import Window, loadgen_burst, vllm_available, vllm_bench
from servescope.contracts import knobs
from tests.doubles.synthetic_openai import SyntheticProcess


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen_capacity", description=__doc__)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--tokens", type=int, default=4000, help="tokens per request (the server sends them back to back)"
    )
    parser.add_argument("--rounds", type=int, default=4, help="bursts per run")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs per client, interleaved (A B A B ...) so a disturbance on the shared machine hits both; "
        "the median run is reported",
    )
    parser.add_argument("--clients", default="geventhttpclient,requests")
    parser.add_argument("--no-vllm", action="store_true")
    args = parser.parse_args(argv)
    with_vllm = not args.no_vllm and vllm_available() and not knobs.get("SERVESCOPE_BENCH_NO_VLLM", "")
    server_args = ("--ttft", "0", "--itl", "0", "--tokens", str(args.tokens))
    print(
        f"server: synthetic, ITL 0 (as fast as it can), {args.tokens} tokens/request, {args.concurrency} concurrent, "
        f"{args.rounds} bursts per run, {args.repeat} runs per client. Window: from just before the client's first chat "
        f"request to the server's last completed stream (start-up and exit work excluded, warm-up/test requests "
        f"included for both); tokens = what the server streamed in it; CPU s = the client's user+system CPU in it. "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{'client':<28} {'run':>3} {'tokens':>8} {'wall s':>8} {'tok/s':>9} {'CPU s':>7} {'tok/CPU-s':>10}")
    clients = [c for c in args.clients.split(",") if c] + (["vllm"] if with_vllm else [])
    runs: dict[str, list[Window]] = {c: [] for c in clients}
    failures = 0
    for run in range(1, args.repeat + 1):
        for client in clients:
            label = "vllm bench serve" if client == "vllm" else f"servescope/{client}"
            with SyntheticProcess(*server_args) as server:
                try:
                    if client == "vllm":
                        _result, window = vllm_bench(
                            server,
                            concurrency=args.concurrency,
                            prompts=args.concurrency * args.rounds,
                            output_len=args.tokens,
                        )
                    else:
                        _records, _phases, window = loadgen_burst(
                            server,
                            size=args.concurrency,
                            bursts=args.rounds,
                            max_tokens=args.tokens,
                            http_client=client,
                        )
                except RuntimeError as exc:
                    print(f"{label:<28} {run:>3} failed: {exc}")
                    failures += 1
                    continue
            if not window.tokens:
                print(
                    f"{label:<28} {run:>3} no traffic window (no CPU sample before its first request or after its last "
                    f"stream): left out"
                )
                continue
            runs[client].append(window)
            print(
                f"{label:<28} {run:>3} {window.tokens:>8} {window.wall_s:>8.2f} {window.tokens / window.wall_s:>9.0f} "
                f"{window.cpu_s:>7.2f} {window.tokens_per_cpu_s:>10.0f}",
                flush=True,
            )
    medians = {c: statistics.median(w.tokens_per_cpu_s for w in ws) for c, ws in runs.items() if ws}
    for client, value in medians.items():
        label = "vllm bench serve" if client == "vllm" else f"servescope/{client}"
        print(f"median {label:<21} {value:>10.0f} tokens per CPU-second")
    if "vllm" in medians:
        for client in medians:
            if client != "vllm":
                ratios = [
                    a.tokens_per_cpu_s / b.tokens_per_cpu_s for a, b in zip(runs[client], runs["vllm"], strict=False)
                ]
                print(
                    f"ratio servescope/{client} : vllm bench serve (tokens per CPU-second) = {medians[client] / medians['vllm']:.2f} "
                    f"(per run: {', '.join(f'{r:.2f}' for r in ratios)})"
                )
    else:
        print("vLLM's client skipped: ~/.cache/servescope/venv-vllm or its tokenizer is missing (or --no-vllm)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
