"""`python -m loadgen quick [URL ...]` (`make quick`): find the engines running here, measure one user and a short knee on each, answer in plain words.

Per engine, one after another (two engines measured at once would share the cores and both be wrong):

  1. what it is: loadgen/discover.py (the usual ports on 127.0.0.1, or the URLs given)
  2. its gauges: an exporter of quick's own watching only it (loadgen/side_exporter.py), or none when the
     engine serves no metrics page: then the search runs without server samples and says what that costs
  3. `python -m loadgen knee` as a child process, its first load 1 user (the "one user" answer), each
     measurement QUICK_DURATION s, the boundary loads QUICK_KNEE_REPEATS times, at most QUICK_KNEE_PROBES
     measurements up to QUICK_MAX_LOAD users, on the knee's own fair workload (a fresh prompt per request,
     seeded for this run so that none repeats an earlier run's);
     at QUICK_BUDGET_S the search is stopped as Ctrl-C stops it and what was measured is the answer: a hard
     deadline, on servescope/host/children.py's schedule (SIGINT then, SIGTERM and at last SIGKILL if the knee is
     still running), so an engine costs at most QUICK_BUDGET_S plus the schedule's last step
  4. the answer: loadgen/quick_words.py, printed and kept as quick.txt in the knee's run folder, which is an
     ordinary run folder (`servescope report --run <id>`)

The SLOs are --slo, else the SLO knob, else servescope/contracts/thresholds.py's QUICK_SLO_DEFAULT (and so for the
attainment). Progress lines come from the run folder as the knee writes it (knee.json after each
measurement, a new phase's first sample or request). Ctrl-C stops the search in progress (the knee keeps
every finished request and measurement), answers for what was measured, and measures no further engine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen import discover, options, quick_words
from loadgen.side_exporter import ExporterError, SideExporter
from servescope import engines
from servescope.contracts import folder_writes, thresholds
from servescope.contracts.knobs import REPO_ROOT
from servescope.contracts.runfolder import KNEE, REQUESTS, SAMPLES, RunFolder
from servescope.contracts.settings import KnobTable, SamplerSettings
from servescope.contracts.urls import redact, redact_address
from servescope.host import bounded_http, children, engine_identity
from servescope.judgements import slo
from servescope.text import command_name, numbers, printable, words
from servescope.workloads import prompts as prompt_sets

EXIT_OK, EXIT_NOTHING, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
METRICS_TIMEOUT_S = 5.0  # a metrics page read, all of it (the engine's own, or an exporter's)


def build_parser(table: KnobTable | None = None) -> argparse.ArgumentParser:
    """quick's command line, every default a knob: `table`, else the knobs as this process's environment sets them."""
    table = KnobTable.from_env() if table is None else table
    p = options.ArgumentParser(
        prog=command_name.prog("python -m loadgen quick"),
        description="Find the LLM engines running on this machine (or at the URLs given), measure one user and a "
        "short knee on each, and say in plain words how many users each serves under the SLOs and what runs out.",
    )
    p.add_argument(
        "urls",
        nargs="*",
        metavar="URL",
        help="an engine's address (http://HOST:PORT, HOST:PORT or a port on 127.0.0.1; KIND=URL names its kind); "
        "none: look on the usual ports",
    )

    def knob(flag: str, name: str, kind, text: str) -> None:
        p.add_argument(flag, type=kind, default=table[name], help=f"{text} (default {name}: %(default)s)")

    p.add_argument(
        "--ports",
        default=table.text("QUICK_PORTS"),
        help="ports on 127.0.0.1 to look on, comma-separated (default QUICK_PORTS; empty: VLLM_PORT, LLAMACPP_PORT, "
        "OLLAMA_PROXY_PORT, OLLAMA_PORT and each engine's own default: 8000, 8080, 11434, 30000, 1234)",
    )
    p.add_argument(
        "--slo",
        type=options.slo_spec,
        default=table.text("SLO"),
        metavar="SPEC",
        help=f"service level objectives, {slo.SPEC_HELP} (default the SLO knob; empty: "
        f"servescope/contracts/thresholds.py's QUICK_SLO_DEFAULT, {thresholds.QUICK_SLO_DEFAULT})",
    )
    p.add_argument(
        "--slo-attainment",
        type=options.slo_share,
        default=table.text("SLO_ATTAINMENT") or None,
        metavar="SHARE",
        help=f"share of requests that must meet every per-request term (default the SLO_ATTAINMENT knob; empty: "
        f"QUICK_SLO_ATTAINMENT, {thresholds.QUICK_SLO_ATTAINMENT:g})",
    )
    knob("--duration", "QUICK_DURATION", options.positive_seconds, "seconds per measurement")
    knob("--max-load", "QUICK_MAX_LOAD", options.users, "the most users at once it tries")
    knob("--knee-repeats", "QUICK_KNEE_REPEATS", options.positive_int, "measurements of each boundary load")
    knob("--knee-probes", "QUICK_KNEE_PROBES", options.positive_int, "measurements per engine, at most")
    knob(
        "--budget",
        "QUICK_BUDGET_S",
        options.positive_seconds,
        f"seconds per engine, warm-up included: then the search stops as Ctrl-C stops it (SIGINT; SIGTERM "
        f"{children.STOP_TERMINATE_AFTER_S:g} s and SIGKILL {children.STOP_KILL_AFTER_S:g} s later if it still runs)",
    )
    knob("--warmup-max-s", "QUICK_WARMUP_MAX_S", options.non_negative_seconds, "seconds of warm-up per engine, at most")
    p.add_argument(
        "--prompts",
        default=None,
        help="the workload (default the knee's: LOADGEN_CAPACITY_PROMPTS, a fresh prompt per request; a synthetic set "
        "without ,seed=S gets this run's, so no prompt repeats an earlier run's)",
    )
    p.add_argument(
        "--max-tokens",
        type=options.positive_int,
        default=None,
        help="output tokens per request (default the knee's: LOADGEN_CAPACITY_MAX_TOKENS)",
    )
    p.add_argument("--model", default=None, help="model to request (default: what the engine lists)")
    p.add_argument(
        "--results",
        default=str(_default_results(table)),
        help="where run folders go (default SERVESCOPE_RESULTS: %(default)s)",
    )
    return p


@dataclass
class Settings:
    """The resolved command line: what every engine is measured with."""

    spec: slo.SloSpec
    duration_s: float
    max_load: int
    repeats: int
    probes: int
    budget_s: float
    warmup_max_s: float
    prompts: str | None
    max_tokens: int | None
    model: str | None
    results: Path
    knobs: KnobTable  # read with the command line: API keys, the stack's ports, where samples come from

    @classmethod
    def of(cls, args: argparse.Namespace, knobs: KnobTable | None = None) -> Settings:
        """The command line's values (`knobs`: the table its parser read; None: the environment's now)."""
        knobs = KnobTable.from_env() if knobs is None else knobs
        text = args.slo or thresholds.QUICK_SLO_DEFAULT
        objective = args.slo_attainment if args.slo_attainment not in (None, "") else thresholds.QUICK_SLO_ATTAINMENT
        return cls(
            slo.parse(text, objective),
            args.duration,
            args.max_load,
            args.knee_repeats,
            args.knee_probes,
            args.budget,
            args.warmup_max_s,
            prompt_sets.for_this_run(args.prompts or knobs["LOADGEN_CAPACITY_PROMPTS"]),
            args.max_tokens,
            args.model,
            Path(args.results),
            knobs,
        )


class Progress:
    """quick's own lines: elapsed time since it started, flushed (a pipe shows them as they come)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:5.0f}s] {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    table = KnobTable.from_env()  # quick's command line and environment enter here, once
    args = build_parser(table).parse_args(sys.argv[1:] if argv is None else argv)
    try:
        settings = Settings.of(args, table)  # the namespace stops here: what follows takes the settings and the targets
    except slo.SloError as exc:
        print(f"quick: {exc}", file=sys.stderr)
        return EXIT_USAGE
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # a SIGTERM ends it as Ctrl-C does
    try:
        return _main(settings, args.urls, args.ports, Progress())
    except KeyboardInterrupt:  # before or between engines: nothing was being measured
        print("quick: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(settings: Settings, urls: list[str], ports: str, say: Progress) -> int:
    try:
        servers = _servers(urls, ports, say, settings.knobs)
    except discover.DiscoverError as exc:
        print(f"quick: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not servers:
        return EXIT_NOTHING
    outcomes: list[quick_words.Outcome] = []
    interrupted = False
    for n, server in enumerate(servers, 1):
        say(f"quick: {n} of {len(servers)}: {server.title()} at {server.url}")
        outcome, interrupted = measure(server, settings, say)
        outcomes.append(outcome)
        _answer(outcome)
        if interrupted:
            left = len(servers) - n
            if left:
                say(f"quick: interrupted: {words.count(left, 'engine')} not measured")
            break
    if len(outcomes) > 1:
        print(
            "\n" + "\n".join(f"{o.title}: {quick_words.report_command(o.run_ref)}" for o in outcomes if o.run_ref),
            flush=True,
        )
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if any(o.knee and o.knee.get("levels") for o in outcomes) else EXIT_NOTHING


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _servers(urls: list[str], ports: str, say: Progress, knobs: KnobTable) -> list[discover.Server]:
    """The engines to measure (the URLs given, else what answers on the ports); one line for each one that answers
    nothing or cannot be measured."""
    if urls:
        found: list[discover.Server] = []
        for text in urls:
            kind, sep, url = text.partition("=")
            if not sep:
                kind, url = "", text
            elif kind not in engines.ENGINES:
                shown = printable.line(redact_address(text))
                raise discover.DiscoverError(
                    f"{shown!r}: {kind!r} is not an engine kind ({', '.join(engines.ENGINES)})"
                )
            server = discover.identify(discover.root_url(url), knobs=knobs)
            if not server.answered:
                print(f"quick: nothing answers at {redact(server.url)} ({server.error})", file=sys.stderr, flush=True)
                continue
            if kind and server.kind != kind:
                server.kind, server.what = kind, engines.kind(kind).title  # the user said what it is
                server.identity = engine_identity.probe(kind, server.url)
            found.append(server)
    else:
        usual = discover.parse_ports(ports, "--ports") if ports.strip() else discover.usual_ports(knobs)
        say(f"quick: looking on 127.0.0.1 ports {', '.join(f'{u.port} ({u.source})' for u in usual)}")
        result = discover.discover(usual, knobs)
        for line in result.skipped:
            say(f"quick: {line}")
        found = result.servers
        if not found:
            say(
                "quick: no engine answers on those ports: start one (`make up`), or give its URL "
                "(python -m loadgen quick http://HOST:PORT, make quick URL=...)"
            )
            return []
    usable = []
    for server in found:
        where = f" ({server.port.source})" if server.port else ""
        if server.kind is None:
            say(
                f"quick: {server.what} at {server.url}{where}: servescope has no engine kind for it "
                f"(it measures {', '.join(k.title for k in engines.ENGINES.values())}): not measured"
            )
            continue
        model = printable.line(server.identity.model) if server.identity else ""  # the engine's text, echoed
        say(f"quick: found {server.title()} at {server.url}{where}" + (f", model {model}" if model else ""))
        usable.append(server)
    return usable


# ---------------------------------------------------------------- one engine


@dataclass
class Gauges:
    """Where the knee's server samples come from for one engine, and where its load goes."""

    load_url: str
    sample_url: str | None = None  # None: no samples (SAMPLE_INTERVAL_MS=0 for the knee)
    exporter: SideExporter | None = None
    not_measured: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


NO_GAUGES = "no running / waiting / KV gauges, so batch slots and KV capacity cannot be told apart"


def gauges_for(server: discover.Server, say: Progress, knobs: KnobTable) -> Gauges:
    kind = engines.kind(server.kind)
    if kind.metrics is None and kind.proxy_port_env:
        return _ollama_gauges(server, say, knobs)
    problem = metrics_problem(server.url, kind, knobs)
    if problem:
        return Gauges(server.url, not_measured=[f"server gauges: {problem}: {NO_GAUGES}"])
    exporter = SideExporter(server.kind, server.url)
    problem = _start(exporter)
    if problem:
        return Gauges(server.url, not_measured=[f"server gauges: {problem}: {NO_GAUGES}"])
    say(f"quick: {server.kind}: its gauges through an exporter of quick's own at {exporter.url}")
    return Gauges(server.url, exporter.url, exporter)


def _start(exporter: SideExporter) -> str:
    """Start it; why not in one line ("" when it runs). Stopped again on anything else, Ctrl-C included."""
    try:
        exporter.start()
    except ExporterError as exc:
        exporter.close()
        return str(exc)
    except BaseException:
        exporter.close()
        raise
    return ""


def metrics_problem(url: str, kind: engines.EngineKind, knobs: KnobTable) -> str:
    """Why the engine's metrics page cannot feed the exporter ("" when it can; `knobs`: its API key)."""
    key = knobs.text(kind.api_key_env) if kind.api_key_env else ""
    try:  # bounded as a whole (servescope/host/bounded_http.py): a page dripping a byte a second costs METRICS_TIMEOUT_S
        answer = bounded_http.get(url + kind.metrics_path, METRICS_TIMEOUT_S, api_key=key, redirects=0)
    except bounded_http.ServiceError as exc:
        return f"{kind.metrics_path} could not be read ({exc.reason})"
    hint = f" ({kind.metrics.how_on})" if kind.metrics.how_on else ""
    if answer.status != 200:
        return f"{kind.title} answers {kind.metrics_path} with HTTP {answer.status}{hint}"
    if kind.metrics.prefix not in answer.text():
        return f"{kind.metrics_path} carries none of {kind.title}'s series"
    return ""


def _ollama_gauges(server: discover.Server, say: Progress, knobs: KnobTable) -> Gauges:
    """Ollama has no metrics page: running / waiting are what a proxy relayed. Through the stack's proxy, its exporter
    has them; otherwise quick runs a proxy of its own and sends the load through it."""
    if server.is_stack_proxy:
        source = SamplerSettings(knobs).exporter_url
        if _exports(source, server.kind):
            return Gauges(
                server.url,
                source,
                notes=[f"load through the stack's Ollama proxy: running and waiting are what it relayed ({source})"],
            )
        return Gauges(
            server.url,
            not_measured=[f"server gauges: the stack's exporter at {source} does not export this Ollama: {NO_GAUGES}"],
        )
    exporter = SideExporter(server.kind, server.url, proxy=True, knobs=knobs)
    problem = _start(exporter)
    if problem:
        return Gauges(server.url, not_measured=[f"server gauges: {problem}: {NO_GAUGES}"])
    say(f"quick: ollama: load through a proxy of quick's own at {exporter.proxy_url} (Ollama has no /metrics)")
    return Gauges(
        exporter.proxy_url,
        exporter.url,
        exporter,
        notes=[
            f"load through a proxy of quick's own at {exporter.proxy_url}: running and waiting are what it relayed "
            f"(Ollama has no metrics page)"
        ],
    )


def _exports(source: str, kind: str) -> bool:
    """Whether the exporter at `source` exports an engine of this kind."""
    try:
        page = bounded_http.get(f"{source}/metrics", METRICS_TIMEOUT_S, redirects=0).text()
    except bounded_http.ServiceError:
        return False
    return f'engine="{kind}"' in page


def run_id_for(server: discover.Server) -> str:
    port = server.url.rsplit(":", 1)[-1]
    return f"{time.strftime('%Y%m%d-%H%M%S')}-quick-{server.kind}-{port}"


def knee_command(server: discover.Server, load_url: str, settings: Settings, run_id: str) -> list[str]:
    cmd = [sys.executable, "-m", "loadgen", "knee", "--engine", f"{server.kind}={load_url}"]
    cmd += ["--results", str(settings.results), "--run-id", run_id, "--quiet", "--metrics-port", "0"]
    cmd += ["--over", "concurrency", "--min-load", "1", "--start-load", "1", "--max-load", str(settings.max_load)]
    cmd += ["--duration", f"{settings.duration_s:g}", "--knee-repeats", str(settings.repeats)]
    cmd += ["--knee-probes", str(settings.probes), "--slo", settings.spec.text]
    cmd += ["--slo-attainment", f"{settings.spec.objective:g}"]
    if settings.prompts:
        cmd += ["--prompts", settings.prompts]
    if settings.max_tokens:
        cmd += ["--max-tokens", str(settings.max_tokens)]
    if settings.model:
        cmd += ["--model", settings.model]
    return cmd


def measure(server: discover.Server, settings: Settings, say: Progress) -> tuple[quick_words.Outcome, bool]:
    """One engine: (its answer, whether Ctrl-C ended it)."""
    started = time.monotonic()
    outcome = quick_words.Outcome(
        title=server.title(),
        url=server.url,
        model=settings.model or (server.identity.model if server.identity else ""),
        spec=settings.spec,
        knee=None,
        duration_s=settings.duration_s,
    )
    interrupted = False
    gauges = Gauges(server.url)
    try:
        gauges = gauges_for(server, say, settings.knobs)
        outcome.not_measured += gauges.not_measured
        outcome.notes += gauges.notes
        outcome.run_id = run_id_for(server)
        interrupted = _run_knee(server, gauges, settings, outcome, say)
    except KeyboardInterrupt:
        interrupted = True
        outcome.stopped = outcome.stopped or "Ctrl-C stopped it"
    finally:
        if gauges.exporter is not None:
            gauges.exporter.close()
    outcome.elapsed_s = time.monotonic() - started
    folder = settings.results / outcome.run_id if outcome.run_id else None
    if folder is not None and folder.is_dir():
        outcome.folder = folder
        outcome.run_path = _shown(folder)
        # `servescope report --run` takes an id under SERVESCOPE_RESULTS, else a path
        under_results = folder.parent.resolve() == _default_results(settings.knobs)
        outcome.run_ref = outcome.run_id if under_results else str(folder.resolve())
        if (folder / KNEE).exists():
            outcome.knee = json.loads((folder / KNEE).read_text())
        outcome.records = list(RunFolder(folder).requests())
        prompt_set = (outcome.knee or {}).get("prompt_set", {}).get("name")
        if prompt_set:
            outcome.prompts = prompt_set
    return outcome, interrupted


def knee_env(gauges: Gauges, settings: Settings) -> dict[str, str]:
    """The knee's environment: where its samples come from (none without gauges), its warm-up bound, and the
    exporter quick started as servescope's own observer."""
    env = {**os.environ, "WARMUP_MAX_S": f"{settings.warmup_max_s:g}"}
    if gauges.sample_url:
        env["SAMPLE_EXPORTER_URL"] = gauges.sample_url
    else:
        env["SAMPLE_INTERVAL_MS"] = "0"
    if gauges.exporter is not None and gauges.exporter.proc is not None:
        # Its CPU (a read of the engine per sample, 0.1-0.2 of a core on the double) is the measurement's cost, as
        # the stack's exporter's is: never host noise that sends a measurement back.
        env["LOADGEN_OBSERVER_PIDS"] = f"quick-exporter={gauges.exporter.proc.pid}"
    return env


def _run_knee(
    server: discover.Server, gauges: Gauges, settings: Settings, outcome: quick_words.Outcome, say: Progress
) -> bool:
    env = knee_env(gauges, settings)
    folder = settings.results / outcome.run_id
    log = settings.results / f".{outcome.run_id}.log"  # the knee's own output; moved into its folder after
    settings.results.mkdir(parents=True, exist_ok=True)
    cmd = knee_command(server, gauges.load_url, settings, outcome.run_id)
    say(
        f"quick: {server.kind}: warm-up (not recorded, at most {settings.warmup_max_s:g} s), then loads from 1 user, "
        f"{settings.duration_s:g} s each, at most {settings.probes} measurements or {settings.budget_s:g} s"
    )
    interrupted = False
    stopping: children.Stopping | None = None
    with folder_writes.open_append(log) as out:  # never through a link put at its name
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        try:
            watcher = Watcher(folder, server.kind, settings.spec, say)
            deadline = time.monotonic() + settings.budget_s
            while proc.poll() is None:
                time.sleep(0.5)
                watcher.poll()
                if stopping is not None:
                    _escalate(stopping, server.kind, say)
                elif time.monotonic() >= deadline:
                    outcome.stopped = f"the {settings.budget_s:g} s budget (QUICK_BUDGET_S) stopped the search"
                    say(f"quick: {server.kind}: {outcome.stopped}; keeping what was measured")
                    stopping = children.Stopping(proc)  # SIGINT now, then SIGTERM, then SIGKILL: a hard deadline
        except KeyboardInterrupt:
            interrupted = True
            outcome.stopped = "Ctrl-C stopped the search"
            say(f"quick: {server.kind}: Ctrl-C: stopping the search, keeping what was measured")
            stopping = stopping or children.Stopping(proc)
        finally:
            _end(proc, stopping, server.kind, say)
    watcher.poll()
    # A knee stopped on purpose may end any way (a SIGINT while it still imports is a traceback): not a failure.
    failed = proc.returncode not in (0, EXIT_INTERRUPTED) and not outcome.stopped
    if folder.is_dir():
        log.replace(folder / "knee.log")
        if failed:
            outcome.failure = (
                f"the knee run ended with exit {proc.returncode} (its output: {_shown(folder / 'knee.log')})"
            )
    else:
        if failed:
            lines = [line for line in log.read_text().splitlines() if line.strip()]
            outcome.failure = f"the knee run failed: {lines[-1] if lines else f'exit {proc.returncode}'}"
        log.unlink(missing_ok=True)
    return interrupted


def _end(proc: subprocess.Popen, stopping: children.Stopping | None, kind: str, say: Progress) -> None:
    """Wait for the knee to finish its folder, on children.py's schedule when it is being stopped (it never outlives
    the SIGKILL); a knee quick did not stop (an error in quick itself) is stopped on it too. A second Ctrl-C kills
    it at once."""
    if proc.poll() is not None:
        return
    stopping = stopping or children.Stopping(proc)
    try:
        while proc.poll() is None:
            _escalate(stopping, kind, say)
            try:
                proc.wait(0.2)
            except subprocess.TimeoutExpired:
                pass
    except KeyboardInterrupt:
        stopping.kill()
        proc.wait()
        raise


def _escalate(stopping: children.Stopping, kind: str, say: Progress) -> None:
    """The schedule's next signal when due, said: a knee that outlives its SIGINT is not waited on for ever."""
    sent = stopping.due()
    if sent is not None:
        waited = stopping.clock() - stopping.began
        say(f"quick: {kind}: the knee is still running {waited:.0f} s after its SIGINT: {sent.name} sent")


class Watcher:
    """Progress from the run folder as the knee writes it: a new phase's first sample or request, knee.json's probes."""

    def __init__(self, folder: Path, kind: str, spec: slo.SloSpec, say: Progress):
        self.folder, self.kind, self.spec, self.say = folder, kind, spec, say
        self.offsets = {SAMPLES: 0, REQUESTS: 0}
        self.phases: set[str] = set()
        self.probes = 0
        self.knee_mtime = 0

    def poll(self) -> None:
        self._finished()  # first: the measurement that ended comes before the one that began after it
        for name in (SAMPLES, REQUESTS):
            for phase in self._new_phases(name):
                level = _level_of(phase)
                self.say(f"quick: {self.kind}: measuring {words.count(level, 'user') if level else phase} at once")

    def _finished(self) -> None:
        path = self.folder / KNEE
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            return
        if mtime == self.knee_mtime:
            return
        self.knee_mtime = mtime
        try:
            probes = json.loads(path.read_text()).get("probes", [])
        except (OSError, ValueError):
            return
        for p in probes[self.probes :]:
            self.say(f"quick: {self.kind}: {probe_line(p, self.spec)}")
        self.probes = max(self.probes, len(probes))

    def _new_phases(self, name: str) -> list[str]:
        path = self.folder / name
        try:
            with open(path, "rb") as fh:
                fh.seek(self.offsets[name])
                chunk = fh.read()
        except OSError:
            return []
        end = chunk.rfind(b"\n") + 1  # a line still being written is read next time
        self.offsets[name] += end
        new = []
        for line in chunk[:end].splitlines():
            try:
                phase = json.loads(line).get("phase")
            except ValueError:
                continue
            if phase and phase not in self.phases:
                self.phases.add(phase)
                new.append(phase)
        return new


def _level_of(phase: str) -> int | None:
    """knee-c3-2 -> 3 (loadgen/knee.py's names for a concurrency measurement)."""
    parts = phase.split("-")
    if len(parts) == 3 and parts[0] == "knee" and parts[1].startswith("c") and parts[1][1:].isdigit():
        return int(parts[1][1:])
    return None


def probe_line(probe: dict[str, Any], spec: slo.SloSpec) -> str:
    r = probe["result"]
    head = f"{words.count(probe['level'], 'user')}: {r['requests']} requests, {numbers.percent(r['attainment'], 0, '-')} met the SLOs"
    if probe.get("fault"):
        return f"{head}: the engine was not there ({probe['fault']}): measured again once it answers"
    verdict = "holds" if r["meets"] else f"fails ({quick_words.failed_words(spec, r)})"
    if probe.get("noisy"):
        used = "" if probe.get("trusted") else ", outweighed by a quiet measurement of the same load"
        return f"{head}: {verdict} on a busy host ({probe['noisy'][0]}{used})"
    return f"{head}: {verdict}"


def _default_results(table: KnobTable) -> Path:
    option = options.Option("--results", "", knob="SERVESCOPE_RESULTS", repo_relative=True)
    return Path(option.default(table)).resolve()


def _shown(path: Path) -> str:
    """A path as the user can type it: relative to the current directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _answer(outcome: quick_words.Outcome) -> None:
    text = "\n".join([*quick_words.lines(outcome), f"  ({quick_words.LEGEND})"])
    print("\n" + text + "\n", flush=True)
    if outcome.folder is not None:
        try:
            folder_writes.write_file(outcome.folder / "quick.txt", text + "\n")
        except OSError:
            pass  # the answer is on the terminal; a folder that refuses it keeps the knee's own files
