"""`python -m loadgen`: the seed's comparison (`compare`), one command per scenario, and Locust's web UI; each writes a run folder."""

from __future__ import annotations  # noqa: I001 - Locust first (gevent monkey-patching)

# Locust (and so gevent's monkey-patching) first: every socket below must be cooperative.
from locust.env import Environment
from locust.event import Events

import argparse
import dataclasses
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import gevent
from gevent.event import Event

from loadgen import client as llm
from loadgen import options
from loadgen import prompts as prompt_sets
from loadgen.annotations import PhaseAnnotator
from loadgen.client_metrics import ClientMetrics
from loadgen.locust_outputs import write_locust_outputs
from loadgen.locustfile import USER_CLASSES
from loadgen.manifest import build as build_manifest
from loadgen.prompts import PromptSet
from loadgen.recorder import Recorder
from loadgen.scenarios import BurstPhase, LoadRun, Phase, SequentialPhase, Settings, build_phases, spawn_rate_for
from loadgen.targets import Target, TargetError, default_url, parse_engine, probe
from servescope import knobs, slo
from servescope.runfolder import RunFolder
from servescope.sampler import Sampler
from servescope.scaling import BURST, SEQUENTIAL, scaling_factor

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad input from the user: one line on stderr, no traceback."""


COMMANDS = {
    "compare": "the seed's experiment: per engine warm-up, matched-set sequential, burst",
    "sequential": "one user, the prompt set back to back",
    "burst": "N requests released at the same instant, awaited, K times",
    "ramp": "steps of closed-loop users, each held",
    "rate": "open-loop arrivals (constant or Poisson); requests don't wait for each other",
    "sweep": "one closed-loop phase per concurrency level",
    "knee": "the highest concurrency (or rate) that meets the SLOs, and the server resource that ran out above it",
}


def build_parser() -> argparse.ArgumentParser:
    parser = options.ArgumentParser(prog="python -m loadgen", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command, text in COMMANDS.items():
        options.add_command_options(sub.add_parser(command, help=text), command)
    webui = sub.add_parser(
        "webui",
        help="Locust's web UI on LOCUST_PORT (127.0.0.1), opened pre-filled: Host = the engine URL, "
        "Number of users = the burst size, scenario and engine under Custom parameters",
    )
    webui.add_argument("--port", type=int, default=knobs.get_int("LOCUST_PORT"))
    webui.add_argument("--bind", default=knobs.get("SERVESCOPE_BIND"))
    webui.add_argument(
        "--users",
        type=int,
        default=knobs.get_int("BURST_SIZE"),
        help="the form's Number of users: the burst size of the burst scenario (default BURST_SIZE: %(default)s)",
    )
    options.add_command_options(webui, "webui")
    return parser


def _models(specs: list[str]) -> dict[str, str]:
    """`--model NAME` for every engine, `--model vllm=NAME` for one instance."""
    models: dict[str, str] = {}
    for spec in specs:
        name, sep, model = spec.partition("=")
        models[name if sep else "*"] = model if sep else name
    return models


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["webui"]:
        known, extra = build_parser().parse_known_args(argv)
        return webui(known, extra)
    args = build_parser().parse_args(argv)
    try:
        llm.check_geventhttpclient()
        return run_headless(args)
    except (UsageError, TargetError, prompt_sets.PromptSetError, ValueError, llm.HttpClientError) as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return EXIT_USAGE


def webui(args: argparse.Namespace, extra: list[str]) -> int:
    """Locust itself on the project's locustfile, its form filled in so START runs the chosen scenario untouched.

    Host is the engine's URL, Number of users the burst size (and the ramp-up the same: a phase starts its users
    at once); the table's options go through as they were resolved here; other arguments pass to Locust as given.
    """
    url = args.engine_url or default_url(args.engine)
    if not args.engine_url:
        print(f"loadgen: {args.engine}: no --engine-url, using {url}", flush=True)
    locustfile = Path(__file__).resolve().parent / "locustfile.py"
    cmd = [sys.executable, "-m", "locust", "-f", str(locustfile), "--web-host", args.bind, "--web-port", str(args.port)]
    cmd += ["--host", url, "--users", str(args.users), "--spawn-rate", str(args.users)]
    for option in options.for_locust():
        value = getattr(args, option.dest)
        if option.dest == "engine_url" or value in (None, "", False):
            continue
        cmd += [option.flag] if option.switch else [option.flag, str(value)]
    print(
        f"Locust web UI on http://{args.bind}:{args.port}  ({args.engine} at {url}, "
        f"{args.scenario}, {args.users} users; more under Custom parameters)",
        flush=True,
    )
    os.execv(sys.executable, [*cmd, *extra])
    return 0  # not reached


def _plan(args: argparse.Namespace, targets: list[Target], prompt_set: PromptSet) -> list[Phase]:
    """The phases of the whole run, engine after engine, in the order they will run."""
    phases: list[Phase] = []
    for target in targets:
        settings = Settings(
            target=target,
            prompt_set=prompt_set,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            timeout_s=args.request_timeout,
        )
        if args.command == "compare":
            # The matched set: the same prompts (as many as the burst sends) and max_tokens sequentially and as a
            # burst, so the scaling factor (sequential wall / burst wall) compares the same work.
            phases.append(SequentialPhase(settings, name="sequential", count=args.burst_size))
            phases.append(BurstPhase(settings, size=args.burst_size, rounds=args.bursts, pause_s=args.burst_pause))
            if not args.no_seed4 and prompt_set.name != "seed4":
                seed4 = dataclasses.replace(settings, prompt_set=prompt_sets.load("seed4"))
                phases.append(SequentialPhase(seed4, name="sequential-seed4"))
        else:
            phases.extend(build_phases(args.command, settings, args))
    return phases


def run_headless(args: argparse.Namespace) -> int:
    if not args.engine:
        raise UsageError("give at least one --engine NAME=URL (e.g. --engine vllm=http://127.0.0.1:8009)")
    if args.http_client not in llm.TRANSPORTS:
        raise UsageError(f"--http-client {args.http_client!r}: expected one of {', '.join(llm.TRANSPORTS)}")
    targets = [parse_engine(spec, ignore_eos=not args.no_ignore_eos) for spec in args.engine]
    instances = [t.instance for t in targets]
    if len(set(instances)) != len(instances):
        raise UsageError("two --engine values with the same name: use kind:instance to tell them apart")
    if args.command == "knee" and len(targets) != 1:
        raise UsageError("knee searches one engine at a time: give one --engine")
    spec = slo.resolve(args.slo, args.slo_attainment)  # a bad SLO is one line before anything starts
    prompt_set = prompt_sets.load(args.prompts)
    try:
        folder = RunFolder.create(Path(args.results), args.run_id)
    except FileExistsError:
        raise UsageError(
            f"run folder {Path(args.results) / args.run_id} already exists: pick another --run-id"
        ) from None
    except OSError as exc:
        raise UsageError(f"cannot create a run folder under {args.results}: {exc.strerror or exc}") from None

    # From here on Ctrl-C / SIGTERM end the run cleanly: the folder is finished, not abandoned.
    interrupted = Event()

    def on_signal(signum: int) -> None:
        if not interrupted.is_set():
            print(
                f"\nloadgen: {signal.Signals(signum).name}: stopping, keeping every finished request",
                file=sys.stderr,
                flush=True,
            )
        interrupted.set()

    handlers = [gevent.signal_handler(sig, on_signal, sig) for sig in (signal.SIGINT, signal.SIGTERM)]

    out = None if args.quiet else sys.stdout
    bind = knobs.get("SERVESCOPE_BIND")
    metrics = ClientMetrics(spec=spec) if args.metrics_port else None
    if metrics is not None:
        try:
            metrics.serve(args.metrics_port, addr=bind)
        except OSError as exc:
            print(
                f"loadgen: client metrics not exposed (port {args.metrics_port}: {exc.strerror or exc}); the run goes on",
                file=sys.stderr,
                flush=True,
            )
            metrics = None
    recorder = Recorder(folder=folder, metrics=metrics, out=out)
    started_at = time.time()
    recorder.line(f"run folder: {folder.path}")
    if metrics is not None:
        recorder.line(f"client metrics on http://{bind}:{args.metrics_port}/metrics")

    models = _models(args.model)
    for target in targets:
        probe(target, models.get(target.instance) or models.get(target.kind) or models.get("*"))
        version = target.info.get("version") or "unknown"
        problems = (
            f" (engine not answering: {target.info['probe_errors'][0]})" if target.info.get("probe_errors") else ""
        )
        recorder.line(
            f"engine {target.instance} at {target.url}: version {version}, model {target.model or '?'}{problems}"
        )

    sampler = Sampler.for_run(folder, [(t.kind, t.instance) for t in targets])  # engine gauges into samples.jsonl
    recorder.line(sampler.describe())
    phases = _plan(args, targets, prompt_set)
    used_sets = {prompt_set.name: prompt_set}
    for phase in phases:
        used_sets.setdefault(phase.settings.prompt_set.name, phase.settings.prompt_set)
    flags = {k: v for k, v in vars(args).items() if k not in ("engine", "model", "quiet")}
    flags["ignore_eos"] = not args.no_ignore_eos

    def manifest(status: str, ended_at: float | None = None) -> None:
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
                phases=[p.name for p in phases],
            )
        )

    manifest("running")

    environment = Environment(
        user_classes=list(USER_CLASSES.values()),
        events=Events(),
        parsed_options=argparse.Namespace(http_client=args.http_client, headless=True),
    )
    runner = environment.create_local_runner()
    run = LoadRun(phases, recorder, folder=folder, started_at=started_at)
    environment.servescope_run = run
    annotator = PhaseAnnotator(args.grafana_url)
    status = "complete"
    try:
        warmed: set[str] = set()
        for phase in phases:
            if interrupted.is_set():
                break
            target = phase.settings.target
            if target.instance not in warmed:
                warmed.add(target.instance)
                if not _warmup(target, phase.settings, args, recorder, interrupted):
                    break
            run.advance()
            sampler.start(phase.name)
            runner.start(phase.users, spawn_rate=spawn_rate_for(phase), user_classes=[USER_CLASSES[phase.user_class]])
            gevent.wait([phase.done, interrupted, run.aborted], count=1)
            sampler.stop()
            if interrupted.is_set() or run.aborted.is_set():
                break
            phase.emit()
            runner.start(0, spawn_rate=spawn_rate_for(phase))
            if runner.spawning_greenlet is not None:
                runner.spawning_greenlet.join(timeout=10)
            annotator.phase_done(phase)
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
        # Close the last phase (its PhaseRecords; an interrupted one keeps what finished); skip what never started.
        run.finish()
    finally:
        sampler.close()
        runner.stop()
        runner.quit()
        try:
            write_locust_outputs(environment, folder.path)
        except Exception as exc:  # noqa: BLE001 - Locust's own report must never cost us the run folder
            print(f"loadgen: Locust CSV/HTML not written: {exc}", file=sys.stderr)
        manifest(status, time.time())
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
    _print_summary(folder, out or sys.stdout)
    for planner in dict.fromkeys(p.planner for p in phases if p.planner is not None):
        print("\n".join(planner.lines()), flush=True)
    print(f"run folder: {folder.path}", flush=True)
    if run.failure:
        print(f"loadgen: {run.failure}; the run stopped, the run folder keeps what finished", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_INTERRUPTED if status == "interrupted" else 0


def _warmup(
    target: Target, settings: Settings, args: argparse.Namespace, recorder: Recorder, interrupted: Event
) -> bool:
    """Warm-up requests (cold caches, first-request compile) that never reach the results."""
    if args.warmup <= 0:
        return True
    transport = llm.make_transport(args.http_client, target.url, timeout=args.request_timeout)
    try:
        for i in range(args.warmup):
            payload = llm.chat_payload(
                target.api,
                target.model,
                settings.prompt_set[i].text,
                settings.max_tokens,
                settings.temperature,
                bool(target.ignore_eos),
            )
            job = gevent.spawn(llm.stream_chat, transport, target.chat_path, target.api, payload)
            gevent.wait([job, interrupted], count=1)
            if interrupted.is_set():
                job.kill()
                return False
            m = job.value
            outcome = "ok" if m.ok else f"FAILED ({m.error})"
            recorder.line(
                f"warm-up {target.instance} {i + 1}/{args.warmup}: {outcome} {m.elapsed_s or 0:.3f}s (not recorded)"
            )
    finally:
        transport.close()
    return True


def _print_summary(folder: RunFolder, out) -> None:
    """The seed's table shape from the raw records: per engine and phase, wall, tokens/s, TTFT; scaling factor."""
    requests = list(folder.requests())
    phases = list(folder.phases())
    if not phases:
        return
    print(
        f"\n{'engine':<16} {'phase':<18} {'reqs':>4} {'ok':>3} {'wall s':>8} {'tokens':>6} {'tok/s':>7} {'TTFT p50 s':>10}",
        file=out,
    )
    for p in phases:
        rs = [r for r in requests if r.instance == p.instance and r.phase == p.phase]
        ok = [r for r in rs if r.ok]
        tokens = sum(r.output_tokens or 0 for r in ok)
        ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
        ttft = f"{statistics.median(ttfts):.3f}" if ttfts else "-"
        print(
            f"{p.instance:<16} {p.phase:<18} {len(rs):>4} {len(ok):>3} {p.wall_s:>8.3f} {tokens:>6} "
            f"{tokens / p.wall_s if p.wall_s > 0 else 0:>7.1f} {ttft:>10}",
            file=out,
        )
    for burst in (p for p in phases if p.scenario == BURST):
        mine = [p for p in phases if p.instance == burst.instance]
        if not any(p.scenario == SEQUENTIAL for p in mine):
            continue  # a burst on its own: nothing to compare it with
        factor, partner, why = scaling_factor(burst, mine)
        if factor is None:
            print(f"scaling factor {burst.instance} {burst.phase}: {why}", file=out)
        else:
            print(
                f"scaling factor {burst.instance} {burst.phase}: matched-set {partner.phase} {partner.wall_s:.3f}s / "
                f"burst {burst.wall_s:.3f}s = {factor:.2f}x",
                file=out,
            )
    print("", file=out, flush=True)
