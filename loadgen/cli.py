"""`python -m loadgen`: the seed's comparison (`compare`), one command per scenario, and Locust's web UI; each writes a run folder."""

from __future__ import annotations  # noqa: I001 - Locust first (gevent monkey-patching)

# Locust (and so gevent's monkey-patching) first: every socket below must be cooperative.
from locust.env import Environment
from locust.event import Events

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import gevent
from gevent.event import Event

from loadgen import client as llm
from loadgen import distributed, options, trials
from loadgen.annotations import PhaseAnnotator
from loadgen.commands import USAGE_ERRORS, Plan, UsageError, build_parser, prepare
from loadgen.client_metrics import ClientMetrics
from loadgen.isolate import Isolation
from loadgen.locust_outputs import write_locust_outputs
from loadgen.locustfile import USER_CLASSES
from loadgen.manifest import build as build_manifest
from loadgen.recorder import Recorder
from loadgen.scenarios import LoadRun, spawn_rate_for
from loadgen.summary import print_summary
from loadgen.targets import chosen_url_line, default_url, probe, route_line
from servescope import knobs, slo
from servescope.runfolder import RunFolder
from servescope.sampler import Sampler
from servescope.urls import redact

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["quick"]:
        from loadgen.quick import main as quick

        return quick(argv[1:])
    if argv[:1] == ["webui"]:
        known, extra = build_parser().parse_known_args(argv)
        return webui(known, extra)
    args = build_parser().parse_args(argv)
    try:
        llm.check_geventhttpclient()
        return run_headless(args)
    except (*USAGE_ERRORS, llm.HttpClientError) as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return EXIT_USAGE


def webui(args: argparse.Namespace, extra: list[str]) -> int:
    """Locust itself on the project's locustfile, its form filled in so START runs the chosen scenario untouched.

    Host is the engine's URL, Number of users the burst size (and the ramp-up the same: a phase starts its users
    at once); the table's options go through as they were resolved here; other arguments pass to Locust as given.
    """
    url = args.engine_url or default_url(args.engine)
    if not args.engine_url:
        print(f"loadgen: {chosen_url_line(args.engine, url)}", flush=True)
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


def run_headless(args: argparse.Namespace) -> int:
    plan = prepare(args)
    targets, prompt_set, phases = plan.targets, plan.prompt_set, plan.phases
    spec = slo.resolve(args.slo, args.slo_attainment)  # a bad SLO is one line before anything starts
    for target in targets:
        if target.url_from:
            print(f"loadgen: {chosen_url_line(target.kind, target.url)}", flush=True)
    folder = _create_folder(Path(args.results), args.run_id)
    # From here on Ctrl-C / SIGTERM end the run cleanly: the folder is finished, not abandoned.
    interrupted, handlers = _stop_on_signals()
    out = None if args.quiet else sys.stdout
    bind = knobs.get("SERVESCOPE_BIND")
    metrics = _serve_client_metrics(spec, args.metrics_port, bind)
    # A folder that stops taking writes ends the run (the run exists before the first record is written).
    recorder = Recorder(folder=folder, metrics=metrics, out=out, on_failure=lambda reason: run.abort(reason))
    started_at = time.time()
    recorder.line(f"run folder: {folder.path}")
    if metrics is not None:
        recorder.line(f"client metrics on http://{bind}:{args.metrics_port}/metrics")

    _probe_engines(plan, recorder, http_client=args.http_client, timeout_s=args.request_timeout)

    sampler = Sampler.for_run(folder, [(t.kind, t.instance) for t in targets])  # engine gauges into samples.jsonl
    recorder.line(sampler.describe())
    used_sets = {prompt_set.name: prompt_set}
    for phase in phases:
        used_sets.setdefault(phase.settings.prompt_set.name, phase.settings.prompt_set)
    fleet: distributed.Fleet | None = None  # --workers N: the worker processes and their coordinator
    flags = {k: v for k, v in vars(args).items() if k not in ("engine", "model", "quiet")}
    flags["ignore_eos"] = not args.no_ignore_eos
    retries = getattr(args, "noise_retries", 0)
    isolation = Isolation(getattr(args, "isolate", "off"), recorder.line)
    keeper = trials.NoiseKeeper(targets)
    recorder.annotate = keeper.annotate  # every phase record carries the host's noise while it ran
    trial_notes: dict = {"repetitions": getattr(args, "repetitions", 1), "isolate": isolation.mode, "warmup": {}}
    trial_notes["settle_max_s"] = getattr(args, "settle_max_s", 0)

    def manifest(status: str, ended_at: float | None = None) -> str | None:
        """Write manifest.json; why not, in one line, when the folder refuses it."""
        try:
            write_manifest(status, ended_at)
        except OSError as exc:
            return f"run folder {folder.path}: cannot write manifest.json ({exc.strerror or exc})"
        return None

    def write_manifest(status: str, ended_at: float | None) -> None:
        folder.write_manifest(
            build_manifest(
                command=" ".join(["python -m loadgen", *sys.argv[1:]])
                if sys.argv[1:]
                else f"python -m loadgen {args.command}",
                scenario=args.command,
                targets=targets,
                prompt_sets=list(used_sets.values()),
                flags=flags,
                started_at=started_at,
                status=status,
                ended_at=ended_at,
                phases=[p.title for p in phases],
                trials=trial_notes,
                workers=fleet.coordinator.describe() if fleet is not None else None,
                distributed=fleet.coordinator.summary() if fleet is not None else None,
            )
        )

    problem = manifest("running")
    if problem:
        raise UsageError(problem)

    environment = Environment(
        user_classes=list(USER_CLASSES.values()),
        events=Events(),
        # With workers, Locust's master also reads enable_rebalancing (off: loadgen/distributed.py decides).
        parsed_options=argparse.Namespace(http_client=args.http_client, headless=True, enable_rebalancing=False),
    )
    run = LoadRun(phases, recorder, folder=folder, started_at=started_at)
    environment.servescope_run = run
    if args.workers:
        try:
            fleet = distributed.Fleet(
                environment,
                args.workers,
                folder.path / distributed.WORKERS_LOG,
                say=recorder.line,
                warn=lambda text: print(f"loadgen: {text}", file=sys.stderr, flush=True),
                engines=args.engine,
            )
            fleet.send_plan(args, targets)
            fleet.coordinator.attach(run)
        except distributed.FleetError as exc:
            run.abort(str(exc))
    runner = fleet.runner if fleet is not None else environment.create_local_runner()
    annotator = PhaseAnnotator(args.grafana_url)
    status = "complete"
    previous: str | None = None  # the engine of the last phase: a switch waits for it to go quiet
    try:
        for phase in phases:  # a retry is inserted right after the phase it repeats
            if interrupted.is_set() or run.aborted.is_set():
                break
            target = phase.settings.target
            isolation.focus(target)
            if target.instance not in trial_notes["warmup"]:
                warm = trials.warm_up(
                    target,
                    phase.settings,
                    args.warmup,
                    http_client=args.http_client,
                    timeout_s=args.request_timeout,
                    say=recorder.line,
                    interrupted=interrupted,
                )
                if warm is None:
                    break
                trial_notes["warmup"][target.instance] = warm
                recorder.line(keeper.locate(target))
            keeper.settle(
                target,
                getattr(args, "settle_max_s", 0),
                switched=previous not in (None, target.instance),
                say=recorder.line,
                interrupted=interrupted,
            )
            if interrupted.is_set():
                break
            previous = target.instance
            keeper.begin(target)
            run.advance()
            sampler.start(phase.title)
            if fleet is not None:
                fleet.coordinator.prepare(phase)
            runner.start(phase.users, spawn_rate=spawn_rate_for(phase), user_classes=[USER_CLASSES[phase.user_class]])
            if fleet is not None:
                fleet.coordinator.start(phase)  # each worker's part of it, once every worker's users are in
            gevent.wait([phase.done, interrupted, run.aborted], count=1)
            if interrupted.is_set() or run.aborted.is_set():
                # Users stop first, mid-stream (each writes its partial record): the sampler's last read can take
                # its time without another request starting meanwhile.
                runner.stop()
                sampler.stop()
                break
            sampler.stop()
            phase.emit()
            runner.start(0, spawn_rate=spawn_rate_for(phase))
            if runner.spawning_greenlet is not None:
                runner.spawning_greenlet.join(timeout=10)
            annotator.phase_done(phase)
            if phase.backoff_count:
                recorder.line(
                    f"{target.instance} {phase.title}: the engine refused connections: users waited "
                    f"{phase.backoff_count} times, {phase.backoff_s:.1f} s in all, before sending again"
                )
            noisy = keeper.flags()
            retry = phase.again() if noisy and phase.attempt <= retries else None
            if retry is not None:
                phases.insert(phases.index(phase) + 1, retry)
                recorder.line(
                    f"{target.instance} {phase.title}: {noisy[0]}: running it again as {retry.title} "
                    f"(LOADGEN_NOISE_RETRIES={retries})"
                )
            if phase.planner is not None:  # the knee: the next load depends on this one's results
                follow_up = phase.planner.after(phase, folder)
                if follow_up is not None:
                    phases.append(follow_up)  # the run's own list: this loop and LoadRun see it
        if run.aborted.is_set():
            status = "failed"
            runner.stop()
        elif interrupted.is_set():
            status = "interrupted"
            runner.stop()  # kills users mid-stream: each writes its partial record as "interrupted"
        if fleet is not None and status != "complete":
            fleet.coordinator.drain()  # the workers' interrupted records
        # Close the last phase (its PhaseRecords; an interrupted one keeps what finished); skip what never started.
        run.finish()
    finally:
        isolation.release()
        sampler.close()
        keeper.close()  # after run.finish(): the last phase's records took their energy
        runner.stop()
        if fleet is not None:
            fleet.close()  # after its last records, before the folder is finished
            dropped = fleet.coordinator.dropped_line()
            if dropped:
                print(f"loadgen: {dropped}", file=sys.stderr, flush=True)
        else:
            runner.quit()
        if recorder.failure is None:  # a folder that refused a record would refuse these too
            try:
                write_locust_outputs(environment, folder.path)
            except Exception as exc:  # noqa: BLE001 - Locust's own report must never cost us the run folder
                print(f"loadgen: Locust CSV/HTML not written: {exc}", file=sys.stderr)
            problem = manifest(status, time.time())
            if problem:
                run.abort(problem)
        if metrics is not None and args.metrics_linger > 0 and status == "complete":
            # Prometheus scrapes every few seconds: without this the last requests' samples are never scraped.
            print(
                f"loadgen: client metrics stay up {args.metrics_linger:g} s more so Prometheus scrapes the final "
                f"samples (--metrics-linger 0 to skip; Ctrl-C ends it)",
                flush=True,
            )
            interrupted.wait(timeout=args.metrics_linger)
        for handler in handlers:
            handler.cancel()
        if metrics is not None:
            metrics.close()
    return _say_outcome(run, folder, out or sys.stdout, status)


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
    metrics = ClientMetrics(spec=spec)
    try:
        metrics.serve(port, addr=bind)
    except OSError as exc:
        print(
            f"loadgen: client metrics not exposed (port {port}: {exc.strerror or exc}); the run goes on",
            file=sys.stderr,
            flush=True,
        )
        return None
    return metrics


def _probe_engines(plan: Plan, recorder: Recorder, *, http_client: str, timeout_s: float) -> None:
    """Each engine's version and model (and, for prompts sized by the engine, its chat template), said in a line."""
    targets, prompt_set, phases = plan.targets, plan.prompt_set, plan.phases
    for target in targets:
        probe(target, plan.model_for(target))
        version = target.info.get("version") or "unknown"
        problems = (
            f" (engine not answering: {target.info['probe_errors'][0]})" if target.info.get("probe_errors") else ""
        )
        recorder.line(
            f"engine {target.instance} at {redact(target.url)}: version {version}, "
            f"model {target.model or '?'}{redact(problems)}"
        )
        if not target.url_from and route_line(target):
            # A URL given: say whether it is the stack's proxy (a chosen one's line said so already), --quiet or not.
            print(f"loadgen: {route_line(target)}", flush=True)
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
