"""Locust scenarios for LLM serving engines: an abstract streaming user, thin scenario users, one load shape for the web UI.

  python -m loadgen webui --engine-url http://127.0.0.1:8009 --users 3    (web UI, its form filled in: START runs it)
  locust -f loadgen/locustfile.py --host URL --engine vllm --scenario burst  (Locust itself; options: loadgen/options.py)
  python -m loadgen burst --engine vllm=http://127.0.0.1:8009               (headless, writes results/<run-id>/)

Every measurement fires `environment.events.request`: the request itself (request_type "chat",
response_time = send -> end, response_length = output tokens, failures carry their reason) and TTFT
as its own event (request_type "TTFT") fired at the first non-empty content chunk. Locust rounds
these; the raw records in requests.jsonl are the source of every reported number.

The run's life follows Locust's events: `test_start` opens the run folder and starts a conductor that
steps through the phases, `test_stop` finishes the folder; the load shape only reads the current
phase's users.
"""

from locust import LoadTestShape, User, constant, events, task  # noqa: I001 - Locust first (gevent monkey-patching)
from locust.exception import InterruptTaskSet, RescheduleTask, RescheduleTaskImmediately, StopUser
from locust.runners import MasterRunner, WorkerRunner

import functools
import sys
import time
from typing import TYPE_CHECKING

import gevent
import gevent.pool
from greenlet import GreenletExit

from loadgen import client as llm
from loadgen import options as option_table
from servescope.workloads import prompts as prompt_sets
from loadgen import webui_guard
from servescope import workloads
from loadgen.locust_outputs import write_locust_outputs
from loadgen.manifest import build as build_manifest
from loadgen.phase_driver import PhaseDriver, Users
from loadgen.recorder import Recorder
from loadgen.runplan import RunPlan, build_phases, spec_of
from loadgen.scenarios import LoadRun, Settings
from loadgen.targets import chosen_url_line, default_url, parse_engine, probe
from servescope.workloads.conversation import ConversationSet
from servescope.contracts.settings import KnobTable, LoadSettings
from servescope.judgements import slo
from servescope.contracts.runfolder import RequestRecord, RunFolder
from servescope.prometheus.sampler import Sampler
from servescope.contracts.urls import redact

if TYPE_CHECKING:  # a run with workers loads it (the coordinator, a worker's agent); one in this process never does
    from loadgen import distributed

DISPATCH_CHECK_S = 0.05  # how often the master looks whether the load shape has sent a phase's users
# A closed-loop user's wait after a refused request, doubling up to the most: an absent engine costs a user at most
# one request every BACKOFF_MAX_S, where resending at once cost thousands a second.
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.05, 2.0


@events.init_command_line_parser.add_listener
def _add_options(parser):
    """The option table's Locust side: flags, environment variables, custom parameters in the web UI.

    Locust binds its web UI and a master's port for workers on every interface unless told; here they bind to
    SERVESCOPE_BIND (127.0.0.1) like every other service (--web-host / --master-bind-host still move them)."""
    table = KnobTable.from_env()  # Locust's command line enters here: its defaults are the knobs
    option_table.add_locust_options(parser, table)
    bind = table["SERVESCOPE_BIND"]
    parser.set_defaults(web_host=bind, master_bind_host=bind)


# Locust's own control flow passes through a task: never taken for a failure.
_LOCUST_FLOW = (StopUser, InterruptTaskSet, RescheduleTask, RescheduleTaskImmediately)


def _abort_run(user: User, exc: Exception) -> bool:
    """A bug or an unforeseen input must not become a traceback per request: the run stops, saying why once."""
    run: LoadRun | None = getattr(user.environment, "servescope_run", None)
    if run is None:
        return False
    text = " ".join(str(exc).split())[:200]
    run.abort(f"a load generator user failed: {type(exc).__name__}{': ' + text if text else ''}")
    return True


def guarded(task_method):
    """A task that ends its user and the run on an unexpected exception instead of looping on it."""

    @functools.wraps(task_method)
    def run_task(user, *args):
        try:
            return task_method(user, *args)
        except _LOCUST_FLOW:
            raise
        except Exception as exc:
            if not _abort_run(user, exc):
                raise
            raise StopUser() from None

    return run_task


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
            name = self.environment.parsed_options.http_client
            self._transports[key] = llm.make_transport(
                name, settings.target.url, timeout=settings.timeout_s, concurrency=concurrency
            )
        return self._transports[key]

    def send(self, phase, work, concurrency: int = 1) -> RequestRecord:
        settings: Settings = phase.settings
        target = settings.target
        name = f"{target.instance} {phase.scenario}"
        # The workload source makes the request: a conversation's turn carries its history (and may wait for its
        # think time first), a dataset's or a trace's prompt its own output length.
        turn = phase.source.begin(work, settings.max_tokens)
        payload = llm.chat_payload(
            target.api, target.model, turn.messages, turn.max_tokens, settings.temperature, bool(target.ignore_eos)
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

        run: LoadRun = self.environment.servescope_run
        key = run.recorder.begin(phase, work)  # before the send: a distributed master counts it in flight
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
                keep_text=turn.keep_answer,
            )
        except GreenletExit as exc:  # the runner stopped us mid-stream (Ctrl-C, phase end): keep what we have
            interrupted = exc
            m = holder[0] if holder else llm.Measurement(started_at=time.time(), t_send=time.perf_counter())
            if not m.finished and m.error is None:  # a stream that had ended (whole, or with its error) keeps it
                m.fail(
                    llm.StreamError(
                        llm.ErrorKind.INTERRUPTED,
                        f"interrupted after {len(m.content_times)} content chunks (run stopped)",
                    )
                )
                m.t_end = time.perf_counter()
            if m.usage_tokens is None and m.content_times:
                m.tokens_source = "chunks"
        phase.source.end(turn, m)
        record = RequestRecord(
            engine=target.kind,
            instance=target.instance,
            scenario=phase.scenario,
            phase=work.phase_name,
            api=target.api,
            model=target.model,
            prompt_set=settings.prompt_set.name,
            prompt_set_sha256=settings.prompt_set.sha256,
            prompt_id=turn.prompt_id,
            max_tokens=turn.max_tokens,
            arrival_index=work.arrival_index,
            scheduled_at=work.scheduled_at,
            conversation=turn.conversation,
            turn=turn.turn,
            history_messages=turn.history_messages,
            history_tokens=turn.history_tokens,
            **m.record_fields(),
        )
        elapsed = m.elapsed_s or 0.0
        fire(
            request_type="chat",
            name=name,
            response_time=elapsed * 1000,
            response_length=m.output_tokens or 0,
            exception=None if m.ok else llm.StreamError(m.error_kind, m.error),
            context={"phase": work.phase_name},
            start_time=m.started_at,
            url=redact(target.url) + target.chat_path,
            response=None,
        )
        try:
            run.recorder.request(record, key)
        finally:
            phase.finished(work, record, elapsed)  # whatever happened to the record, the phase can end
        if interrupted is not None:
            raise interrupted
        return record

    def send_or_abort(self, phase, work, concurrency: int) -> None:
        """send() in a greenlet of its own (open loop): an unexpected exception stops the run, once."""
        try:
            self.send(phase, work, concurrency)
        except Exception as exc:  # noqa: BLE001 - said in one line by whoever drives the run
            _abort_run(self, exc)

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
        record = self.send(phase, work)
        if self.backs_off:
            self.back_off(phase, record)

    backs_off = False  # closed-loop users: the next request waits a little after one that found no engine
    _backoff_s = 0.0

    def back_off(self, phase, record) -> None:
        """After a request the engine was not there for (refused), wait before the next: doubling from BACKOFF_MIN_S
        to BACKOFF_MAX_S, back to none after a success. A user that resent at once made thousands of refused
        requests a second of an engine that was restarting; the phase counts the waits."""
        if record is None or record.error_kind != llm.ErrorKind.CONNECTION_REFUSED:
            self._backoff_s = 0.0
            return
        self._backoff_s = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, self._backoff_s * 2))
        phase.backoff_count += 1
        phase.backoff_s += self._backoff_s
        gevent.sleep(self._backoff_s)


class PhaseUser(LLMUser):
    """A user taking its next request from the running phase (the closed-loop scenarios)."""

    abstract = True

    @task
    @guarded
    def next_prompt(self) -> None:
        self.next_from_phase()


class SequentialUser(PhaseUser):
    """One user walking the prompt set back to back."""


class BurstUser(PhaseUser):
    """One of BURST_SIZE users; the phase's barrier releases all of them at the same instant."""


class ClosedLoopUser(PhaseUser):
    """A user sending back to back for a ramp step or a sweep level."""

    backs_off = True


class RateUser(LLMUser):
    """Open loop: one user that schedules arrivals; each request runs in its own greenlet and nobody waits."""

    @task
    @guarded
    def arrivals(self) -> None:
        run: LoadRun | None = getattr(self.environment, "servescope_run", None)
        phase = run.phase if run is not None else None
        if phase is None or not phase.open_loop or phase.scheduling:  # one schedule per process: the others wait
            if run is None:
                gevent.sleep(0.2)
            else:
                run.wait_for_change()
            return
        group = gevent.pool.Group()
        try:
            for work in phase.arrivals():
                group.spawn(self.send_or_abort, phase, work, phase.max_in_flight)
            group.join()
        finally:
            group.kill()


USER_CLASSES = {cls.__name__: cls for cls in (SequentialUser, BurstUser, ClosedLoopUser, RateUser)}


# --- the web UI / `locust -f` path: Locust's events drive the run, the load shape reads it ---


def _ours(environment) -> bool:
    """Started through this locustfile's parser (not by loadgen.cli, which wires its own run)."""
    options = environment.parsed_options
    return options is not None and hasattr(options, "scenario")


def _plan(environment) -> RunPlan:
    """The web UI's form as it was accepted (loadgen/webui_guard.py), read into the plan once, with the knobs as they
    are at this START; as before, its prompt set is the one named (no fresh seed written in)."""
    return RunPlan.from_args(environment.parsed_options, host=environment.host, fresh_prompts=False)


def _new_run(environment, plan: RunPlan, recorder, folder: RunFolder | None = None) -> LoadRun:
    if plan.command == "knee" and isinstance(environment.runner, MasterRunner):
        # Workers step through a phase list they build themselves; the knee's next load exists only on the master.
        raise ValueError("knee: each load is picked from the last one's results in one process: run without workers")
    target = parse_engine(plan.engines[0], ignore_eos=plan.ignore_eos, knobs=plan.settings.knobs)
    prompt_set = prompt_sets.load(plan.prompts)
    workloads.check(plan.command, prompt_set)
    if isinstance(environment.runner, MasterRunner) and isinstance(prompt_set, ConversationSet):
        # loadgen/distributed.py splits users, bursts and schedules; a conversation's history lives in one process.
        raise ValueError(f"the conversations of {prompt_set.name} are held in one process: run them without workers")
    settings = Settings(
        target=probe(target, plan.settings.knobs, plan.models[0] if plan.models else None),
        prompt_set=prompt_set,
        max_tokens=plan.max_tokens,
        temperature=plan.temperature,
        timeout_s=plan.request_timeout,
        think_s=float(plan.think_time or 0),
    )
    return LoadRun(build_phases(plan.command, settings, plan), recorder, folder=folder)


def _write_manifest(environment, run: LoadRun, status: str) -> None:
    options = environment.parsed_options
    settings = run.phases[0].settings if run.phases else None
    flags = {o.dest: getattr(options, o.dest, None) for o in option_table.for_locust()}
    flags["driver"] = "locust-web-ui" if not options.headless else "locust-headless"
    coordinator: distributed.Coordinator | None = getattr(environment, "servescope_coordinator", None)
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
            workers=coordinator.describe() if coordinator is not None else None,
            distributed=coordinator.summary() if coordinator is not None else None,
        )
    )


class ScenarioShape(LoadTestShape):
    """Users of the current phase: burst = the Number of users at once per round, ramp steps, sweep levels, one rate user.

    A pure reading of the run the conductor steps through: 0 users until `test_start` (fired by that first
    start) has built the run, None once it is over.
    """

    use_common_options = True  # the form's Number of users is the burst size

    def tick(self):
        environment = self.runner.environment
        run: LoadRun | None = getattr(environment, "servescope_run", None)
        if getattr(environment, "servescope_error", None):
            return None
        if run is None or run.closed:
            return 0, 1.0
        if run.finished or run.failure:
            return None
        phase = run.phase
        if phase is None or run.draining:
            return 0, 1.0
        return phase.users, float(phase.users), [USER_CLASSES[phase.user_class]]


class ShapeUsers(Users):
    """The web UI's users: ScenarioShape.tick sends the current phase's users and keeps them for the next phase; a
    phase with fewer waits for them all to go first (Locust would stop the surplus ones mid-request of the next)."""

    def __init__(self, environment, run: LoadRun):
        self.environment, self.run = environment, run

    def admit(self, phase, previous) -> None:
        if previous is not None and phase.users < previous.users:
            self.drain()

    def start(self, phase) -> None:
        # A master's users go to its workers: the phase starts on them (loadgen/distributed.py) once they were sent.
        while isinstance(self.environment.runner, MasterRunner) and not self.dispatched(phase):
            gevent.sleep(DISPATCH_CHECK_S)

    def drain(self, timeout: float = 10.0) -> None:
        """Stop every (idle) user: the shape asks for none meanwhile."""
        runner = self.environment.runner
        self.run.draining = True
        deadline = time.monotonic() + timeout
        while runner.user_count > 0 and time.monotonic() < deadline:
            gevent.sleep(0.05)
        self.run.draining = False

    def dispatched(self, phase) -> bool:
        """The master has sent this phase's users to the workers (the shape's next tick does it, within a second)."""
        return self.environment.runner.target_user_classes_count.get(phase.user_class, 0) == phase.users


def _conduct(environment, run: LoadRun) -> None:
    """On the master (or a single process): each phase in turn until it is done, by the one phase driver
    (loadgen/phase_driver.py), the load shape sending its users.

    With workers, loadgen/distributed.py starts each phase on all of them once the shape has sent its users, and
    ends it when every worker's part is over (a timed step by the master's clock)."""
    coordinator = getattr(environment, "servescope_coordinator", None)  # a distributed.Coordinator, with workers
    users: Users = ShapeUsers(environment, run)
    if coordinator is not None:
        from loadgen import distributed

        users = distributed.WorkerUsers(coordinator, users)
    # The engine's gauges into samples.jsonl, as a headless run has them.
    sampler: Sampler | None = getattr(environment, "servescope_sampler", None)
    PhaseDriver(run, users, sampler=sampler).drive()


@events.init.add_listener
def _on_init(environment, runner=None, web_ui=None, **_kwargs) -> None:
    if not _ours(environment):
        return
    if web_ui is not None:
        webui_guard.install(environment, web_ui)  # its START: same-origin only, every field by the option table
    options = environment.parsed_options
    problem = None
    try:
        llm.check_geventhttpclient()
    except llm.HttpClientError as exc:
        problem = str(exc)
    if options.http_client not in llm.TRANSPORTS:
        problem = f"--http-client {options.http_client!r}: expected one of {', '.join(llm.TRANSPORTS)}"
    try:
        spec = spec_of(options)
    except slo.SloError as exc:
        problem = str(exc)
    if problem:
        print(f"loadgen: {problem}", file=sys.stderr, flush=True)
        sys.exit(2)
    if isinstance(runner, WorkerRunner):
        from loadgen import distributed

        environment.servescope_agent = distributed.WorkerAgent(runner)
        return
    # The form, filled in: Host = the engine's URL, Number of users = the burst size; a phase starts its users at
    # once, so the ramp-up shows the same number.
    settings = LoadSettings.from_env()  # Locust's init: the knobs below its options, read once for the process
    if not environment.host:
        environment.host = options.engine_url or default_url(options.engine, settings.knobs)
        if not options.engine_url:
            print(f"loadgen: {chosen_url_line(options.engine, environment.host, settings.knobs)}", flush=True)
    if options.num_users is None:
        options.num_users = options.burst_size
    options.spawn_rate = options.num_users
    if options.metrics_port:
        from loadgen.client_metrics import ClientMetrics  # prometheus_client: only where the metrics are served

        metrics = ClientMetrics(spec=spec)
        try:
            metrics.serve(options.metrics_port, addr=settings.bind)
            environment.servescope_metrics = metrics
        except OSError as exc:
            print(
                f"loadgen: client metrics not exposed: port {options.metrics_port}: {exc.strerror or exc}",
                file=sys.stderr,
            )
    if isinstance(runner, MasterRunner):
        from loadgen import distributed

        environment.servescope_coordinator = distributed.Coordinator(
            runner, print, warn=lambda text: print(f"loadgen: {text}", file=sys.stderr, flush=True)
        )


@events.test_start.add_listener
def _on_test_start(environment, **_kwargs) -> None:
    if not _ours(environment):
        return
    options = environment.parsed_options
    if isinstance(environment.runner, WorkerRunner):
        # Its phases start when the master says (distributed.WorkerAgent), each with this worker's part of it.
        run = _new_run(environment, _plan(environment), environment.servescope_agent.recorder())
        environment.servescope_agent.attach(run)
        environment.servescope_run = run
        return
    if options.scenario == "burst" and options.num_users:
        options.burst_size = options.num_users  # the form's Number of users; workers get it with their spawn job
    environment.servescope_error = None
    try:
        option_table.validate(options)  # what the web UI's form sends is text, unchecked by Locust
        folder = RunFolder.create(options.results)
        # A folder that stops taking writes ends the test (the run exists before the first record is written).
        recorder = Recorder(
            folder=folder,
            metrics=getattr(environment, "servescope_metrics", None),
            on_failure=lambda reason: environment.servescope_run.abort(reason),
        )
        plan = _plan(environment)
        run = _new_run(environment, plan, recorder, folder)
    except (ValueError, OSError) as exc:
        print(f"loadgen: {option_table.said(exc)}", file=sys.stderr, flush=True)
        environment.servescope_error = option_table.said(exc)  # the shape's next tick ends the test
        webui_guard.forget_start(environment)  # the next START starts from the options before this one
        if options.headless:
            environment.process_exit_code = 2
        return
    coordinator = getattr(environment, "servescope_coordinator", None)
    if coordinator is not None:
        coordinator.attach(run)  # the workers' records go to this run from now on
    _write_manifest(environment, run, "running")
    recorder.line(f"run folder: {folder.path}")
    target = run.phases[0].settings.target if run.phases else None
    environment.servescope_sampler = Sampler.for_run(
        folder, [(target.kind, target.instance)] if target else [], plan.settings.sampler
    )
    environment.servescope_run = run
    environment.servescope_conductor = gevent.spawn(_conduct, environment, run)


@events.test_stop.add_listener
def _on_test_stop(environment, **_kwargs) -> None:
    conductor = getattr(environment, "servescope_conductor", None)
    if conductor is not None:
        conductor.kill()
        environment.servescope_conductor = None
    sampler = getattr(environment, "servescope_sampler", None)
    if sampler is not None:
        sampler.close()
        environment.servescope_sampler = None
    environment.servescope_error = None  # a later START tries again
    run: LoadRun | None = getattr(environment, "servescope_run", None)
    if run is None or run.folder is None or run.closed:
        return
    for phase in run.phases:  # each span once: a no-op for what was written as it finished
        phase.emit()
    if run.recorder.failure is None:  # a folder that refused a record would refuse these too
        try:
            write_locust_outputs(environment, run.folder.path)
            _write_manifest(environment, run, "failed" if run.failure else "complete" if run.finished else "stopped")
        except OSError as exc:
            run.abort(f"run folder {run.folder.path}: cannot finish it ({exc.strerror or exc})")
    if run.failure:
        print(f"loadgen: {run.failure}; the run stopped, the run folder keeps what finished", file=sys.stderr)
    run.recorder.line(f"run folder: {run.folder.path}")
    run.close()
