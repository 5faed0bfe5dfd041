"""`python -m loadgen`: the reference experiment (`compare`), one command per scenario, and Locust's web UI; each writes a run folder."""

from __future__ import annotations  # noqa: I001 - Locust first (gevent monkey-patching)

# Locust (and so gevent's monkey-patching) first: every socket below must be cooperative.
from locust.env import Environment
from locust.event import Events

import argparse
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import gevent
from gevent.event import Event

from loadgen import client as llm
from loadgen import options, trials
from loadgen.annotations import PhaseAnnotator
from loadgen.commands import USAGE_ERRORS, Plan, UsageError, build_parser, prepare
from loadgen.isolate import Isolation
from loadgen.locust_outputs import write_locust_outputs
from loadgen.locustfile import USER_CLASSES
from loadgen.manifest import build as build_manifest
from loadgen.phase_driver import PhaseDriver, Users
from loadgen.recorder import Recorder
from loadgen.runplan import RunPlan
from loadgen.scenarios import LoadRun, spawn_rate_for
from loadgen.summary import print_summary
from loadgen.targets import chosen_url_line, default_url, probe, route_line
from servescope.host import cpu_priority
from servescope.contracts import thresholds
from servescope.judgements import slo
from servescope.contracts.runfolder import RunFolder
from servescope.contracts.settings import KnobTable
from servescope.prometheus.sampler import Sampler
from servescope.contracts.urls import redact

if TYPE_CHECKING:
    from loadgen import distributed
    from loadgen.client_metrics import ClientMetrics

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["quick"]:
        from loadgen.quick import main as quick

        return quick(argv[1:])
    if argv[:1] == ["webui"]:
        known, extra = build_parser(argv=argv).parse_known_args(argv)
        return webui(known, extra)
    args = build_parser(argv=argv).parse_args(argv)
    try:
        llm.check_geventhttpclient()
        return run_headless(RunPlan.from_args(args))  # the namespace ends here
    except (*USAGE_ERRORS, llm.HttpClientError) as exc:
        print(f"loadgen: {options.said(exc)}", file=sys.stderr)
        return EXIT_USAGE


def webui(args: argparse.Namespace, extra: list[str]) -> int:
    """Locust itself on the project's locustfile, its form filled in so START runs the chosen scenario untouched.

    Host is the engine's URL, Number of users the burst size (and the ramp-up the same: a phase starts its users
    at once); the table's options go through as they were resolved here; other arguments pass to Locust as given.
    """
    knobs = KnobTable.from_env()
    url = args.engine_url or default_url(args.engine, knobs)
    if not args.engine_url:
        print(f"loadgen: {chosen_url_line(args.engine, url, knobs)}", flush=True)
    held = _held_by(args.bind, args.port)
    if held == "locust":  # `make up` runs one: say where, rather than a traceback from a second on the same port
        print(
            f"loadgen: a Locust web UI already runs at http://{args.bind}:{args.port} (`make up` starts one): open it "
            f"there, or set LOCUST_PORT for a second one",
            flush=True,
        )
        return 0
    if held:
        from servescope.host.ports import free_port

        free = free_port(args.bind)
        print(f"loadgen: port {args.port} is in use ({held}): the web UI takes port {free}", flush=True)
        args.port = free
    locustfile = Path(__file__).resolve().parent / "locustfile.py"
    cmd = [sys.executable, "-m", "locust", "-f", str(locustfile), "--web-host", args.bind, "--web-port", str(args.port)]
    cmd += ["--host", url, "--users", str(args.users), "--spawn-rate", str(args.users)]
    for option in options.for_locust():
        value = getattr(args, option.dest)
        if option.dest == "engine_url" or value in (None, "", False):
            continue
        cmd += [option.flag] if option.switch else [option.flag, str(value)]
    print(
        f"Locust web UI on http://{args.bind}:{args.port}  ({args.engine} at {redact(url)}, "
        f"{args.scenario}, {args.users} users; more under Custom parameters)",
        flush=True,
    )
    os.execv(sys.executable, [*cmd, *extra])
    return 0  # not reached


def _held_by(host: str, port: int) -> str | None:
    """None when nothing listens on host:port; "locust" when a Locust web UI answers there; else a few words."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            pass
    except OSError:
        return None
    from servescope.host import bounded_http  # only here: a headless run's start-up never pays for it

    try:  # bounded as a whole: whatever holds the port, a page dripping or of 10 GB costs 2 s and 1 MB at most
        page = bounded_http.get(f"http://{host}:{port}/", 2, max_bytes=1 << 20).text()[:20000]
    except bounded_http.ServiceError:
        return "something that is not a web page"
    return "locust" if "locust" in page.lower() else "another web service"


def run_headless(run_plan: RunPlan) -> int:
    """A headless command: checked, its folder opened, the engines probed, the phases run, the folder finished."""
    plan = prepare(run_plan)
    spec = run_plan.spec  # read with the options: a bad SLO was one line before anything started
    for target in plan.targets:
        if target.url_from:
            print(f"loadgen: {chosen_url_line(target.kind, target.url, plan.knobs)}", flush=True)
    run = HeadlessRun(run_plan, plan, spec)
    run.probe_engines()
    run.prepare_trials()
    run.start_load()
    try:
        run.run_phases()
    finally:
        run.finish()
    return _say_outcome(run.load, run.folder, run.out or sys.stdout, run.status)


class HeadlessRun:
    """One headless run's parts, from its folder to its last record, each step a method run_headless calls in turn."""

    def __init__(self, run_plan: RunPlan, plan: Plan, spec: slo.SloSpec):
        self.run_plan, self.plan = run_plan, plan
        # CPU_PRIORITY: this process and the run's engines on this host weighted above the rest (servescope/
        # cpu_priority.py), before the folder exists: CPU_PRIORITY=on where it cannot be applied stops here.
        self.cpu_priority = cpu_priority.protect_run([(t.instance, t.kind, t.url) for t in plan.targets])
        self.folder = _create_folder(Path(run_plan.results), run_plan.run_id)
        # From here on Ctrl-C / SIGTERM end the run cleanly: the folder is finished, not abandoned.
        self.interrupted, self.handlers = _stop_on_signals()
        self.out = None if run_plan.quiet else sys.stdout
        bind = run_plan.settings.bind
        self.metrics = _serve_client_metrics(spec, run_plan.metrics_port, bind)
        self.load: LoadRun | None = None
        # A folder that stops taking writes ends the run (the run exists before the first record is written).
        self.recorder = Recorder(
            folder=self.folder, metrics=self.metrics, out=self.out, on_failure=lambda reason: self.load.abort(reason)
        )
        self.started_at = time.time()
        self.recorder.line(f"run folder: {self.folder.path}")
        self.recorder.line(self.cpu_priority.describe())
        if self.metrics is not None:
            self.recorder.line(f"client metrics on http://{bind}:{self.metrics.port}/metrics")
        self.fleet: distributed.Fleet | None = None  # --workers N: the worker processes and their coordinator
        self.status = "complete"

    def probe_engines(self) -> None:
        """Each engine probed and said; the sampler started on them."""
        _probe_engines(
            self.plan, self.recorder, http_client=self.run_plan.http_client, timeout_s=self.run_plan.request_timeout
        )
        # Engine gauges into samples.jsonl.
        self.sampler = Sampler.for_run(
            self.folder, [(t.kind, t.instance) for t in self.plan.targets], self.run_plan.settings.sampler
        )
        self.recorder.line(self.sampler.describe())

    def prepare_trials(self) -> None:
        """Isolation, the host-noise keeper, the trials' notes; the manifest written as "running"."""
        self.isolation = Isolation(self.run_plan.isolate, self.recorder.line)
        self.keeper = trials.NoiseKeeper(self.plan.targets, say=self.recorder.line)
        self.recorder.annotate = self.keeper.annotate  # every phase record carries the host's noise while it ran
        self.trial_notes: dict = {"repetitions": self.run_plan.repetitions, "isolate": self.isolation.mode}
        self.trial_notes["warmup"] = {}
        self.trial_notes["settle_max_s"] = self.run_plan.settle_max_s
        self.trial_notes["cpu_priority"] = self.cpu_priority.as_dict()
        # The host before the reference experiment, for its Summary only: long enough to see a neighbour that comes
        # and goes (busy 2 s of every 5 was missed by one second), short beside the run.
        baseline_s = thresholds.knob_number("LOADGEN_HOST_BASELINE_S", 0, 60)
        if self.run_plan.command == "compare" and baseline_s > 0:
            self.trial_notes["host_before"] = self.keeper.baseline(baseline_s)
        problem = self.manifest("running")
        if problem:
            raise UsageError(problem)

    def manifest(self, status: str, ended_at: float | None = None) -> str | None:
        """Write manifest.json; why not, in one line, when the folder refuses it."""
        used_sets = {self.plan.prompt_set.name: self.plan.prompt_set}
        for phase in self.plan.phases:
            used_sets.setdefault(phase.settings.prompt_set.name, phase.settings.prompt_set)
        fleet = self.fleet
        try:
            self.folder.write_manifest(
                build_manifest(
                    command=" ".join(["python -m loadgen", *sys.argv[1:]])
                    if sys.argv[1:]
                    else f"python -m loadgen {self.run_plan.command}",
                    scenario=self.run_plan.command,
                    targets=self.plan.targets,
                    prompt_sets=list(used_sets.values()),
                    flags=self.run_plan.flags(),
                    started_at=self.started_at,
                    status=status,
                    ended_at=ended_at,
                    phases=[p.title for p in self.plan.phases],
                    trials=self.trial_notes,
                    workers=fleet.coordinator.describe() if fleet is not None else None,
                    distributed=fleet.coordinator.summary() if fleet is not None else None,
                )
            )
        except OSError as exc:
            return f"run folder {self.folder.path}: cannot write manifest.json ({exc.strerror or exc})"
        return None

    def start_load(self) -> None:
        """Locust's environment, the run its users read, the workers (if any) and the runner."""
        self.environment = Environment(
            user_classes=list(USER_CLASSES.values()),
            events=Events(),
            # With workers, Locust's master also reads enable_rebalancing (off: loadgen/distributed.py decides).
            parsed_options=argparse.Namespace(
                http_client=self.run_plan.http_client, headless=True, enable_rebalancing=False
            ),
        )
        self.load = LoadRun(self.plan.phases, self.recorder, folder=self.folder, started_at=self.started_at)
        self.environment.servescope_run = self.load
        if self.run_plan.workers:
            from loadgen import distributed  # --workers only: a run in this process never loads the coordinator

            try:
                self.fleet = distributed.Fleet(
                    self.environment,
                    self.run_plan.workers,
                    self.folder.path / distributed.WORKERS_LOG,
                    say=self.recorder.line,
                    warn=lambda text: print(f"loadgen: {text}", file=sys.stderr, flush=True),
                    engines=list(self.run_plan.engines),
                )
                self.fleet.send_plan(self.run_plan, self.plan.targets)
                self.fleet.coordinator.attach(self.load)
            except distributed.FleetError as exc:
                self.load.abort(str(exc))
        self.runner = self.fleet.runner if self.fleet is not None else self.environment.create_local_runner()
        self.annotator = PhaseAnnotator(self.run_plan.grafana_url)

    def run_phases(self) -> None:
        """Every phase in turn by the one phase driver (loadgen/phase_driver.py), then the run's status; the last phase
        closed. Locust's runner sends each phase's users: in this process, or the master's to its workers."""
        users = RunnerUsers(self.runner)
        if self.fleet is not None:
            from loadgen import distributed

            users = distributed.WorkerUsers(self.fleet.coordinator, users)
        self.status = PhaseDriver(
            self.load,
            users,
            stops={"failed": self.load.aborted, "interrupted": self.interrupted},
            sampler=self.sampler,
            ready=self.get_ready,
            noise=self.keeper,
            retries=self.run_plan.noise_retries,
            annotator=self.annotator,
            say=self.recorder.line,
        ).drive()

    def get_ready(self, phase, previous) -> bool:
        """The phase's engine warmed up (once) and quiet after a switch from `previous`'s engine; False when the run
        stops meanwhile."""
        target = phase.settings.target
        self.isolation.focus(target)
        if target.instance not in self.trial_notes["warmup"]:
            warm = trials.warm_up(
                target,
                phase.settings,
                self.run_plan.warmup,
                http_client=self.run_plan.http_client,
                timeout_s=self.run_plan.request_timeout,
                say=self.recorder.line,
                interrupted=self.interrupted,
            )
            if warm is None:
                return False
            self.trial_notes["warmup"][target.instance] = warm
            self.recorder.line(self.keeper.locate(target))
        self.keeper.settle(
            target,
            self.run_plan.settle_max_s,
            switched=previous is not None and previous.settings.target.instance != target.instance,
            say=self.recorder.line,
            interrupted=self.interrupted,
        )
        return not self.interrupted.is_set()

    def finish(self) -> None:
        """Everything started, stopped; Locust's outputs and the final manifest written; the client metrics kept up
        for a last scrape."""
        self.isolation.release()
        self.sampler.close()
        self.keeper.close()  # after load.finish(): the last phase's records took their energy
        self.runner.stop()
        if self.fleet is not None:
            self.fleet.close()  # after its last records, before the folder is finished
            dropped = self.fleet.coordinator.dropped_line()
            if dropped:
                print(f"loadgen: {dropped}", file=sys.stderr, flush=True)
        else:
            self.runner.quit()
        if self.recorder.failure is None:  # a folder that refused a record would refuse these too
            try:
                write_locust_outputs(self.environment, self.folder.path)
            except Exception as exc:  # noqa: BLE001 - Locust's own report must never cost us the run folder
                print(f"loadgen: Locust CSV/HTML not written: {exc}", file=sys.stderr)
            problem = self.manifest(self.status, time.time())
            if problem:
                self.load.abort(problem)
        linger = self.run_plan.metrics_linger
        if self.metrics is not None and linger > 0 and self.status == "complete":
            # Prometheus scrapes every few seconds: without this the last requests' samples are never scraped.
            print(
                f"loadgen: client metrics stay up {linger:g} s more so Prometheus scrapes the final "
                f"samples (--metrics-linger 0 to skip; Ctrl-C ends it)",
                flush=True,
            )
            self.interrupted.wait(timeout=linger)
        for handler in self.handlers:
            handler.cancel()
        if self.metrics is not None:
            self.metrics.close()


class RunnerUsers(Users):
    """A headless run's users: Locust's runner starts a phase's users at once and lets them all go after it (a local
    runner, or a master dispatching them to its workers)."""

    def __init__(self, runner):
        self.runner = runner

    def start(self, phase) -> None:
        self.runner.start(phase.users, spawn_rate=spawn_rate_for(phase), user_classes=[USER_CLASSES[phase.user_class]])

    def release(self, phase) -> None:
        self.runner.start(0, spawn_rate=spawn_rate_for(phase))
        if self.runner.spawning_greenlet is not None:
            self.runner.spawning_greenlet.join(timeout=10)

    def halt(self) -> None:
        self.runner.stop()


def _create_folder(results: Path, run_id: str | None) -> RunFolder:
    """The run's folder, or one line saying why there is none."""
    try:
        return RunFolder.create(results, run_id)
    except FileExistsError:
        raise UsageError(f"run folder {results / run_id} already exists: pick another --run-id") from None
    except OSError as exc:
        raise UsageError(f"cannot create a run folder under {results}: {exc.strerror or exc}") from None


def _stop_on_signals() -> tuple[Event, list]:
    """An event Ctrl-C and SIGTERM set (the run then stops, keeping every finished request), and their handlers."""
    interrupted = Event()

    def on_signal(signum: int) -> None:
        if not interrupted.is_set():
            print(
                f"\nloadgen: {signal.Signals(signum).name}: stopping, keeping every finished request",
                file=sys.stderr,
                flush=True,
            )
        interrupted.set()

    return interrupted, [gevent.signal_handler(sig, on_signal, sig) for sig in (signal.SIGINT, signal.SIGTERM)]


def _serve_client_metrics(spec: slo.SloSpec, port: int, bind: str) -> ClientMetrics | None:
    """The client-side /metrics on `port` (0: none); a port that cannot be had is one line, and the run goes on."""
    if not port:
        return None
    from loadgen.client_metrics import ClientMetrics  # prometheus_client: only where the metrics are served

    metrics = ClientMetrics(spec=spec)
    try:
        metrics.port = metrics.serve(port, addr=bind)
    except OSError as exc:
        try:  # held (`make up`'s web UI serves its own there): a free port, said, so a run never loses them
            metrics.port = metrics.serve(0, addr=bind)
        except OSError:
            print(
                f"loadgen: client metrics not exposed (port {port}: {exc.strerror or exc}); the run goes on",
                file=sys.stderr,
                flush=True,
            )
            return None
        print(
            f"loadgen: client metrics port {port} is in use ({exc.strerror or exc}): serving them on port "
            f"{metrics.port} instead (Prometheus scrapes {port}: the run folder keeps every number either way)",
            flush=True,
        )
    return metrics


def _probe_engines(plan: Plan, recorder: Recorder, *, http_client: str, timeout_s: float) -> None:
    """Each engine's version and model (and, for prompts sized by the engine, its chat template), said in a line."""
    targets, prompt_set, phases = plan.targets, plan.prompt_set, plan.phases
    for target in targets:
        probe(target, plan.knobs, plan.model_for(target))
        version = target.info.get("version") or "unknown"
        problems = (
            f" (engine not answering: {target.info['probe_errors'][0]})" if target.info.get("probe_errors") else ""
        )
        recorder.line(
            f"engine {target.instance} at {redact(target.url)}: version {version}, "
            f"model {target.model or '?'}{redact(problems)}"
        )
        if not target.url_from and route_line(target, plan.knobs):
            # A URL given: say whether it is the stack's proxy (a chosen one's line said so already), --quiet or not.
            print(f"loadgen: {route_line(target, plan.knobs)}", flush=True)
        if prompt_set.sized_by_engine and not target.info.get("probe_errors"):
            settings = next(p.settings for p in phases if p.settings.target is target)
            line = trials.measure_template(target, settings, http_client=http_client, timeout_s=timeout_s)
            if "template_tokens" in target.info:
                recorder.line(line)
            else:  # the prompts' lengths are off by the template: said even with --quiet
                print(f"loadgen: {line}", file=sys.stderr, flush=True)


def _say_outcome(run: LoadRun, folder: RunFolder, out, status: str) -> int:
    """The run's summary, each search's answer and where the folder is; the exit code."""
    try:
        print_summary(folder, out)
    except OSError:
        pass  # a folder that cannot be read back: the failure line below says what happened to it
    for planner in dict.fromkeys(p.planner for p in run.phases if p.planner is not None):
        print("\n".join(planner.lines()), flush=True)
    print(f"run folder: {folder.path}", flush=True)
    if run.failure:
        print(f"loadgen: {run.failure}; the run stopped, the run folder keeps what finished", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_INTERRUPTED if status == "interrupted" else 0
