"""`make tune ENGINE=vllm|llamacpp`: knee, turn the knob the binding resource names, restart, measure the same load again; keep it only when goodput rises beyond its CI.

From the current knobs (.env.example < .env < environment) on the native stack:

  1. `python -m loadgen knee` finds the highest load that meets the SLOs, the lowest that fails,
     and the resource that ran out there (batch slots, KV capacity, compute) with its knob.
  2. Compute, or no rule for the resource, or no failing load below LOADGEN_KNEE_MAX: stop.
  3. The knob goes up (slots and KV space double; llama.cpp's context grows with its slots so each
     slot keeps its share) and the engine is restarted with it.
  4. The same workload is measured again: the failing load, the same prompts, max_tokens, duration
     and number of measurements. Goodput (servescope/slo.py's good requests; closed loop: N users x
     good / request time, Little's law; open loop: arrivals/s x good share) of the new setting against
     the old, with a seeded bootstrap CI on the difference, requests resampled (report/stats.py): kept
     only when the CI lies above zero, else the engine goes back to the old value and the loop stops. A kept value gets its own knee (step 1), from the last knee up.

Everything goes to one folder, results/<tune-id>/: each knee and measurement run as a run folder
inside it, tune.json (the trajectory), and report.md/.html/.json with the trajectory's table and
plot (report/tuning.py; `make report` shows it while it is the latest run). The engine is left
running with the best setting; the knob line to keep it goes in .env.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from report import stats
from servescope import binding, knobs, slo
from servescope.runfolder import KNEE, MANIFEST, RunFolder, new_run_id
from stack.errors import StackError
from stack.progress import elapsed, say
from stack.vllm import GIB

TUNE = "tune.json"
TUNED = {  # the knobs a tune may move, per engine (servescope/binding.py names them per resource)
    "vllm": ("VLLM_MAX_NUM_SEQS", "VLLM_CPU_KVCACHE_SPACE"),
    "llamacpp": ("LLAMACPP_PARALLEL", "LLAMACPP_CTX"),
}
MAX_SLOTS = 256  # past this, more slots is not a serving setting a CPU can use
MAX_CONTEXT = 1 << 20


class TuneError(StackError):
    """A tune that cannot go on: one line."""


@dataclass
class Step:
    """One setting tried: its knee (when it was kept) and its goodput at the workload it was judged on."""

    step: int
    knobs: dict[str, str]
    decision: str  # start, kept, reverted, refused
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
    runs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class KvFit:
    """What the seed's inequality needs to check a vLLM slot count: VLLM_MAX_NUM_SEQS x VLLM_MAX_MODEL_LEN must fit
    the KV tokens VLLM_CPU_KVCACHE_SPACE holds (the native stack refuses to start vLLM otherwise)."""

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
    """More of the binding resource: the new knob values and what changed, or None when there is no rule or no room.

    vLLM's slots double within the seed's inequality (kv): up to the most the KV space admits, and once they are
    there, with the KV space that admits the doubled count."""
    new = dict(values)
    if (engine, resource) == ("vllm", binding.BATCH_SLOTS):
        slots = int(values["VLLM_MAX_NUM_SEQS"])
        if slots * 2 > MAX_SLOTS:
            return None
        want, what = slots * 2, f"VLLM_MAX_NUM_SEQS {slots} -> {slots * 2}"
        space = float(values["VLLM_CPU_KVCACHE_SPACE"])
        most = kv.most_slots(space) if kv is not None else want
        if want > most:
            if most > slots:
                want = most
                what = (
                    f"VLLM_MAX_NUM_SEQS {slots} -> {most} (the most {space:g} GiB of KV admits at "
                    f"VLLM_MAX_MODEL_LEN={kv.max_model_len})"
                )
            else:
                new["VLLM_CPU_KVCACHE_SPACE"] = str(kv.space_for(want))
                what += f", VLLM_CPU_KVCACHE_SPACE {space:g} -> {kv.space_for(want)} GiB (so that {want} fit)"
        new["VLLM_MAX_NUM_SEQS"] = str(want)
        return new, what
    if (engine, resource) == ("vllm", binding.KV_CAPACITY):
        space = float(values["VLLM_CPU_KVCACHE_SPACE"])
        new["VLLM_CPU_KVCACHE_SPACE"] = f"{space * 2:g}"
        return new, f"VLLM_CPU_KVCACHE_SPACE {space:g} -> {space * 2:g} GiB"
    if (engine, resource) == ("llamacpp", binding.BATCH_SLOTS):
        slots, ctx = int(values["LLAMACPP_PARALLEL"]), int(values["LLAMACPP_CTX"])
        per_slot = max(1, ctx // slots)  # llama.cpp splits -c over the slots: keep each slot's share
        if slots * 2 > MAX_SLOTS or per_slot * slots * 2 > MAX_CONTEXT:
            return None
        new["LLAMACPP_PARALLEL"], new["LLAMACPP_CTX"] = str(slots * 2), str(per_slot * slots * 2)
        return new, f"LLAMACPP_PARALLEL {slots} -> {slots * 2} (LLAMACPP_CTX {ctx} -> {per_slot * slots * 2})"
    if (engine, resource) == ("llamacpp", binding.KV_CAPACITY):
        ctx = int(values["LLAMACPP_CTX"])
        if ctx * 2 > MAX_CONTEXT:
            return None
        new["LLAMACPP_CTX"] = str(ctx * 2)
        return new, f"LLAMACPP_CTX {ctx} -> {ctx * 2}"
    return None


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
        self.steps: list[Step] = []
        self.stop_reason = ""
        self.started_at = time.time()

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
        return json.loads(out.read_text())

    def goodput_sample(self, run_id: str, result: dict[str, Any], level: float) -> tuple[list, list, float]:
        """(good per request, its time share, scale) over every trusted measurement of `level` in a knee run.

        Closed loop, N users: goodput = N x sum(good) / sum(E2E) (Little's law: each user sends again as its
        request ends). Open loop: the phases' requests per second x their good share. A failed request without
        an E2E has no time to count and is left out of the closed loop's sums.
        """
        spec = slo.parse(result["spec"], result["objective"])
        probes = [
            p
            for p in result["probes"]
            if p["level"] == level and p["started_at"] is not None and not p.get("noisy")  # the knee's trusted ones
        ]
        names = {p["phase"] for p in probes}
        records = [r for r in RunFolder(self.folder / run_id).requests() if r.phase in names]
        if result["over"] == "concurrency":
            timed = [r for r in records if r.e2e_s]
            return [float(spec.good(r)) for r in timed], [r.e2e_s for r in timed], float(level)
        wall = sum(p["ended_at"] - p["started_at"] for p in probes)
        return [float(spec.good(r)) for r in records], [1.0] * len(records), len(records) / wall if wall > 0 else 0.0

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
            say(f"tune: step {n}: {current.binding} ran out at {workload:g}; {what}, restarting {self.engine}")
            try:
                self.restart(new_values)
            except StackError as exc:
                self.steps.append(Step(n, new_values, "refused", evidence=str(exc)))
                self.stop_reason = f"{what} could not be applied: {exc}"
                self._restore(self.values)
                return
            level = f"{workload:g}"
            measure_run = f"step{n}-measure"
            repeats = str(
                max(1, len([p for p in knee_result["probes"] if p["level"] == workload and not p.get("noisy")]))
            )
            measured = self.knee(
                measure_run,
                *("--min-load", level, "--start-load", level, "--max-load", level, "--knee-repeats", repeats),
            )
            before = self.goodput_sample(knee_run, knee_result, workload)
            after = self.goodput_sample(measure_run, measured, workload)
            delta = stats.bootstrap_ratio_delta(after, before)
            row = _level(measured, workload)
            step = Step(
                n,
                new_values,
                "",
                workload=workload,
                goodput_rps=row["goodput_rps"] if row else None,
                good_tokens_per_s=row["good_tokens_per_s"] if row else None,
                delta=delta,
                runs=[measure_run],
            )
            gain = delta["ci_low"] is not None and delta["ci_low"] > 0
            say(
                f"tune: goodput at {level} {knee_result['unit']}: {_n(delta['baseline'])} -> "
                f"{_n(delta['current'])} good req/s, delta {_n(delta['delta'])} "
                f"[{_n(delta['ci_low'])}, {_n(delta['ci_high'])}] 95% CI: {'kept' if gain else 'no gain'}"
            )
            if not gain:
                step.decision = "reverted"
                self.steps.append(step)
                self.stop_reason = f"{what} did not raise goodput beyond its 95% CI: went back"
                self._restore(self.values)
                return
            self.values = new_values
            knee_run = f"step{n}-knee"
            start = current.knee if current.knee is not None else None
            knee_result = self.knee(knee_run, *(("--start-load", f"{start:g}") if start else ()))
            step.decision = "kept"
            _fill(step, knee_result, self.engine)
            step.runs.append(knee_run)
            self.steps.append(step)
            current = step
        self.stop_reason = self.stop_reason or f"TUNE_MAX_STEPS ({self.max_steps}) reached"

    def _step(self, n: int, values: dict[str, str], decision: str, result: dict, runs: list[str]) -> Step:
        step = Step(n, dict(values), decision, runs=runs)
        _fill(step, result, self.engine)
        row = _level(result, step.first_failing) if step.first_failing is not None else None
        if row:
            step.workload, step.goodput_rps, step.good_tokens_per_s = (
                step.first_failing,
                row["goodput_rps"],
                row["good_tokens_per_s"],
            )
        self.steps.append(step)
        return step

    def _can_go_on(self, current: Step) -> bool:
        if current.status == "meets the SLOs up to the highest load":
            self.stop_reason = "the SLOs hold up to the knee's --max-load (LOADGEN_KNEE_MAX): nothing ran out"
        elif current.status == "fails at the lowest load" and current.binding in (binding.COMPUTE, binding.UNKNOWN):
            self.stop_reason = f"the SLOs fail even at the lowest load and the binding resource is {current.binding}"
        elif current.binding == binding.COMPUTE:
            self.stop_reason = "the binding resource is compute: no serving knob adds more"
        elif current.binding in (None, binding.UNKNOWN):
            self.stop_reason = f"the binding resource could not be named ({current.evidence})"
        elif current.first_failing is None:
            self.stop_reason = "no failing load to judge a change at"
        else:
            return True
        return False

    def _restore(self, values: dict[str, str]) -> None:
        say(f"tune: restarting {self.engine} with {_knobs(values)}")
        self.restart(values)

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
        (self.folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")

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
        tmp = self.folder / (TUNE + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
        tmp.replace(self.folder / TUNE)
        self.write_manifest("complete" if self.stop_reason else "interrupted")


def _fill(step: Step, result: dict[str, Any], engine: str) -> None:
    step.knee, step.first_failing, step.status = result["knee"], result["first_failing"], result["status"]
    step.binding = result["binding"]["resource"]
    step.evidence = result["binding"]["evidence"]
    knob = binding.knob_for(engine, step.binding)
    step.knob = knob.env if knob else None


def _level(result: dict[str, Any], level: float | None) -> dict[str, Any] | None:
    return next((row["result"] for row in result["levels"] if row["level"] == level), None)


def _knobs(values: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items())


def _n(value: float | None) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"


def _json_default(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else str(value)


# ---------------------------------------------------------------- the native stack's side


def native_restart(engine: str) -> Callable[[dict[str, str]], None]:
    """Restart the native stack's engine with these knob values (the other knobs as they are), wait until it serves."""
    from stack import native, supervisor

    def restart(values: dict[str, str]) -> None:
        if running_with(engine, values):
            return  # already so (a refused change never stopped it): no warm-up for nothing
        knob = {**knobs.load(), **values}
        prep = native.prepare([engine])  # cached after `make up`: a few checks
        swap_used = native.check_vllm_plan(knob, prep) if engine == "vllm" else False  # refuses what cannot fit
        (service,) = [
            s for s in native.engine_services(knob, prep, knob["SERVESCOPE_BIND"], swap_used) if s.name == engine
        ]
        record = supervisor.records().get(engine)
        if record is not None and "--no-repack" in record.cmdline:
            service.cmd.append("--no-repack")  # what `up` found this CPU needs (AMX advertised, unusable)
        if record is not None:
            supervisor.stop(record)
        proc, started = supervisor.start(service)
        supervisor.wait_ready(
            started, proc, service.ready_timeout, label=f"{service.title} restarting ({_knobs(values)})"
        )

    return restart


def native_kv_fit() -> KvFit:
    """The model's KV bytes per token and the max model length, as the native stack plans vLLM."""
    from stack import native, vllm

    knob = knobs.load()
    prep = native.prepare(["vllm"])  # cached after `make up`
    config = json.loads((prep.vllm_model / "config.json").read_text())
    return KvFit(vllm.kv_bytes_per_token(config, knob["VLLM_DTYPE"]), int(knob["VLLM_MAX_MODEL_LEN"]))


def running_with(engine: str, values: dict[str, str]) -> bool:
    """Whether the running engine was started with these knob values (its command line; vLLM's KV space: its env)."""
    import psutil

    from stack import supervisor

    record = supervisor.records().get(engine)
    proc = supervisor.process_of(record) if record is not None else None
    if proc is None:
        return False
    argv = record.cmdline
    flags = {"VLLM_MAX_NUM_SEQS": "--max-num-seqs", "LLAMACPP_PARALLEL": "--parallel", "LLAMACPP_CTX": "-c"}
    for key, flag in flags.items():
        if key in values and (
            flag not in argv or argv.index(flag) + 1 >= len(argv) or argv[argv.index(flag) + 1] != values[key]
        ):
            return False
    if "VLLM_CPU_KVCACHE_SPACE" in values:
        try:
            return proc.environ().get("VLLM_CPU_KVCACHE_SPACE") == values["VLLM_CPU_KVCACHE_SPACE"]
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            return False
    return True


def main(engine: str, loadgen_args: list[str]) -> int:
    """`python -m stack tune --engine E [loadgen knee options]`: the loop on the native stack's running engine."""
    from report import tuning
    from stack import native, supervisor

    if engine not in TUNED:
        raise TuneError(f"tune: ENGINE={engine!r}: expected one of {', '.join(TUNED)}")
    record = supervisor.records().get(engine)
    if record is None or supervisor.process_of(record) is None:
        raise TuneError(f"tune: {engine} is not running on the native stack: `make up` first (tune restarts it)")
    values = {k: knobs.get(k) for k in TUNED[engine]}
    restart = native_restart(engine)
    if not running_with(engine, values):
        say(f"tune: {engine} runs with other values than the knobs: restarting it with {_knobs(values)}")
        restart(values)
    folder = new_folder(native.results_dir(knobs.load()), engine)
    say(f"tune: {engine} from {_knobs(values)}; trajectory in {folder}")
    started = time.monotonic()
    tuner = Tuner(
        engine,
        record.url,
        values,
        restart,
        folder,
        loadgen_args=loadgen_args,
        max_steps=knobs.get_int("TUNE_MAX_STEPS"),
        kv=native_kv_fit() if engine == "vllm" else None,
    )
    try:
        tuner.run()
    finally:
        tuning.write(folder)
    for line in tuning.lines(json.loads((folder / TUNE).read_text())):
        say(line)
    say(f"tune: {elapsed(time.monotonic() - started)} in all; report {folder / 'report.html'}")
    say(f"tune: {engine} keeps running with {_knobs(tuner.best())}: put that in .env to keep it after `make down`")
    return 0


def new_folder(results: Path, engine: str) -> Path:
    folder = Path(results) / f"{new_run_id()}-tune-{engine}"
    folder.mkdir(parents=True, exist_ok=False)
    return folder
