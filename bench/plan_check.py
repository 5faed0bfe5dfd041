"""The plan's prediction checked for real: N replicas behind nginx, the attainment predicted from one replica's knee
against the attainment measured through the router, at three traffic levels and both routing policies."""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from report import load, plan, traffic
from report.replicas import Arrival
from servescope import slo
from stack.errors import StackError
from stack.router import Router
from tests.doubles.synthetic_openai import SyntheticProcess

REPO = Path(__file__).resolve().parent.parent
# The host-noise rule would leave out every measurement of a bench sharing the machine with its own doubles.
QUIET_RULE = {"NOISE_GROUP_CPU_CORES": "100", "NOISE_FOREIGN_CPU_CORES": "100", "NOISE_STEAL_SHARE": "1"}


def loadgen(*args: str, results: Path, run_id: str) -> Path:
    cmd = [sys.executable, "-m", "loadgen", *args, "--results", str(results), "--run-id", run_id]
    cmd += ["--metrics-port", "0", "--quiet", "--warmup", "0"]
    done = subprocess.run(cmd, cwd=REPO, env={**os.environ, **QUIET_RULE}, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"loadgen {args[0]} exited {done.returncode}: {' | '.join(tail)}")
    return results / run_id


def measured(folder: Path, spec: slo.SloSpec, duration_s: float) -> tuple[float | None, traffic.Traffic]:
    """The measured attainment, and the arrivals the load generator scheduled: the prediction replays the same ones
    (a short Poisson sample's own queueing would otherwise swamp the model's error near saturation)."""
    run = load.load(folder)
    try:
        records = [r for inst in run.engines for r in run.requests_of(inst, gaps=False)]
    finally:
        run.close()
    good = sum(spec.good(r) for r in records)
    times = sorted(r.scheduled_at if r.scheduled_at is not None else r.started_at for r in records)
    arrivals = tuple(Arrival(t - times[0]) for t in times) if times else ()
    return (good / len(records) if records else None), traffic.Traffic(folder.name, arrivals, duration_s)


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    try:
        return check(argv)
    except (StackError, RuntimeError, plan.PlanError) as exc:  # no nginx, a replica or a run that failed: one line
        print(f"plan_check: {exc}")
        return 1


def check(argv: list[str] | None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.plan_check", description=__doc__)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--slots", type=int, default=2, help="each synthetic replica's batch slots (--max-running)")
    p.add_argument("--ttft", type=float, default=0.1)
    p.add_argument("--itl", type=float, default=0.02)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--rates", default="2.5,4.5,6", help="req/s over the whole fleet, comma-separated")
    p.add_argument("--duration", type=float, default=60.0, help="seconds per measured traffic level")
    p.add_argument("--knee-duration", type=float, default=8.0)
    p.add_argument("--slo", default="ttft<=0.5,tpot<=0.05")
    p.add_argument("--attainment", default="0.9")
    p.add_argument("--policies", default="least_conn,round_robin")
    p.add_argument("--knee", type=Path, default=None, help="a knee run folder to plan from (default: measure one)")
    p.add_argument("--urls", default="", help="replicas already running (comma-separated) instead of synthetic ones")
    p.add_argument("--kind", default="vllm", help="their engine kind (the load generator's --engine)")
    p.add_argument("--prompts", default=None, help="the load generator's --prompts (default: its capacity default)")
    p.add_argument(
        "--keep", type=Path, default=None, help="write the run folders here and keep them (default: a temp dir)"
    )
    args = p.parse_args(argv)
    spec = slo.resolve(args.slo, args.attainment)
    engine_args = ("--max-running", str(args.slots), "--ttft", str(args.ttft), "--itl", str(args.itl))
    engine_args += ("--tokens", str(args.tokens))
    tokens = ("--max-tokens", str(args.tokens)) + (("--prompts", args.prompts) if args.prompts else ())
    what = f"{args.kind} at {args.urls}" if args.urls else "synthetic engines"
    print(
        f"replicas: {what}, {args.slots} batch slots each, TTFT {args.ttft} s, ITL {args.itl} s, "
        f"{args.tokens} tokens; router: nginx {{{args.policies}}}; {spec.describe()}; Poisson traffic, "
        f"{args.duration:g} s per level; load average {os.getloadavg()[0]:.2f}"
    )
    failures = 0
    with tempfile.TemporaryDirectory(prefix="plan-check-") as tmp:
        results = args.keep or Path(tmp)
        knee = args.knee
        if knee is None:
            with SyntheticProcess(*engine_args) as one:
                knee = loadgen(
                    "knee", "--engine", f"{args.kind}={one.url}", "--slo", args.slo, "--slo-attainment", args.attainment,
                    "--duration", str(args.knee_duration), *tokens, results=results, run_id="knee",
                )  # fmt: skip
        profile = plan.profile_of(knee, args.slots)
        print(f"knee of one replica: {profile.knee} users; levels {[lv.concurrency for lv in profile.levels]}")
        print(f"{'policy':<12} {'req/s':>6} {'N':>3} {'predicted':>9} {'measured':>8} {'diff':>6} {'requests':>8}")
        with contextlib.ExitStack() as fleet:
            urls = [u for u in args.urls.split(",") if u] or [
                fleet.enter_context(SyntheticProcess(*engine_args)).url for _ in range(args.replicas)
            ]
            for policy in args.policies.split(","):
                with Router(urls, free_port(), policy, results / f"nginx-{policy}") as router:
                    for rate in (float(r) for r in args.rates.split(",")):
                        run_id = f"{policy}-{rate:g}"
                        folder = loadgen(
                            "rate", "--engine", f"{args.kind}={router}", "--rate", f"{rate:g}", "--arrivals", "poisson",
                            "--duration", f"{args.duration:g}", "--slo", args.slo, *tokens,
                            results=results, run_id=run_id,
                        )  # fmt: skip
                        attained, offered = measured(folder, spec, args.duration)
                        n = len(offered.arrivals)
                        predicted = plan.predict(
                            profile, offered, len(urls), spec, policy, repeats=5, window_s=args.duration
                        ).attainment
                        diff = (predicted - attained) * 100 if predicted is not None and attained is not None else None
                        failures += diff is None or abs(diff) > 5
                        print(
                            f"{policy:<12} {rate:>6g} {len(urls):>3} {predicted:>9.1%} {attained:>8.1%} "
                            f"{diff:>+5.1f}p {n:>8}"
                        )
    print(f"goal: predicted within 5 points of measured: {'met' if not failures else f'missed in {failures} row(s)'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
