"""Answers on a busy host: the reference comparison quiet, under a steady CPU hog and under one busy 2 s of every 5, and the knee beside servebench's find-capacity under the same hog.

    [CPU_PRIORITY=off] python -m bench.busy_host [--runs compare,knee] [--hogs none,steady,periodic] [--vllm URL] ...

Against the engines that already run (the native stack: `make up`). The hog is another program in a
session of its own (`setsid`, its own autogroup), as a neighbour on a laptop, a shared box or a CI
runner is: `steady` spins one core for the whole run; `periodic` spins it 2 s of every 5. Each compare
prints its engines' Summary lines (scaling factor, CI, reading, the busy-host line) and its wall time;
the knee prints its answer and wall time beside servebench find-capacity's, run right after it under
the same hog with the same SLO, lengths and level duration, and the ratio of the two times.
With CPU_PRIORITY=off the load generator leaves the engines in the hog's competition (the case of a user who is not
root); servebench never moves them. Skips (exit 0) when the engines do not answer.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from servescope.host import probe

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
SERVEBENCH = Path(os.path.expanduser("~/.cache/servescope/venv-servebench/bin/servebench"))
HOGS = {
    "none": None,
    "steady": "while :; do :; done",
    "periodic": 'while :; do timeout 2 bash -c "while :; do :; done"; sleep 3; done',
}
# The knee's question, as the issue and servebench put it: first token within 2 s, 5 tokens/s each, for 90%.
SLO, ATTAINMENT, DURATION_S, INPUT, OUTPUT = "ttft<=2,tpot<=0.2", 0.9, 20, 256, 128


class Hog:
    """A busy loop in a session of its own, ended with its whole process group."""

    def __init__(self, kind: str):
        self.script, self.proc = HOGS[kind], None

    def __enter__(self) -> Hog:
        if self.script:
            self.proc = subprocess.Popen(["bash", "-c", self.script], start_new_session=True)
            time.sleep(1)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()


def served_model(url: str) -> str:
    """The model the engine serves (its /v1/models' first id): servebench needs the name."""
    import requests

    try:
        return requests.get(f"{url}/v1/models", timeout=5).json()["data"][0]["id"]
    except (requests.RequestException, ValueError, KeyError, IndexError, TypeError):
        return "HuggingFaceTB/SmolLM2-135M-Instruct"


def run(cmd: list[str], log: Path) -> tuple[int, float, str]:
    started = time.monotonic()
    with log.open("w") as out:
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    return rc, time.monotonic() - started, log.read_text(errors="replace")


def compare(urls: dict[str, str], hog: str, results: Path) -> None:
    run_id = f"busy-compare-{hog}-{int(time.time())}"
    engines = [a for name, url in urls.items() for a in ("--engine", f"{name}={url}")]
    with Hog(hog):
        rc, wall, out = run(
            [PYTHON, "-m", "loadgen", "compare", *engines, "--results", str(results), "--run-id", run_id],
            results / f"{run_id}.log",
        )
    print(f"compare, hog {hog}, CPU_PRIORITY={os.environ.get('CPU_PRIORITY', 'auto')}: exit {rc}, {wall / 60:.1f} min")
    run(
        [PYTHON, "-m", "servescope.report", "--run", str(results / run_id)],
        results / f"{run_id}.report.log",
    )
    try:
        summary = json.loads((results / run_id / "report.json").read_text())["summary"]
    except (OSError, ValueError, KeyError):
        print(out[-2000:])
        return
    for engine in summary:
        print(f"  {engine['title']}:")
        for line in engine["lines"]:
            if line.startswith(("Scaling", "Verdict", "Flag: busy", "Flag: 1", "Flag: 2", "Flag: 3")):
                print(f"    {line}")
    added = [line for line in out.splitlines() if "adding repetition" in line or line.startswith("repetitions of")]
    for line in added:
        print(f"    {line}")


def knee(url: str, hog: str, results: Path) -> None:
    run_id = f"busy-knee-{hog}-{int(time.time())}"
    with Hog(hog):
        rc, ours, out = run(
            [
                PYTHON, "-m", "loadgen", "knee", "--engine", f"vllm={url}", "--slo", SLO,
                "--slo-attainment", str(ATTAINMENT), "--duration", str(DURATION_S),
                "--prompts", f"synthetic:{INPUT}", "--max-tokens", str(OUTPUT),
                "--results", str(results), "--run-id", run_id,
            ],
            results / f"{run_id}.log",
        )  # fmt: skip
        answer = [line for line in out.splitlines() if line.startswith(("knee", "  ", "note", "binding"))]
        print(f"knee (servescope), hog {hog}: exit {rc}, {ours:.0f} s", flush=True)
        print("\n".join(f"    {line}" for line in answer[-16:]))
        if not SERVEBENCH.exists():
            print("  servebench: not installed (make peers)")
            return
        model = served_model(url)
        rc, theirs, out = run(
            [
                str(SERVEBENCH), "find-capacity", "--url", f"{url}/v1", "--model", model,
                "--slo-ttft-ms", "2000", "--slo-tpot-ms", "200", "--target", str(ATTAINMENT),
                "--duration", str(DURATION_S), "--input-len", str(INPUT), "--output-len", str(OUTPUT),
            ],
            results / f"{run_id}.servebench.log",
        )  # fmt: skip
    tail = [line for line in out.splitlines() if re.search(r"capacity|pass|fail|level|users|concurrency", line, re.I)]
    print(f"find-capacity (servebench 1.1.3), hog {hog}: exit {rc}, {theirs:.0f} s", flush=True)
    print("\n".join(f"    {line}" for line in tail[-16:]))
    print(f"  time ratio servescope / servebench: {ours / theirs:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.busy_host", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="compare,knee")
    parser.add_argument("--hogs", default="none,steady,periodic")
    parser.add_argument("--vllm", default="http://127.0.0.1:8009")
    parser.add_argument("--llamacpp", default="http://127.0.0.1:8081")
    parser.add_argument("--results", default=str(ROOT / "results"))
    args = parser.parse_args(argv)
    urls = {"vllm": args.vllm, "llamacpp": args.llamacpp}
    down = [name for name, url in urls.items() if not probe.is_up(f"{url}/v1/models", timeout=5)]
    if down:
        print(f"busy_host: skipped: {', '.join(down)} not answering (make up first)")
        return 0
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    for hog in args.hogs.split(","):
        if "compare" in args.runs:
            compare(urls, hog, results)
        if "knee" in args.runs:
            knee(args.vllm, hog, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
