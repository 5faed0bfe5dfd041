"""Load generator capacity: streamed tokens/s one loadgen process ingests from a server sending as fast as it can, and its CPU seconds, beside vLLM's client."""

from __future__ import annotations

import argparse
import os
import sys

from bench.loadgen_accuracy import SyntheticProcess, loadgen_burst, vllm_available, vllm_bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen_capacity", description=__doc__)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=2000, help="tokens per request (the server sends them back to back)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="geventhttpclient,requests")
    parser.add_argument("--no-vllm", action="store_true")
    args = parser.parse_args(argv)
    with_vllm = not args.no_vllm and vllm_available() and not os.environ.get("SERVESCOPE_BENCH_NO_VLLM")
    server_args = ("--ttft", "0", "--itl", "0", "--tokens", str(args.tokens))
    print(f"server: synthetic, ITL 0 (as fast as it can), {args.tokens} tokens/request, {args.concurrency} concurrent, "
          f"{args.rounds} rounds; CPU s = the client's own CPU from its first request to exit; load average {os.getloadavg()[0]:.2f}")
    print(f"{'client':<28} {'requests':>8} {'tokens':>8} {'wall s':>8} {'tok/s':>9} {'CPU s':>7} {'tok/CPU-s':>10}")
    rows: dict[str, float] = {}
    failures = 0
    for client in [c for c in args.clients.split(",") if c]:
        with SyntheticProcess(*server_args) as server:
            try:
                records, phases, cpu = loadgen_burst(server, size=args.concurrency, bursts=args.rounds,
                                                     max_tokens=args.tokens, http_client=client)
            except RuntimeError as exc:
                print(f"servescope/{client:<17} failed: {exc}")
                failures += 1
                continue
        tokens = sum(r["output_tokens"] or 0 for r in records if r["ok"])
        wall = sum(p["wall_s"] for p in phases["phases"])
        rate = tokens / wall if wall else float("nan")
        rows[client] = tokens / cpu if cpu == cpu and cpu > 0 else float("nan")
        print(f"{'servescope/' + client:<28} {len(records):>8} {tokens:>8} {wall:>8.2f} {rate:>9.0f} {cpu:>7.2f} {rows[client]:>10.0f}",
              flush=True)
    if with_vllm:
        with SyntheticProcess(*server_args) as server:
            try:
                result, cpu = vllm_bench(server, concurrency=args.concurrency, prompts=args.concurrency * args.rounds,
                                         output_len=args.tokens)
            except RuntimeError as exc:
                print(f"{'vllm bench serve':<28} failed: {exc}")
                return 1
        tokens = result.get("total_output_tokens", 0)
        wall = result.get("duration", float("nan"))
        rows["vllm"] = tokens / cpu if cpu == cpu and cpu > 0 else float("nan")
        print(f"{'vllm bench serve':<28} {result.get('completed', 0):>8} {tokens:>8} {wall:>8.2f} {tokens / wall:>9.0f} "
              f"{cpu:>7.2f} {rows['vllm']:>10.0f}")
        for client in rows:
            if client != "vllm" and rows["vllm"] == rows["vllm"] and rows["vllm"] > 0:
                print(f"ratio servescope/{client} : vllm bench serve (tokens per CPU-second) = {rows[client] / rows['vllm']:.2f}")
    else:
        print("vLLM's client skipped: ~/.cache/servescope/venv-vllm or its tokenizer is missing (or --no-vllm)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
