"""The report on a run against a fleet: wall time and peak memory of `python -m servescope.report` on a generated run whose load
went to N instances, read by the run's own sampler every 100 ms, in both shapes a fleet takes in a run (N instances
behind one router target; N targets of one kind). The goal, GOAL_S, is at 100 instances."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench import report_scale
from servescope.contracts import series
from servescope.contracts.runfolder import PhaseRecord, RequestRecord, RunFolder, SampleRecord, append_samples

GOAL_S = 10.0  # at GOAL_INSTANCES, either shape
GOAL_INSTANCES = 100
T0 = 1796000000.0
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
TOKENS = 64
RATE_PER_S = 50.0  # requests over the whole fleet


def generate(path: Path, instances: int, duration_s: float, interval_s: float, behind_router: bool) -> int:
    """A run folder: requests at RATE_PER_S through the targets, the sampler's reads of every instance (a burst of
    waiting on every fifth instance in the middle third); the number of sample records."""
    import numpy

    rng = numpy.random.default_rng(instances)
    folder = RunFolder.create(path.parent, path.name)
    names = [f"vllm-{i:04d}" for i in range(instances)]
    targets = ["router"] if behind_router else names
    end = T0 + duration_s
    with open(folder.path / "requests.jsonl", "w", encoding="utf-8") as out:
        for i in range(int(duration_s * RATE_PER_S)):
            target = targets[i % len(targets)]
            started = T0 + i / RATE_PER_S
            ttft = 0.05 + rng.random() * 0.1
            gaps = (0.01 + rng.random(TOKENS - 1) * 0.02).tolist()
            record = RequestRecord(
                engine="vllm", instance=target, scenario="rate", phase="rate", api="openai", model=MODEL,
                prompt_set=f"synthetic:{TOKENS}", prompt_set_sha256="5e" * 32, prompt_id=f"p{i}",
                max_tokens=TOKENS, started_at=started, scheduled_at=started, ttft_s=ttft,
                e2e_s=ttft + sum(gaps), itl_s=gaps, tpot_s=sum(gaps) / (TOKENS - 1), output_tokens=TOKENS,
                status=200, ok=True, tokens_source="usage", content_chunks=TOKENS,
            )  # fmt: skip
            out.write(record.to_json() + "\n")
    for target in targets:
        n = int(duration_s * RATE_PER_S) // len(targets)
        folder.append_phase(
            PhaseRecord("vllm", target, "rate", "rate", T0, end, n, 1, f"synthetic:{TOKENS}", "5e" * 32, TOKENS)
        )
    reads = int(duration_s / interval_s)
    batch: list[SampleRecord] = []
    count = 0
    for k in range(reads):
        t = T0 + k * interval_s
        burst = reads / 3 <= k < 2 * reads / 3
        for j, name in enumerate(names):
            waiting = float(rng.integers(1, 4)) if burst and j % 5 == 0 else 0.0
            values = {
                series.REQUESTS_RUNNING: float(rng.integers(0, 3)),
                series.REQUESTS_WAITING: waiting,
                series.KV_CACHE_USAGE: float(rng.random() * 0.3),
                series.GENERATED_TOKENS: float(k * 10),
                series.PROMPT_TOKENS: float(k * 20),
            }
            batch.append(SampleRecord(t, 0.004, interval_s, "vllm", name, "rate", values))
        if len(batch) >= 20_000:
            append_samples(folder, batch)
            count += len(batch)
            batch = []
    append_samples(folder, batch)
    count += len(batch)
    folder.write_manifest(
        {
            "run_id": path.name,
            "tool": "bench/fleet_report.py",
            "command": f"generated: {instances} instances, {'behind one router' if behind_router else 'each a target'}",
            "status": "complete",
            "started_at": T0,
            "ended_at": end,
            "engines": {t: {"kind": "vllm", "model": MODEL} for t in targets},
        }
    )
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_report", description=__doc__)
    parser.add_argument("--instances", default="10,100", help="fleet sizes, comma-separated")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load in the generated run")
    parser.add_argument("--interval-ms", type=float, default=100.0, help="the sampler's interval")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each report (the median is judged)")
    args = parser.parse_args(argv)
    print(
        f"the report on a generated {args.duration:g}-s run, samples every {args.interval_ms:g} ms of every "
        f"instance, {RATE_PER_S:g} req/s x {TOKENS} tokens; load average {os.getloadavg()[0]:.2f}; median of "
        f"{args.repeat} runs judged (goal <= {GOAL_S:g} s at {GOAL_INSTANCES} instances)"
    )
    print(f"{'instances':>10} {'shape':<40} {'wall min/med':>11} {'CPU s':>6} {'peak MiB':>9}")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="fleet-report-") as tmp:
        for n in (int(x) for x in args.instances.split(",") if x):
            for behind in (True, False):
                path = Path(tmp) / f"fleet-{n}-{'router' if behind else 'targets'}"
                samples = generate(path, n, args.duration, args.interval_ms / 1000, behind)
                shape = f"{'behind one router' if behind else 'each a target'}, {samples:,} samples"
                runs = []
                for _ in range(args.repeat):
                    shutil.rmtree(path / "report", ignore_errors=True)
                    runs.append(report_scale.measure(report_scale.REPO, path))
                goal = (GOAL_S, None) if n == GOAL_INSTANCES else (None, None)
                failed |= report_scale.print_row(n, shape, runs, goal)
                shutil.rmtree(path, ignore_errors=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
