"""`make tune ENGINE=vllm|llamacpp`: knee, turn the knob the binding resource names, restart, measure the same load again; keep it only when goodput rises beyond its CI.

From the current knobs (.env.example < .env < environment) on the native stack:

  1. `python -m loadgen knee` finds the highest load that meets the SLOs, the lowest that fails,
     and what ran out there (servescope/judgements/binding.py: batch slots, KV capacity; compute, client, an
     SLO below the floor, an engine fault or undecided stop the loop: no knob adds those).
  2. The knob goes up (slots and KV space double; llama.cpp's context grows with its slots so each
     slot keeps its share). Before the restart the loop says what it expects the change to buy
     (`expectation`: slots 1 -> 2 at 2 users, about 2x unless compute binds), after it what it measured.
  3. The same workload is measured again: the failing load, the same prompts, max_tokens, duration
     and number of measurements. One estimator decides and fills the table: goodput = good requests
     per second of the measurements' wall time (servescope/judgements/slo.py's good; a failed request is not good
     and its time is inside the wall). Its CI comes from batch means: each measurement cut into
     slices of about two request times, the good completions per slice resampled (servescope/judgements/stats.py's
     seeded bootstrap of a ratio), on both settings. While the 95% CI of the difference holds zero,
     the measurement is extended, one measurement at a time on the setting whose estimate is the less
     certain (the engine restarted to it when needed), up to TUNE_MAX_MEASUREMENTS per setting; then
     the change is kept (CI above zero), reverted (below zero: it made goodput worse) or called
     inconclusive with the CI and how much more measuring would settle a difference that size; the
     last two restore the old setting and stop. A measurement the engine was absent for (refused,
     timed out, unreadable) is never concluded from: the old setting is restored and the loop stops.
  4. A kept value gets its own knee (step 1), from the last knee up.

Everything goes to one folder, results/<tune-id>/: each knee and measurement run as a run folder
inside it, tune.json (the trajectory), and report.md/.html/.json with the trajectory's table and
plot (servescope/report/tuning.py; `make report` shows it while it is the latest run). The engine is left
running with the last kept setting, checked to answer before the last line says so; the knob line
to keep it goes in .env.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from servescope import engines
from servescope.contracts import knobs
from servescope.contracts.runfolder import FOLDER_MODE, KNEE, MANIFEST, RunFolder, new_run_id, write_file
from servescope.contracts.settings import KnobTable
from servescope.engines import base
from servescope.judgements import binding, slo, stats
from servescope.stack.errors import StackError
from servescope.stack.progress import say
from servescope.stack.vllm import GIB
from servescope.text import numbers, words
from servescope.text.numbers import elapsed

TUNE = "tune.json"
# The knobs a tune may move, per engine it can restart (each adapter's levers: servescope/engines/<name>.py).
TUNED = {a.name: a.tuned for a in engines.ENGINES.values() if a.tuned}
MAX_SLOTS, MAX_CONTEXT = base.MAX_SLOTS, base.MAX_CONTEXT


class TuneError(StackError):
    """A tune that cannot go on: one line."""


@dataclass
class Step:
    """One setting tried: its knee (when it was kept) and its goodput at the workload it was judged on."""

    step: int
    knobs: dict[str, str]
    decision: str  # start, kept, reverted (it lowered goodput), inconclusive, refused (could not apply or measure)
    knee: float | None = None
    first_failing: float | None = None
    status: str = ""  # the knee's: found, fails at the lowest load, meets the SLOs up to the highest load
    binding: str | None = None
    evidence: str = ""
    knob: str | None = None  # what the binding resource names
    workload: float | None = None  # the load this setting's goodput was judged at
    goodput_rps: float | None = None
    good_tokens_per_s: float | None = None
    delta: dict[str, Any] | None = None  # goodput vs the setting before, with its bootstrap CI
    expected: dict[str, Any] | None = None  # what the change was expected to buy, and what it measured
    measurements: dict[str, int] | None = None  # measurements the decision rests on: before / after
    runs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class KvFit:
    """What the reference page's inequality needs to check a vLLM slot count: VLLM_MAX_NUM_SEQS x VLLM_MAX_MODEL_LEN
    must fit the KV tokens VLLM_CPU_KVCACHE_SPACE holds (the native stack refuses to start vLLM otherwise)."""

    bytes_per_token: int
    max_model_len: int

    def most_slots(self, space_gib: float) -> int:
        return int(space_gib * GIB) // self.bytes_per_token // self.max_model_len

    def space_for(self, slots: int) -> int:
        """The whole GiB of KV space that admits this many slots."""
        return math.ceil(slots * self.max_model_len * self.bytes_per_token / GIB)


def raise_knob(
    engine: str, resource: str, values: dict[str, str], kv: KvFit | None = None
) -> tuple[dict[str, str], str] | None:
    """More of the binding resource: the new knob values and what changed, or None when there is no rule or no room
    (the engine's own rule: servescope/engines/<name>.py raise_knob)."""
    adapter = engines.ENGINES.get(engine)
    if adapter is None or adapter.raise_knob is None:
        return None
    return adapter.raise_knob(resource, values, kv)


class Tuner:
    """The loop; `restart(knob values)` brings the engine up with them (the native stack's, or a test's simulator)."""

    def __init__(
        self,
        engine: str,
        url: str,
        values: dict[str, str],
        restart: Callable[[dict[str, str]], None],
        folder: Path,
        *,
        loadgen_args: list[str] = (),
        max_steps: int = 6,
        env: dict[str, str] | None = None,
        kv: KvFit | None = None,
        max_measurements: int = 6,
    ):
        if engine not in TUNED:
            raise TuneError(f"tune: engine {engine!r}: expected one of {', '.join(TUNED)}")
        self.engine, self.url, self.restart = engine, url, restart
        self.values = {k: values[k] for k in TUNED[engine]}
        self.folder = Path(folder)
        self.loadgen_args = list(loadgen_args)
        self.max_steps = max_steps
        self.env = env
        self.kv = kv  # vLLM on the native stack: slots raised within the KV space
        self.max_measurements = max_measurements
        self.duration_s = _duration(self.loadgen_args)
        self.running: dict[str, str] | None = dict(self.values)  # what the engine runs with now, as far as we know
        self.steps: list[Step] = []
        self.stop_reason = ""
        self.started_at = time.time()
        self.specs: dict[str, slo.SloSpec] = {}  # each knee run's SLOs, read with its knee.json

    # ------------------------------------------------------------ runs

    def knee(self, run_id: str, *extra: str) -> dict[str, Any]:
        """One `python -m loadgen knee` run into this tune's folder; its knee.json."""
        cmd = [sys.executable, "-m", "loadgen", "knee", "--engine", f"{self.engine}={self.url}"]
        cmd += ["--results", str(self.folder), "--run-id", run_id, "--quiet", *self.loadgen_args, *extra]
        say(f"tune: {' '.join(cmd[2:])}")
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=knobs.REPO_ROOT, env=self.env, capture_output=True, text=True)
        out = self.folder / run_id / KNEE
        if proc.returncode != 0 or not out.exists():
            why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise TuneError(f"tune: the knee run {run_id} failed: {why}")
        tail = [line for line in proc.stdout.splitlines() if line.startswith(("knee", "binding", "note"))]
        for line in tail:
            say(f"  {line}")
        say(f"  ({run_id}: {elapsed(time.monotonic() - started)})")
        result = json.loads(out.read_text())
        self.specs[run_id] = slo.parse(result["spec"], result["objective"])  # the run folder's SLOs, read once
        return result

    def measured(self, run_id: str, result: dict[str, Any], level: float) -> Evidence:
        """The good completions of every trusted measurement of `level` in a knee run, cut into slices."""
        probes = [
            p
            for p in result["probes"]
            if p["level"] == level and p["started_at"] is not None and p["trusted"]  # the knee's own rule
        ]
        spec = self.specs[run_id]
        names = {p["phase"] for p in probes}
        records = [r for r in RunFolder(self.folder / run_id).requests() if r.phase in names]
        evidence = Evidence(runs=[run_id])
        for p in probes:
            evidence.add(p["started_at"], p["ended_at"], [r for r in records if r.phase == p["phase"]], spec)
        evidence.faults = [p["fault"] for p in result["probes"] if p.get("fault")]
        return evidence

    # ------------------------------------------------------------ the loop

    def run(self) -> list[Step]:
        self.write_manifest("running")
        try:
            self._loop()
        finally:
            self.write()
        return self.steps

    def _loop(self) -> None:
        result = self.knee("step0-knee")
        current = self._step(0, self.values, "start", result, ["step0-knee"])
        knee_result, knee_run = result, "step0-knee"
        for n in range(1, self.max_steps + 1):
            if not self._can_go_on(current):
                return
            change = raise_knob(self.engine, current.binding, self.values, self.kv)
            if change is None:
                self.stop_reason = f"no more {current.binding} to add for {self.engine} (the knob is at its cap)"
                return
            new_values, what = change
            workload = current.first_failing
            unit = knee_result["unit"]
            before = self.measured(knee_run, knee_result, workload)
            expect = expectation(self.engine, current.binding, self.values, new_values, workload, unit, knee_result)
            say(f"tune: step {n}: {current.binding} ran out at {workload:g} {unit}; {what}, restarting {self.engine}")
            say(f"tune: expected: {expect['text']}")
            try:
                self._run_with(new_values)
            except StackError as exc:
                self.steps.append(Step(n, new_values, "refused", evidence=str(exc)))
                self.stop_reason = f"{what} could not be applied: {exc}"
                self._restore(self.values)
                return
            after = self._measure(f"step{n}-measure", workload, max(1, before.measurements))
            step = Step(n, new_values, "", workload=workload, expected=expect, runs=list(after.runs))
            decided = self._judge(step, before, after, new_values, what, unit)
            self.steps.append(step)
            if not decided:
                return
            self.values = new_values
            knee_run = f"step{n}-knee"
            start = current.knee if current.knee is not None else None
            self._run_with(new_values)
            knee_result = self.knee(knee_run, *(("--start-load", f"{start:g}") if start else ()))
            _fill(step, knee_result, self.engine)
            step.runs.append(knee_run)
            current = step
        self.stop_reason = self.stop_reason or f"TUNE_MAX_STEPS ({self.max_steps}) reached"

    def _measure(self, run_id: str, level: float, repeats: int) -> Evidence:
        """`repeats` measurements of one load in a knee run of its own (the same options as the knee's)."""
        lv = f"{level:g}"
        result = self.knee(
            run_id, *("--min-load", lv, "--start-load", lv, "--max-load", lv, "--knee-repeats", str(repeats))
        )
        return self.measured(run_id, result, level)

    def _judge(self, step: Step, before: Evidence, after: Evidence, new_values: dict, what: str, unit: str) -> bool:
        """Extend the evidence until the CI of the change excludes zero or the cap is reached; decide. True: kept."""
        rounds = 0
        while True:
            if before.faults or after.faults:
                faults = (after.faults or before.faults)[0]
                step.decision, step.evidence = "refused", f"engine fault while measuring: {faults}"
                self.stop_reason = f"{what}: the engine was not there while it was measured ({faults}): not kept"
                self._restore(self.values)
                return False
            delta = stats.bootstrap_ratio_delta(after.sample(), before.sample())
            step.delta, step.goodput_rps, step.good_tokens_per_s = delta, after.goodput(), after.good_tokens()
            step.measurements = {"before": before.measurements, "after": after.measurements}
            low, high = delta["ci_low"], delta["ci_high"]
            settled = low is not None and (low > 0 or high < 0)
            open_sides = [e for e in (before, after) if e.measurements < self.max_measurements]
            if settled or not open_sides:
                break
            rounds += 1
            if max(open_sides, key=Evidence.uncertainty) is before:
                say(f"tune: CI {_ci(delta)} holds 0: measuring the old setting once more ({_knobs(self.values)})")
                self._run_with(self.values)
                before.extend(self._measure(f"step{step.step}-before-{rounds}", step.workload, 1))
            else:
                say(f"tune: CI {_ci(delta)} holds 0: measuring the new setting once more ({_knobs(new_values)})")
                self._run_with(new_values)
                more = self._measure(f"step{step.step}-measure-{rounds + 1}", step.workload, 1)
                after.extend(more)
                step.runs += more.runs
        ratio = delta["current"] / delta["baseline"] if delta["baseline"] else None
        step.expected["measured_ratio"] = ratio
        measured = f"x{ratio:.2f}" if ratio is not None else "n/a"
        baseline_text, current_text, delta_text, low_text, high_text = (
            numbers.fixed(v, missing_when="None or NaN")
            for v in (delta["baseline"], delta["current"], delta["delta"], low, high)
        )
        say(
            f"tune: goodput at {step.workload:g} {unit}: {baseline_text} -> {current_text} good req/s "
            f"({before.measurements} / {after.measurements} measurements), delta {delta_text} "
            f"[{low_text}, {high_text}] 95% CI; expected {step.expected['text']}, measured {measured}"
        )
        if low is not None and low > 0:
            step.decision = "kept"
            return True
        if high is not None and high < 0:
            step.decision = "reverted"
            self.stop_reason = f"{what} lowered goodput beyond its 95% CI ({_ci(delta)}): went back"
        else:
            step.decision = "inconclusive"
            self.stop_reason = (
                f"{what}: inconclusive after {before.measurements} and {after.measurements} measurements of the old "
                f"and the new setting (TUNE_MAX_MEASUREMENTS={self.max_measurements}): "
                f"delta {_ci(delta)} holds 0; {settle_hint(delta, before, after, self.duration_s)}; the old setting "
                f"stays"
            )
        self._restore(self.values)
        return False

    def _run_with(self, values: dict[str, str]) -> None:
        """The engine with these knob values (restarted only when it runs with others). While a restart is under way,
        and after one that failed, what runs is unknown: a refused setting left the engine down, and the restore that
        followed skipped its start because the old values were still taken for the running ones."""
        if self.running != values:
            self.running = None
            self.restart(values)
            self.running = dict(values)

    def _step(self, n: int, values: dict[str, str], decision: str, result: dict, runs: list[str]) -> Step:
        step = Step(n, dict(values), decision, runs=runs)
        _fill(step, result, self.engine)
        if step.first_failing is not None:
            evidence = self.measured(runs[0], result, step.first_failing)
            step.workload, step.goodput_rps, step.good_tokens_per_s = (
                step.first_failing,
                evidence.goodput(),
                evidence.good_tokens(),
            )
        self.steps.append(step)
        return step

    def _can_go_on(self, current: Step) -> bool:
        if current.status == "meets the SLOs up to the highest load":
            self.stop_reason = "the SLOs hold up to the knee's --max-load (LOADGEN_KNEE_MAX): nothing ran out"
        elif current.binding in binding.NOT_CAPACITY or current.binding in (binding.COMPUTE, binding.SLO_FLOOR, None):
            self.stop_reason = f"the binding resource is {current.binding or 'not named'}: {current.evidence}"
        elif current.first_failing is None:
            self.stop_reason = "no failing load to judge a change at"
        else:
            return True
        return False

    def _restore(self, values: dict[str, str]) -> None:
        say(f"tune: restarting {self.engine} with {_knobs(values)}")
        self._run_with(values)

    # ------------------------------------------------------------ what it leaves behind

    def best(self) -> dict[str, str]:
        return self.values

    def write_manifest(self, status: str) -> None:
        manifest = {
            "tool": "servescope-tune",
            "kind": "tune",
            "engine": self.engine,
            "url": self.url,
            "status": status,
            "started_at": self.started_at,
            "ended_at": None if status == "running" else time.time(),
            "loadgen_args": self.loadgen_args,
        }
        write_file(self.folder / MANIFEST, json.dumps(manifest, indent=2) + "\n")

    def write(self) -> None:
        data = {
            "engine": self.engine,
            "url": self.url,
            "started_at": self.started_at,
            "ended_at": time.time(),
            "start_knobs": self.steps[0].knobs if self.steps else self.values,
            "best_knobs": self.values,
            "stop_reason": self.stop_reason or "interrupted",
            "steps": [asdict(s) for s in self.steps],
        }
        write_file(self.folder / TUNE, json.dumps(data, indent=2, default=_json_default) + "\n")
        self.write_manifest("complete" if self.stop_reason else "interrupted")


# ---------------------------------------------------------------- goodput: one estimator, its CI by batch means


@dataclass
class Evidence:
    """The good completions of one setting at one load: per slice of its measurements, the good requests that
    finished in it (and their output tokens) and the slice's length. goodput = sum(good) / sum(lengths), which is
    good requests per second of the measurements' wall; the slices are what the bootstrap resamples."""

    good: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    lengths: list[float] = field(default_factory=list)
    measurements: int = 0
    runs: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)

    def add(self, started: float, ended: float, records: list, spec: slo.SloSpec) -> None:
        good, tokens, lengths = slo.good_slices(
            started,
            ended,
            [slo.finished_at(r) for r in records],
            [spec.good(r) for r in records],
            [r.output_tokens or 0 for r in records],
            [r.e2e_s for r in records if r.ok and r.e2e_s],
        )
        if not lengths:
            return
        self.good += good
        self.tokens += tokens
        self.lengths += lengths
        self.measurements += 1

    def extend(self, other: Evidence) -> None:
        self.good += other.good
        self.tokens += other.tokens
        self.lengths += other.lengths
        self.measurements += other.measurements
        self.runs += other.runs
        self.faults += other.faults

    def sample(self) -> tuple[list[float], list[float], float]:
        return self.good, self.lengths, 1.0

    def goodput(self) -> float | None:
        return sum(self.good) / sum(self.lengths) if sum(self.lengths) > 0 else None

    def good_tokens(self) -> float | None:
        return sum(self.tokens) / sum(self.lengths) if sum(self.lengths) > 0 else None

    def uncertainty(self) -> float:
        """The variance of the goodput estimate (per-slice rates' variance over their count): which side to extend."""
        rates = [g / w for g, w in zip(self.good, self.lengths, strict=True) if w > 0]
        if len(rates) < 2:
            return math.inf
        mean = sum(rates) / len(rates)
        return sum((x - mean) ** 2 for x in rates) / (len(rates) - 1) / len(rates)


def settle_hint(delta: dict[str, Any], before: Evidence, after: Evidence, duration_s: float | None) -> str:
    """How much more measuring would make a CI of this width exclude a difference of this size (1/sqrt(n) scaling)."""
    d, low, high = delta.get("delta"), delta.get("ci_low"), delta.get("ci_high")
    if d is None or low is None or high is None or abs(d) < 1e-12:
        return "no difference showed at all: more measuring would only narrow it around zero"
    factor = ((high - low) / 2 / abs(d)) ** 2
    per_side = max(before.measurements, after.measurements)
    more = max(1, math.ceil(per_side * factor) - per_side)
    length = f" of {duration_s:g} s" if duration_s else ""
    return f"about {words.count(more, 'more measurement')}{length} of each setting would settle a difference of {d:+.2f} good req/s"


def expectation(
    engine: str, resource: str, old: dict[str, str], new: dict[str, str], load: float, unit: str, knee: dict[str, Any]
) -> dict[str, Any]:
    """What the change should buy at the failing load if the resource was the only limit (and compute does not bind)."""
    b = knee.get("binding") or {}
    slots = binding.knob_for(engine, binding.BATCH_SLOTS)
    slot_knob = slots.env if slots is not None and slots.env in old else None
    users = load if unit == "users" else None
    if resource == binding.BATCH_SLOTS and slot_knob and users is not None:
        was, now = min(users, int(old[slot_knob])), min(users, int(new[slot_knob]))
        factor = now / was if was else None
        text = (
            f"up to x{factor:.1f} goodput at {load:g} users ({now:g} requests served at once instead of {was:g}), "
            f"less if compute binds"
        )
        return {"factor": factor, "text": text}
    running = b.get("mean_running")
    if resource == binding.KV_CAPACITY and users is not None and running:
        factor = users / running
        text = (
            f"up to x{factor:.1f} goodput at {load:g} users (the batch ran {running:.1f} requests at once of {load:g} "
            f"wanting to), less if compute binds"
        )
        return {"factor": factor, "text": text}
    return {"factor": None, "text": f"more {resource}: goodput up, by how much not estimated at {load:g} {unit}"}


def _duration(args: list[str]) -> float | None:
    if "--duration" in args and args.index("--duration") + 1 < len(args):
        try:
            return float(args[args.index("--duration") + 1])
        except ValueError:
            return None
    return None


def _ci(delta: dict[str, Any]) -> str:
    value, low, high = (numbers.fixed(delta.get(k), missing_when="None or NaN") for k in ("delta", "ci_low", "ci_high"))
    return f"{value} [{low}, {high}]"


def _fill(step: Step, result: dict[str, Any], engine: str) -> None:
    step.knee, step.first_failing, step.status = result["knee"], result["first_failing"], result["status"]
    step.binding = result["binding"]["resource"]
    step.evidence = result["binding"]["evidence"]
    knob = binding.knob_for(engine, step.binding)
    step.knob = knob.env if knob else None


def _knobs(values: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items())


def _json_default(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else str(value)


# ---------------------------------------------------------------- the native stack's side


def native_restart(engine: str, table: KnobTable) -> Callable[[dict[str, str]], None]:
    """Restart the native stack's engine with these knob values (the others as `table`, the tune's, says), wait until
    it serves."""
    from servescope.stack import native, supervisor

    def restart(values: dict[str, str]) -> None:
        if running_with(engine, values):
            return  # already so (a refused change never stopped it): no warm-up for nothing
        knob = KnobTable({**table, **values})
        prep = native.prepare([engine], knob)  # cached after `make up`: a few checks
        native.check(knob, prep)  # refuses what cannot fit
        (service,) = [s for s in native.engine_services(knob, prep, knob["SERVESCOPE_BIND"]) if s.name == engine]
        record = supervisor.records().get(engine)
        if record is not None and "--no-repack" in record.cmdline:
            service.cmd.append("--no-repack")  # what `up` found this CPU needs (AMX advertised, unusable)
        if record is not None:
            supervisor.stop(record)
        supervisor.start_ready(service, label=f"{service.title} restarting ({_knobs(values)})")

    return restart


def native_kv_fit(knob: KnobTable) -> KvFit:
    """The model's KV bytes per token and the max model length, as the native stack plans vLLM."""
    from servescope.stack import native, vllm

    prep = native.prepare([engines.VLLM.name], knob)  # cached after `make up`
    config = json.loads((prep.engine[engines.VLLM.name].model / "config.json").read_text())
    return KvFit(vllm.kv_bytes_per_token(config, knob["VLLM_DTYPE"]), int(knob["VLLM_MAX_MODEL_LEN"]))


def running_with(engine: str, values: dict[str, str]) -> bool:
    """Whether the running engine was started with these knob values (its command line; vLLM's KV space: its env)."""
    import psutil

    from servescope.stack import supervisor

    record = supervisor.records().get(engine)
    proc = supervisor.process_of(record) if record is not None else None
    if proc is None:
        return False
    argv = record.cmdline
    tuned = [lever.knob for lever in engines.kind(engine).levers if lever.env in values]
    for knob in (k for k in tuned if k.option):
        flag = knob.option
        if flag not in argv or argv.index(flag) + 1 >= len(argv) or argv[argv.index(flag) + 1] != values[knob.env]:
            return False
    for knob in (k for k in tuned if not k.option):  # a knob the engine reads from its environment
        try:
            if proc.environ().get(knob.env) != values[knob.env]:
                return False
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            return False
    return True


def main(engine: str, loadgen_args: list[str]) -> int:
    """`python -m servescope.stack tune --engine E [loadgen knee options]`: the loop on the native stack's running engine."""
    from servescope.report import tuning
    from servescope.stack import native, supervisor

    if engine not in TUNED:
        raise TuneError(f"tune: ENGINE={engine!r}: expected one of {', '.join(TUNED)}")
    record = supervisor.records().get(engine)
    if record is None or supervisor.process_of(record) is None:
        raise TuneError(f"tune: {engine} is not running on the native stack: `make up` first (tune restarts it)")
    table = KnobTable.from_env()  # the tune's entry: the knobs, read once
    values = {k: table[k] for k in TUNED[engine]}
    restart = native_restart(engine, table)
    if not running_with(engine, values):
        say(f"tune: {engine} runs with other values than the knobs: restarting it with {_knobs(values)}")
        restart(values)
    folder = new_folder(native.results_dir(table), engine)
    say(f"tune: {engine} from {_knobs(values)}; trajectory in {folder}")
    started = time.monotonic()
    tuner = Tuner(
        engine,
        record.url,
        values,
        restart,
        folder,
        loadgen_args=loadgen_args,
        max_steps=table.int("TUNE_MAX_STEPS"),
        kv=native_kv_fit(table) if engines.kind(engine).slots_within_kv else None,
        max_measurements=table.int("TUNE_MAX_MEASUREMENTS"),
    )
    try:
        tuner.run()
    finally:
        tuning.write(folder)
    for line in tuning.lines(json.loads((folder / TUNE).read_text())):
        say(line)
    say(f"tune: {elapsed(time.monotonic() - started)} in all; report {folder / 'report.html'}")
    say(last_line(engine, record.url, tuner.running, tuner.best()))
    return 0


def last_line(engine: str, url: str, running: dict[str, str] | None, best: dict[str, str]) -> str:
    """Which setting runs now, checked: the engine answers its health check, with the values it was last started with."""
    from servescope import engines
    from servescope.host import probe

    health = url.rstrip("/") + engines.kind(engine).health_path
    up = probe.is_up(health, timeout=10)
    if not up:
        was = _knobs(running) if running else "an unknown setting"
        return (
            f"tune: {engine} is NOT answering at {health} (last started with {was}): the setting is not back; "
            f"`make down && make up` starts it with the knobs in .env"
        )
    if running != best:
        return f"tune: {engine} runs with {_knobs(running or {})}, not the best setting {_knobs(best)}: restart it"
    return (
        f"tune: {engine} runs with {_knobs(best)} (checked: it answers): put that in .env to keep it after `make down`"
    )


def new_folder(results: Path, engine: str) -> Path:
    """The tune's folder, its owner's alone as every run folder is (FOLDER_MODE): the runs inside it are."""
    folder = Path(results) / f"{new_run_id()}-tune-{engine}"
    folder.mkdir(parents=True, exist_ok=False)
    os.chmod(folder, FOLDER_MODE)  # mkdir's mode passes through the umask
    return folder
