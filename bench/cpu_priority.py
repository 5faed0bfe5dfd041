"""What CPU_PRIORITY buys: a CPU-bound stand-in engine's fixed work under a hog in its own session, protected or not, interleaved.

The hog is what users have beside a measurement: a busy loop started in another session (`setsid`), so its own
autogroup, weighing as much as the whole engine when both want a core. The stand-in engine is a parent process
(started in a session of its own, as `make up` starts an engine) with --processes busy children, each doing the same
fixed number of chained sha256 rounds; it forks them first and lets them run on "go", so the protected condition also
proves that `apply` moves children already there. Each repetition runs the stand-in once without the priority and
once inside a cgroup at CPU_PRIORITY_WEIGHT (the order alternating: A B B A ...), so a drift of the machine (a build
beside it) hits both alike. Reported per condition: the wall time of the fixed work, the cores the hog got while it
ran, the stand-in's own cores, and what every other process took (the machine's busy time less those two); then the
ratios. Needs root and a writable cpu controller (cgroup v1 cpu.shares or v2 cpu.weight); says so and does nothing
otherwise. Its group is its own (`servescope-bench`), removed at the end: a real run's group is never touched.

  python -m bench.cpu_priority [--repetitions 4] [--rounds 6000000] [--processes 2] [--weight 10]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from servescope.host import cpu_priority

REPO = Path(__file__).resolve().parent.parent
GROUP = "servescope-bench"
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Trial:
    """One repetition's fixed work beside the hog, protected or not: its wall time and the cores each party got."""

    protected: bool
    wall_s: float  # the fixed work, from "go" to the last child's end
    standin_cores: float  # the stand-in's CPU seconds (its children's) / wall
    hog_cores: float  # the hog's CPU seconds over the same window / wall
    others_cores: float  # the machine's busy CPU time less those two / wall: the build beside it, the bench itself


# ---------------------------------------------------------------- the stand-in engine (its own process)


def stand_in(rounds: int, processes: int) -> int:
    """Fork the busy children, say "ready", wait for "go" on stdin, then time the fixed work; print it as JSON."""
    start_r, start_w = os.pipe()
    children = []
    for _ in range(processes):
        pid = os.fork()
        if pid == 0:
            os.close(start_w)
            os.read(start_r, 1)  # blocks until "go": the fork is done before the parent is moved
            h = b"servescope"
            for _ in range(rounds):
                h = hashlib.sha256(h).digest()
            os._exit(0)
        children.append(pid)
    print("ready", flush=True)
    sys.stdin.readline()
    began = time.monotonic()
    os.write(start_w, b"g" * processes)
    for pid in children:
        os.waitpid(pid, 0)
    wall = time.monotonic() - began
    times = os.times()
    print(json.dumps({"wall_s": wall, "cpu_s": times.children_user + times.children_system}), flush=True)
    return 0


# ---------------------------------------------------------------- the measurement


def _cpu_s(pid: int) -> float:
    """A process's own CPU seconds (utime + stime)."""
    data = Path(f"/proc/{pid}/stat").read_bytes()
    fields = data[data.rfind(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _busy_s() -> float:
    """The machine's non-idle CPU seconds since boot (steal excluded)."""
    v = [int(x) / CLK_TCK for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:8]]
    return v[0] + v[1] + v[2] + v[5] + v[6]


def trial(protected: bool, hog: subprocess.Popen, rounds: int, processes: int, weight: float) -> Trial:
    standin = subprocess.Popen(
        [sys.executable, "-m", "bench.cpu_priority", "--stand-in", str(rounds), str(processes)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # as `make up` starts an engine: a session (an autogroup) of its own
    )
    try:
        assert standin.stdout.readline().strip() == "ready"
        if protected:
            cpu_priority.apply([standin.pid], mode="on", multiple=weight, name=GROUP)
        hog_before, busy_before, t0 = _cpu_s(hog.pid), _busy_s(), time.monotonic()
        standin.stdin.write("go\n")
        standin.stdin.flush()
        result = json.loads(standin.stdout.readline())
        hog_after, busy_after, window = _cpu_s(hog.pid), _busy_s(), time.monotonic() - t0
    finally:
        standin.stdin.close()
        standin.wait(60)
    hog_s = hog_after - hog_before
    return Trial(
        protected,
        result["wall_s"],
        result["cpu_s"] / result["wall_s"],
        hog_s / window,
        max(0.0, busy_after - busy_before - hog_s - result["cpu_s"]) / window,
    )


def table(trials: list[Trial], weight: float) -> list[str]:
    def median(protected: bool, attr: str) -> float:
        return statistics.median(getattr(t, attr) for t in trials if t.protected == protected)

    def spread(protected: bool, attr: str) -> str:
        values = [getattr(t, attr) for t in trials if t.protected == protected]
        return f"{min(values):.2f}-{max(values):.2f}"

    rows = [("condition", "n", "wall s (median, range)", "hog cores", "stand-in cores", "others' cores")]
    for protected in (False, True):
        name = f"cgroup at {weight:g}x" if protected else "no priority"
        n = sum(t.protected == protected for t in trials)
        rows.append(
            (
                name,
                str(n),
                f"{median(protected, 'wall_s'):.2f} ({spread(protected, 'wall_s')})",
                f"{median(protected, 'hog_cores'):.2f} ({spread(protected, 'hog_cores')})",
                f"{median(protected, 'standin_cores'):.2f} ({spread(protected, 'standin_cores')})",
                f"{median(protected, 'others_cores'):.2f} ({spread(protected, 'others_cores')})",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    wall = median(False, "wall_s") / median(True, "wall_s")
    hog_off, hog_on = median(False, "hog_cores"), median(True, "hog_cores")
    lines.append(
        f"protected: the fixed work {wall:.2f}x as fast (median wall {median(False, 'wall_s'):.2f} s -> "
        f"{median(True, 'wall_s'):.2f} s); the hog took {hog_off:.2f} -> {hog_on:.2f} cores while it ran"
        + (f" ({hog_off / hog_on:.1f}x less)" if hog_on > 0 else "")
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_priority", description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=4, help="pairs (one run of each condition)")
    parser.add_argument("--rounds", type=int, default=6_000_000, help="sha256 rounds per busy child: the fixed work")
    parser.add_argument("--processes", type=int, default=2, help="busy children of the stand-in engine")
    parser.add_argument("--weight", type=float, default=None, help="the group's weight, x a default group's")
    parser.add_argument("--stand-in", nargs=2, type=int, metavar=("ROUNDS", "PROCESSES"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stand_in:
        return stand_in(*args.stand_in)
    weight = args.weight if args.weight is not None else cpu_priority.multiple_knob()
    check = cpu_priority.apply([], mode="auto", multiple=weight, name=GROUP)
    if not check.applied:
        print(f"cpu_priority: not run: {check.reason}", flush=True)
        cpu_priority.remove(GROUP)
        return 0
    print(
        f"cpu_priority: {args.processes} busy children x {args.rounds:,} sha256 rounds, {args.repetitions} pairs "
        f"(A B B A), a hog in its own session; protected: {check.path} at {check.controller} {check.weight}",
        flush=True,
    )
    hog = subprocess.Popen(
        [sys.executable, "-m", "tests.doubles.cpu_hog", "--seconds", "1800"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # `setsid`: its own session, so its own autogroup
    )
    trials: list[Trial] = []
    try:
        assert hog.stdout.readline().strip() == "busy"
        for rep in range(args.repetitions):
            order = (False, True) if rep % 2 == 0 else (True, False)
            for protected in order:
                t = trial(protected, hog, args.rounds, args.processes, weight)
                trials.append(t)
                print(
                    f"  pair {rep + 1} {'protected  ' if protected else 'unprotected'}: wall {t.wall_s:.2f} s, "
                    f"hog {t.hog_cores:.2f} cores, stand-in {t.standin_cores:.2f}, others {t.others_cores:.2f}",
                    flush=True,
                )
    finally:
        hog.terminate()
        hog.wait(10)
        cpu_priority.remove(GROUP)
    print("\n".join(table(trials, weight)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
