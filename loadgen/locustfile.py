"""Locust scenarios for LLM serving engines: an abstract streaming user, thin scenario users, one load shape for the web UI.

  locust -f loadgen/locustfile.py --engine vllm --scenario burst      (web UI: pick engine + scenario under Custom parameters)
  python -m loadgen webui                                            (the same, bound to 127.0.0.1:LOCUST_PORT)
  python -m loadgen burst --engine vllm=http://127.0.0.1:8009        (headless, writes results/<run-id>/)

Every measurement fires `environment.events.request`: the request itself (request_type "chat",
response_time = send -> end, response_length = output tokens, failures carry their reason) and TTFT
as its own event (request_type "TTFT") fired at the first non-empty content chunk. Locust rounds
these; the raw records in requests.jsonl are the source of every reported number.
"""

from locust import LoadTestShape, User, constant, events, task  # noqa: I001 - Locust first (gevent monkey-patching)
from locust.runners import MasterRunner, WorkerRunner

import json
import sys
import time

import gevent
import gevent.pool
from greenlet import GreenletExit

from loadgen import client as llm
from loadgen import prompts as prompt_sets
from loadgen.client_metrics import ClientMetrics
from loadgen.manifest import build as build_manifest
from loadgen.recorder import RECORD_MESSAGE, ForwardingRecorder, Recorder
from loadgen.scenarios import SCENARIOS, ClosedLoopPhase, LoadRun, RatePhase, Settings, _Span, build_phases
from loadgen.targets import parse_engine, probe
from servescope import engines, knobs
from servescope.runfolder import RequestRecord, RunFolder

PHASE_MESSAGE = "servescope_phase"  # master -> workers: index of the phase now current


@events.init_command_line_parser.add_listener
def _add_options(parser):
    """Engine and scenario knobs: the same names on the command line, in env vars and in the web UI's custom parameters."""
    # Straight on Locust's parser: only its add_argument knows include_in_web_ui (argument groups don't).
    group = parser
    group.add_argument(
        "--engine",
        choices=list(engines.ENGINES),
        default="vllm",
        env_var="LOADGEN_ENGINE",
        include_in_web_ui=True,
        help="engine kind to load",
    )
    group.add_argument(
        "--engine-url",
        default="",
        env_var="LOADGEN_ENGINE_URL",
        include_in_web_ui=True,
        help="engine base URL (empty: Host field, else the kind's URL knob / default port)",
    )
    group.add_argument(
        "--scenario",
        choices=list(SCENARIOS),
        default="burst",
        env_var="LOADGEN_SCENARIO",
        include_in_web_ui=True,
        help="sequential, burst, ramp, rate or sweep",
    )
    group.add_argument(
        "--prompts",
        default="seed3",
        env_var="LOADGEN_PROMPTS",
        include_in_web_ui=True,
        help="seed4, seed3, mixed, synthetic:TOKENS[xCOUNT] or a txt/JSONL file",
    )
    group.add_argument(
        "--max-tokens", type=int, default=knobs.get_int("MAX_TOKENS", 48), env_var="MAX_TOKENS", include_in_web_ui=True
    )
    group.add_argument(
        "--temperature",
        type=float,
        default=float(knobs.get("TEMPERATURE", "0")),
        env_var="TEMPERATURE",
        include_in_web_ui=True,
    )
    group.add_argument(
        "--burst-size",
        type=int,
        default=knobs.get_int("BURST_SIZE", 3),
        env_var="BURST_SIZE",
        include_in_web_ui=True,
        help="requests released at the same instant",
    )
    group.add_argument("--bursts", type=int, default=1, env_var="LOADGEN_BURSTS", include_in_web_ui=True)
    group.add_argument(
        "--burst-pause",
        type=float,
        default=1.0,
        env_var="LOADGEN_BURST_PAUSE",
        include_in_web_ui=True,
        help="seconds between bursts",
    )
    group.add_argument(
        "--steps", default="1,2,4", env_var="LOADGEN_STEPS", include_in_web_ui=True, help="ramp: users per step"
    )
    group.add_argument(
        "--concurrencies",
        default="1,2,4,8",
        env_var="LOADGEN_CONCURRENCIES",
        include_in_web_ui=True,
        help="sweep: one phase per concurrency",
    )
    group.add_argument(
        "--duration",
        type=float,
        default=30.0,
        env_var="LOADGEN_DURATION",
        include_in_web_ui=True,
        help="seconds per ramp step / sweep level / rate phase",
    )
    group.add_argument(
        "--rate",
        type=float,
        default=1.0,
        env_var="LOADGEN_RATE",
        include_in_web_ui=True,
        help="rate: arrivals per second",
    )
    group.add_argument(
        "--arrivals",
        choices=["constant", "poisson"],
        default="constant",
        env_var="LOADGEN_ARRIVALS",
        include_in_web_ui=True,
    )
    group.add_argument(
        "--model",
        default="",
        env_var="LOADGEN_MODEL",
        include_in_web_ui=True,
        help="model name (empty: what the engine lists)",
    )
    group.add_argument(
        "--no-ignore-eos",
        action="store_true",
        default=False,
        env_var="LOADGEN_NO_IGNORE_EOS",
        include_in_web_ui=True,
        help="don't send ignore_eos to engines that accept it",
    )
    group.add_argument(
        "--http-client",
        choices=list(llm.TRANSPORTS),
        default="geventhttpclient",
        env_var="LOADGEN_HTTP_CLIENT",
        include_in_web_ui=False,
    )
    group.add_argument(
        "--request-timeout",
        type=float,
        default=120.0,
        env_var="LOADGEN_REQUEST_TIMEOUT",
        include_in_web_ui=True,
        help="seconds without a byte before a request fails",
    )
    group.add_argument(
        "--results",
        default=str(knobs.REPO_ROOT / "results"),
        env_var="LOADGEN_RESULTS",
        include_in_web_ui=False,
        help="where run folders go",
    )
    group.add_argument(
        "--metrics-port",
        type=int,
        default=knobs.get_int("LOADGEN_METRICS_PORT", 9465),
        env_var="LOADGEN_METRICS_PORT",
        include_in_web_ui=False,
        help="client-side /metrics (0: off)",
    )


class LLMUser(User):
    """Owns the streaming HTTP client and turns each exchange into Locust events, a raw record and metrics."""

    abstract = True
    wait_time = constant(0)  # pacing belongs to the phase (barrier, schedule, back to back)

    def on_start(self) -> None:
        self._transports: dict[tuple[str, int], llm.Transport] = {}

    def on_stop(self) -> None:
        for transport in self._transports.values():
            transport.close()
        self._transports.clear()

    def transport(self, settings: Settings, concurrency: int = 1) -> llm.Transport:
        key = (settings.target.url, concurrency)
        if key not in self._transports:
            name = getattr(self.environment.parsed_options, "http_client", None) or "geventhttpclient"
            self._transports[key] = llm.make_transport(
                name, settings.target.url, timeout=settings.timeout_s, concurrency=concurrency
            )
        return self._transports[key]

    def send(self, phase, work, concurrency: int = 1) -> RequestRecord:
        settings: Settings = phase.settings
        target = settings.target
        name = f"{target.instance} {phase.scenario}"
        payload = llm.chat_payload(
            target.api,
            target.model,
            work.prompt.text,
            settings.max_tokens,
            settings.temperature,
            bool(target.ignore_eos),
        )
        fire = self.environment.events.request.fire

        def first_content(m: llm.Measurement) -> None:
            fire(
                request_type="TTFT",
                name=name,
                response_time=m.ttft_s * 1000,
                response_length=0,
                exception=None,
                context={"phase": work.phase_name},
                start_time=m.started_at,
                url=None,
                response=None,
            )

        holder: list[llm.Measurement] = []
        interrupted = None
        try:
            m = llm.stream_chat(
                self.transport(settings, concurrency),
                target.chat_path,
                target.api,
                payload,
                on_first_content=first_content,
                into=holder,
            )
        except GreenletExit as exc:  # the runner stopped us mid-stream (Ctrl-C, phase end): keep what we have
            interrupted = exc
            m = holder[0] if holder else llm.Measurement(started_at=time.time(), t_send=time.perf_counter())
            m.error = f"interrupted after {len(m.content_times)} content chunks (run stopped)"
            m.t_end = time.perf_counter()
            if m.usage_tokens is None and m.content_times:
                m.tokens_source = "chunks"
        record = RequestRecord(
            engine=target.kind,
            instance=target.instance,
            scenario=phase.scenario,
            phase=work.phase_name,
            api=target.api,
            model=target.model,
            prompt_set=settings.prompt_set.name,
            prompt_set_sha256=settings.prompt_set.sha256,
            prompt_id=work.prompt.id,
            max_tokens=settings.max_tokens,
            started_at=m.started_at,
            ok=m.ok,
            status=m.status,
            error=m.error,
            ttft_s=m.ttft_s,
            e2e_s=m.e2e_s,
            itl_s=m.itl_s,
            tpot_s=m.tpot_s,
            output_tokens=m.output_tokens,
            prompt_tokens=m.prompt_tokens,
            tokens_source=m.tokens_source,
            content_chunks=len(m.content_times),
            arrival_index=work.arrival_index,
            engine_stats=m.engine_stats,
        )
        elapsed = m.elapsed_s or 0.0
        fire(
            request_type="chat",
            name=name,
            response_time=elapsed * 1000,
            response_length=m.output_tokens or 0,
            exception=None if m.ok else llm.StreamError(m.error),
            context={"phase": work.phase_name},
            start_time=m.started_at,
            url=target.url + target.chat_path,
            response=None,
        )
        run: LoadRun = self.environment.servescope_run
        run.recorder.request(record)
        phase.finished(work, record, elapsed)
        if interrupted is not None:
            raise interrupted
        return record

    def next_from_phase(self) -> None:
        run: LoadRun | None = getattr(self.environment, "servescope_run", None)
        phase = run.phase if run is not None else None
        if phase is not None:
            # Before a burst's gate, not after it: 64 users connecting at the release would each stamp their send,
            # yield on connect() and send only once the others had run, a TCP handshake and the others' turns in TTFT.
            self.transport(phase.settings).connect()
        work = phase.next_work() if phase is not None else None
        if work is None:
            if run is None:
                gevent.sleep(0.2)
            else:
                run.wait_for_change()
            return
        self.send(phase, work)


class SequentialUser(LLMUser):
    """One user walking the prompt set back to back."""

    @task
    def next_prompt(self) -> None:
        self.next_from_phase()


class BurstUser(LLMUser):
    """One of BURST_SIZE users; the phase's barrier releases all of them at the same instant."""

    @task
    def burst(self) -> None:
        self.next_from_phase()


class ClosedLoopUser(LLMUser):
    """A user sending back to back for a ramp step or a sweep level."""

    @task
    def next_prompt(self) -> None:
        self.next_from_phase()


class RateUser(LLMUser):
    """Open loop: one user that schedules arrivals; each request runs in its own greenlet and nobody waits."""

    @task
    def arrivals(self) -> None:
        run: LoadRun | None = getattr(self.environment, "servescope_run", None)
        phase = run.phase if run is not None else None
        if not isinstance(phase, RatePhase):
            if run is None:
                gevent.sleep(0.2)
            else:
                run.wait_for_change()
            return
        group = gevent.pool.Group()
        try:
            for work in phase.arrivals():
                group.spawn(self.send, phase, work, phase.max_in_flight)
            group.join()
        finally:
            group.kill()


USER_CLASSES = {cls.__name__: cls for cls in (SequentialUser, BurstUser, ClosedLoopUser, RateUser)}


# --- the web UI / `locust -f` path: one load shape steps through the chosen scenario's phases ---


def _target_from_options(options, host: str | None):
    url = options.engine_url or host or ""
    target = parse_engine(f"{options.engine}={url}" if url else options.engine, ignore_eos=not options.no_ignore_eos)
    return probe(target, options.model or None)


def _new_run(environment, recorder) -> LoadRun:
    options = environment.parsed_options
    target = _target_from_options(options, environment.host)
    prompt_set = prompt_sets.load(options.prompts)
    settings = Settings(
        target=target,
        prompt_set=prompt_set,
        max_tokens=options.max_tokens,
        temperature=options.temperature,
        timeout_s=options.request_timeout,
    )
    return LoadRun(build_phases(options.scenario, settings, options), recorder)


def _start_run(environment) -> LoadRun:
    """On the master (or a single process): a run folder, its manifest, and the phases."""
    options = environment.parsed_options
    folder = RunFolder.create(options.results)
    recorder = Recorder(folder=folder, metrics=getattr(environment, "servescope_metrics", None))
    run = _new_run(environment, recorder)
    run.folder = folder
    run.started_at = time.time()
    run.emit_on_advance = not isinstance(environment.runner, MasterRunner)
    _write_manifest(environment, run, "running")
    recorder.line(f"run folder: {folder.path}")
    environment.servescope_run = run
    return run


def _write_manifest(environment, run: LoadRun, status: str) -> None:
    options = environment.parsed_options
    settings = run.phases[0].settings if run.phases else None
    flags = {
        k: v
        for k, v in vars(options).items()
        if k
        in (
            "engine",
            "engine_url",
            "scenario",
            "prompts",
            "max_tokens",
            "temperature",
            "burst_size",
            "bursts",
            "burst_pause",
            "steps",
            "concurrencies",
            "duration",
            "rate",
            "arrivals",
            "model",
            "no_ignore_eos",
            "http_client",
            "request_timeout",
        )
    }
    flags["driver"] = "locust-web-ui" if not options.headless else "locust-headless"
    run.folder.write_manifest(
        build_manifest(
            command="locust -f loadgen/locustfile.py",
            scenario=options.scenario,
            targets=[settings.target] if settings else [],
            prompt_sets=[settings.prompt_set] if settings else [],
            flags=flags,
            started_at=run.started_at,
            status=status,
            ended_at=None if status == "running" else time.time(),
            phases=[p.name for p in run.phases],
        )
    )


class ScenarioShape(LoadTestShape):
    """Users per phase of the chosen scenario: burst = BURST_SIZE users per round, ramp steps, sweep levels, one rate user."""

    def tick(self):
        environment = self.runner.environment
        run: LoadRun | None = getattr(environment, "servescope_run", None)
        if run is None or getattr(run, "closed", False):
            try:
                run = _start_run(environment)
            except (ValueError, OSError) as exc:
                print(f"loadgen: {exc}", file=sys.stderr, flush=True)
                return None
        phase = run.phase
        master = isinstance(self.runner, MasterRunner)
        if phase is not None and master and isinstance(phase, ClosedLoopPhase | RatePhase):
            left = phase.time_left() if isinstance(phase, ClosedLoopPhase) else None
            if left is not None and left <= 0:
                phase.finish_now()
        if phase is None or phase.done.is_set():
            phase = run.advance()
            if master:
                self.runner.send_message(PHASE_MESSAGE, run.index)
            if isinstance(phase, ClosedLoopPhase) and master:
                phase.start_clock()
        if phase is None:
            return None
        return phase.users, float(phase.users), [USER_CLASSES[phase.user_class]]


@events.init.add_listener
def _on_init(environment, runner=None, **_kwargs) -> None:
    options = environment.parsed_options
    if options is None or not hasattr(options, "scenario"):
        return  # driven by loadgen.cli, which wires its own run
    if isinstance(runner, WorkerRunner):

        def follow_phase(msg, **_kw):
            run = getattr(environment, "servescope_run", None)
            if run is not None:
                while run.index < int(msg.data) and not run.finished:
                    run.advance()

        runner.register_message(PHASE_MESSAGE, follow_phase)
        return
    if options.metrics_port:
        metrics = ClientMetrics()
        try:
            metrics.serve(options.metrics_port, addr=knobs.get("SERVESCOPE_BIND", "127.0.0.1"))
            environment.servescope_metrics = metrics
        except OSError as exc:
            print(
                f"loadgen: client metrics not exposed: port {options.metrics_port}: {exc.strerror or exc}",
                file=sys.stderr,
            )
    if isinstance(runner, MasterRunner):

        def store_record(msg, **_kw):
            run = getattr(environment, "servescope_run", None)
            if run is None:
                return
            record = RequestRecord.from_dict(json.loads(msg.data))
            run.recorder.request(record)
            phase = run.phase_named(record.phase)
            if phase is not None:
                phase.spans.setdefault(record.phase, _Span()).add(record, record.e2e_s or 0.0)

        runner.register_message(RECORD_MESSAGE, store_record)


@events.test_start.add_listener
def _on_test_start(environment, **_kwargs) -> None:
    if isinstance(environment.runner, WorkerRunner):
        options = environment.parsed_options
        if options is not None and hasattr(options, "scenario"):
            run = _new_run(environment, ForwardingRecorder(environment.runner))
            run.follow_master()
            # The master's "phase 0" message came before this run existed: start on the first phase.
            run.advance()
            environment.servescope_run = run


@events.test_stop.add_listener
def _on_test_stop(environment, **_kwargs) -> None:
    run: LoadRun | None = getattr(environment, "servescope_run", None)
    if run is None or getattr(run, "folder", None) is None or getattr(run, "closed", False):
        return
    for phase in run.phases:  # each span once: a no-op for what was written as it finished
        phase.emit()
    _write_locust_outputs(environment, run.folder.path)
    _write_manifest(environment, run, "complete" if run.finished else "stopped")
    run.recorder.line(f"run folder: {run.folder.path}")
    run.closed = True


def _write_locust_outputs(environment, folder) -> None:
    from loadgen.locust_outputs import write_locust_outputs

    write_locust_outputs(environment, folder)
