"""`up`/`down`/`status` for the native stack: prepare (installs, build, conversion), start in order, run the main job."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from servescope import engines as kinds
from servescope.contracts import knobs
from servescope.contracts.runfolder import MANIFEST, new_run_id
from servescope.contracts.settings import KnobTable
from servescope.host import cpu_priority, pidrecords, probe
from servescope.prometheus import prometheus_config
from servescope.stack import model, paths, ports, prometheus, summary, supervisor
from servescope.stack.errors import StackError
from servescope.stack.progress import say
from servescope.stack.supervisor import Record, Service
from servescope.text.numbers import elapsed

# The engines the native stack runs, in the registry's order: each adapter's `native` says how
# (servescope/engines/base.Native). `up` builds and starts the STARTED ones itself; the others join when one is there.
NATIVE = {name: kind for name, kind in kinds.ENGINES.items() if kind.native is not None}
STARTED = tuple(name for name, kind in NATIVE.items() if not kind.native.found)
ORDER = (*NATIVE, "exporter", "prometheus", "locust")


def hooks(name: str) -> ModuleType:
    """The stack's module for one engine, as its adapter names it (Native.module). What `up` calls on it:

    prepare(gguf, knob)                      what it is started from, made once (cached after the first time); gguf is
                                             None unless its preparation starts from the GGUF (Native.from_gguf)
    check(knob, prepared)                    optional: before it starts, refuse what cannot fit (StackError)
    launch_command(knob, prepared, gguf, host, port), launch_env(knob)    how it is started
    start(launch, service)                   optional: start it and wait until it serves, mending what a start showed
    serving(url, knob, prepared)             optional: once it serves, what `up` says of it
    join(launch, knob, gguf, bind, host)     an engine `up` finds (Native.found): its URL once it serves, None: absent
    exporter_args(knob, url)                 a found engine behind the exporter's proxy: how the exporter reads it
    """
    return importlib.import_module(NATIVE[name].native.module)


@dataclass
class Prepared:
    """What the native stack's preparation made: the GGUF, each engine's preparations and Prometheus' binary."""

    gguf: Path
    engine: dict[str, Any]  # what each engine's preparation made (its hooks' `prepare`), by name
    prometheus_bin: str | None
    prometheus_note: str | None


def client_host(bind: str) -> str:
    return "127.0.0.1" if bind in ("0.0.0.0", "", "::") else bind


# ---------------------------------------------------------------- preparation


def wanted_engines(knob: KnobTable) -> list[str]:
    """SERVESCOPE_ENGINES (its default: every STARTED engine): the engines `up` starts itself; a found engine joins
    when present."""
    names = [n.strip() for n in knob["SERVESCOPE_ENGINES"].split(",") if n.strip()]
    unknown = [n for n in names if n not in STARTED]
    if unknown or not names:
        raise StackError(f"SERVESCOPE_ENGINES={','.join(names)!s}: expected a comma list of {', '.join(STARTED)}")
    return names


def prepare(engines: list[str], knob: KnobTable) -> Prepared:
    """Two independent chains at once: the preparations that need no GGUF (a build: CPU-bound) beside the GGUF and the
    ones that start from it (an install, mostly download, then a conversion)."""
    started = time.monotonic()
    wanted = [kind for name, kind in NATIVE.items() if name in engines]
    beside = [kind for kind in wanted if not kind.native.from_gguf]
    after = [kind for kind in wanted if kind.native.from_gguf]
    chains = [*(k.native.prepares for k in beside if k.native.prepares), "GGUF"]
    chains += [k.native.prepares for k in after if k.native.prepares]
    say(f"preparing (cached after the first time): {' | '.join(chains)}")

    def model_chain() -> tuple[Path, dict[str, Any]]:
        gguf = model.ensure_gguf()
        return gguf, {kind.name: hooks(kind.name).prepare(gguf, knob) for kind in after}

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="prepare") as pool:
        building = {kind.name: pool.submit(hooks(kind.name).prepare, None, knob) for kind in beside}
        model_future = pool.submit(model_chain)
        gguf, made = model_future.result()
        made.update((name, future.result()) for name, future in building.items())
    prometheus_bin, note = prometheus.find_or_install()
    say(f"prepared in {elapsed(time.monotonic() - started)}")
    return Prepared(gguf, {kind.name: made[kind.name] for kind in wanted}, prometheus_bin, note)


# ---------------------------------------------------------------- the services


def engine_services(knob: dict[str, str], prep: Prepared, host: str) -> list[Service]:
    services = []
    for name, made in prep.engine.items():
        kind, engine = NATIVE[name], hooks(name)
        port = int(knob[kind.port_env])
        ready_env = kind.native.ready_env
        services.append(
            Service(
                name,
                kind.title,
                engine.launch_command(knob, made, prep.gguf, host, port),
                host,
                port,
                kind.port_env,
                kind.health_path,
                ready_timeout=float(knob[ready_env]) if ready_env else kind.native.ready_s,
                env=engine.launch_env(knob),
            )
        )
    return services


def check(knob: dict[str, str], prep: Prepared) -> None:
    """Each prepared engine's own check before it starts (a KV plan that cannot fit is refused)."""
    for name, made in prep.engine.items():
        engine = hooks(name)
        if hasattr(engine, "check"):
            engine.check(knob, made)


def exporter_service(
    knob: dict[str, str], host: str, engines: dict[str, str], proxied: dict[str, str] | None
) -> Service:
    """The exporter of the engines `up` started (`engines`) and of those found behind its proxy (`proxied`: their own
    URLs)."""
    port = int(knob["EXPORTER_PORT"])
    # Each engine read within the native 1 s scrape (servescope/prometheus/prometheus_config.py).
    budget = prometheus_config.engine_budget_s(prometheus_config.NATIVE_SCRAPE_INTERVAL)
    cmd = [sys.executable, "-m", "exporter", "--listen-address", host, "--port", str(port), "--timeout", f"{budget:g}"]
    for name in STARTED:
        if name in engines:
            # Each engine's CPU and memory against its limit (the dashboards' resource panels) from the pid
            # record `up` wrote for it: the exporter checks pid and start time, so a reused pid reads as down.
            cmd += [f"--{name}-url", engines[name], "--process", f"{name}={paths.pid_dir() / f'{name}.json'}"]
    for name, url in (proxied or {}).items():
        # The proxy in front of a found engine is what makes its queue visible; only with a real one behind it.
        cmd += hooks(name).exporter_args(knob, url)
    return Service(
        "exporter", "exporter", cmd, host, port, "EXPORTER_PORT", "/metrics", ready_timeout=60, cwd=str(knobs.REPO_ROOT)
    )


def prometheus_targets(
    knob: dict[str, str], host: str, running: set[str]
) -> list[tuple[str, str, str, dict[str, str]]]:
    """Scrape what is up: the exporter, the engines' raw pages (instance = the exporter's name), the loadgen, itself."""
    targets = [("prometheus", f"{host}:{knob['PROMETHEUS_PORT']}", "/metrics", {})]
    if "exporter" in running:
        targets.append(("exporter", f"{host}:{knob['EXPORTER_PORT']}", "/metrics", {}))
    targets.append(("loadgen", f"{host}:{knob['LOADGEN_METRICS_PORT']}", "/metrics", {}))
    for name in STARTED:
        kind = kinds.kind(name)
        if name in running and kind.metrics_path:
            targets.append((name, f"{host}:{knob[kind.port_env]}", kind.metrics_path, {"instance": name}))
    return targets


def locust_service(knob: dict[str, str], host: str, engines: dict[str, str]) -> Service:
    """Locust's web UI, its form filled in for the stack that runs: the first engine up (the reference page's
    order), the burst scenario with BURST_SIZE users, so START works untouched."""
    port = int(knob["LOCUST_PORT"])
    cmd = [sys.executable, "-m", "loadgen", "webui", "--port", str(port), "--bind", host]
    engine = next((name for name in ORDER if name in engines), None)
    if engine:
        cmd += [
            "--engine",
            engine,
            "--engine-url",
            engines[engine],
            "--scenario",
            "burst",
            "--users",
            knob["BURST_SIZE"],
        ]
    return Service(
        "locust",
        "Locust web UI",
        cmd,
        host,
        port,
        "LOCUST_PORT",
        "/",
        ready_timeout=60,
        env={"LOADGEN_METRICS_PORT": knob["LOADGEN_METRICS_PORT"]},
        cwd=str(knobs.REPO_ROOT),
    )


# ---------------------------------------------------------------- up


class Launch:
    """The services one `up` started: on failure or Ctrl-C, exactly these are stopped again.

    `priority` (CPU_PRIORITY, servescope/host/cpu_priority.py): each engine moves into the priority group right after
    its start, before it forks its workers (which then start in the group), when the check at `up`'s start
    allowed it; None: never."""

    def __init__(self, priority: cpu_priority.Priority | None = None) -> None:
        self.started: list[Record] = []
        self.priority = priority

    def start(self, service: Service, wait: bool = True, heartbeat: float | None = None):
        ports.require_free(service.host, service.port, service.title, service.port_env)
        proc, record = supervisor.start(service)
        self.started.append(record)
        say(f"started {service.title} (pid {record.pid}, log {record.log})")
        # The engines, and the observers that read them while they run (left outside, an engine at full tilt in the
        # group starves the exporter of its samples).
        if (service.name in kinds.ENGINES or service.name in pidrecords.OBSERVERS) and record.pid:
            self.protect(service.name, record.pid)
        if wait:
            supervisor.wait_ready(record, proc, service.ready_timeout, heartbeat=heartbeat)
        return proc, record

    def protect(self, name: str, pid: int) -> None:
        if self.priority is None or not self.priority.applied:
            return
        try:
            moved = cpu_priority.apply([pid], mode=self.priority.mode, multiple=self.priority.multiple)
        except cpu_priority.Refused as exc:  # CPU_PRIORITY=on, and the group refused this one
            raise StackError(str(exc)) from None
        if not moved.applied:  # auto: said once, with the reason, when the engines are up
            self.priority = moved
            return
        key = cpu_priority.OBSERVERS if name in pidrecords.OBSERVERS else name
        self.priority.who.setdefault(key, []).append(pid)
        self.priority.pids += moved.pids
        self.priority.gone += moved.gone
        self.priority.kept.update(moved.kept)

    def rollback(self) -> None:
        for record in reversed(self.started):
            supervisor.stop(record)
        for record in supervisor.records().values():
            if not record.pid:  # absent/external notes: nothing of this `up` is left
                supervisor.forget(record.name)
        if self.started:
            say(
                f"stopped what this `up` started ({', '.join(r.name for r in self.started)}); logs in {paths.service_logs()}"
            )


def alive_records() -> dict[str, Record]:
    return {name: rec for name, rec in supervisor.records().items() if rec.absent or supervisor.process_of(rec)}


def up(compare: bool = True) -> int:
    knob = KnobTable.from_env()  # `up`'s entry: the knobs, read once, for every service it starts
    existing = supervisor.records()
    if existing:
        ours = [r for r in existing.values() if r.pid]
        dead = [r.name for r in ours if supervisor.process_of(r) is None]
        if ours and not dead:
            say("native stack is already up (`make down` first to change knobs):")
            status()
            return 0
        if dead:
            say(f"stale pid files ({', '.join(dead)} not running): stopping the rest and starting afresh")
        down(quiet=True)

    bind = knob["SERVESCOPE_BIND"]
    host = client_host(bind)
    engines_wanted = wanted_engines(knob)
    # Fail before a long preparation when a port is taken, and before starting anything: no half-started stack.
    check_ports(knob, bind, engines_wanted)
    try:  # the group ready before anything starts; CPU_PRIORITY=on where it cannot be: one line, nothing started
        priority = cpu_priority.apply([])
    except ValueError as exc:  # Refused, or a CPU_PRIORITY / CPU_PRIORITY_WEIGHT that is not one
        raise StackError(str(exc)) from None
    prep = prepare(engines_wanted, knob)
    check(knob, prep)
    check_ports(knob, bind, engines_wanted)
    services = engine_services(knob, prep, bind)

    launch = Launch(priority)
    try:
        engines, proxied = start_engines(launch, services, knob, prep, bind, host)
        say(launch.priority.describe())
        launch.start(exporter_service(knob, bind, {k: v for k, v in engines.items() if k not in proxied}, proxied))
        start_prometheus(launch, knob, prep, bind, host, running={r.name for r in launch.started})
    except BaseException:
        launch.rollback()
        raise
    say("")
    status()
    # Whether the engines' pages still carry what the exporter, rules and dashboards read (exporter/check.py): one
    # line, never a stop (the comparison still runs on what is there).
    from exporter import check as drift

    say(drift.one_line([f"{name}={url}" for name, url in engines.items()], knob))
    # The comparison runs before the Locust UI starts: both expose client metrics on LOADGEN_METRICS_PORT
    # (the one `loadgen` target Prometheus scrapes); the UI takes the port over once the run is done.
    code = main_job(knob, host, engines) if compare else 0
    try:
        launch.start(locust_service(knob, bind, engines))
    except StackError as exc:
        say(f"Locust web UI not started: {exc}")
        code = code or 1
    print_urls(knob, host)
    return code


PORTS = (
    *((name, kinds.kind(name).port_env, kinds.kind(name).title) for name in STARTED),
    ("exporter", "EXPORTER_PORT", "exporter"),
    ("prometheus", "PROMETHEUS_PORT", "Prometheus"),
    ("locust", "LOCUST_PORT", "Locust web UI"),
)


def check_ports(knob: dict[str, str], bind: str, engines: list[str]) -> None:
    for name, port_env, title in PORTS:
        if name in STARTED and name not in engines:
            continue
        ports.require_free(bind, int(knob[port_env]), title, port_env)


def start_engines(
    launch: Launch, services: list[Service], knob: dict[str, str], prep: Prepared, bind: str, host: str
) -> tuple[dict[str, str], dict[str, str]]:
    """The engines with a long warm-up first, the others while they warm, then those found on this machine, then wait
    for the warm-ups. Returns where load goes, by engine, and the found engines' own URLs behind the exporter's proxy."""
    engines: dict[str, str] = {}
    proxied: dict[str, str] = {}
    warming = []
    for service in sorted(services, key=lambda s: not NATIVE[s.name].native.warms_up):
        engine = hooks(service.name)
        if NATIVE[service.name].native.warms_up:
            warming.append((service, launch.start(service, wait=False)))
        else:
            if hasattr(engine, "start"):
                engine.start(launch, service)
            else:
                launch.start(service)
            _serving(service, knob, prep)
        engines[service.name] = service.url
    for name, kind in NATIVE.items():
        url = hooks(name).join(launch, knob, prep.gguf, bind, host) if kind.native.found else None
        if url and kind.proxy_port_env:
            proxied[name] = url
            engines[name] = f"http://{host}:{knob[kind.proxy_port_env]}"
        elif url:
            engines[name] = url
    for service, (proc, record) in warming:
        said = NATIVE[service.name].said
        supervisor.wait_ready(
            record,
            proc,
            service.ready_timeout,
            label=f"{said} warming up at {record.ready_url}",
            key=f"{said} warm-up",
        )
        _serving(service, knob, prep)
    return engines, proxied


def _serving(service: Service, knob: dict[str, str], prep: Prepared) -> None:
    engine = hooks(service.name)
    if hasattr(engine, "serving"):
        engine.serving(service.url, knob, prep.engine[service.name])


def start_prometheus(
    launch: Launch, knob: dict[str, str], prep: Prepared, bind: str, host: str, running: set[str]
) -> None:
    port = int(knob["PROMETHEUS_PORT"])
    url = f"http://{host}:{port}"
    if prep.prometheus_bin is None:
        Record(
            name="prometheus", title="Prometheus", url=url, ready_url=url + "/-/ready", absent=prep.prometheus_note
        ).save()
        say(prep.prometheus_note or "Prometheus absent")
        return
    config = prometheus.write_config(prometheus_targets(knob, host, running), mode=knob["METRICS_MODE"])
    problem = prometheus.check_config(config)
    if problem:
        raise StackError(f"generated Prometheus config {config} is invalid: {problem.splitlines()[-1]}")
    launch.start(
        Service(
            "prometheus",
            "Prometheus",
            prometheus.command(prep.prometheus_bin, config, bind, port, knob),
            bind,
            port,
            "PROMETHEUS_PORT",
            "/-/ready",
            ready_timeout=60,
        )
    )


# ---------------------------------------------------------------- the main job


def compare_command(knob: dict[str, str], engines: dict[str, str], run_id: str) -> list[str]:
    cmd = [sys.executable, "-m", "loadgen", "compare"]
    for name in NATIVE:
        if name in engines:
            cmd += ["--engine", f"{name}={engines[name]}"]
    cmd += ["--max-tokens", knob["MAX_TOKENS"], "--burst-size", knob["BURST_SIZE"]]
    cmd += ["--results", str(results_dir(knob)), "--run-id", run_id, "--metrics-port", knob["LOADGEN_METRICS_PORT"]]
    return cmd


def results_dir(knob: dict[str, str]) -> Path:
    results = Path(os.path.expanduser(knob.get("SERVESCOPE_RESULTS") or "results"))
    return results if results.is_absolute() else knobs.REPO_ROOT / results


def main_job(knob: dict[str, str], host: str, engines: dict[str, str]) -> int:
    """The reference experiment across every engine that is up, then its table."""
    engines = {k: v for k, v in engines.items() if not k.startswith("_")}
    run_id = new_run_id()
    run = str(results_dir(knob) / run_id)
    cmd = compare_command(knob, engines, run_id)
    say(f"main job: {' '.join(cmd[1:])}")
    started = time.monotonic()
    code = subprocess.call(cmd, cwd=knobs.REPO_ROOT)
    say(f"comparison finished in {elapsed(time.monotonic() - started)} (exit {code})")
    if code != 0 or not (Path(run) / MANIFEST).exists():
        say("comparison failed: the services stay up (`make status`, `make down`)")
        return code or 1
    # The comparison printed the reference page's table itself (the report's: servescope.report.table); the report's summary
    # ends it.
    summary.report_and_summary(run, f"http://127.0.0.1:{knob['PROMETHEUS_PORT']}")
    # "run folder: PATH" alone on its line, as loadgen prints it: scripts and the e2e suite take the path from it.
    say(f"run folder: {run}")
    say(f"`make report RUN={run}` writes the report again (report.md / report.html there)")
    return 0


def print_urls(knob: dict[str, str], host: str) -> None:
    say("")
    say(f"Locust web UI  http://{host}:{knob['LOCUST_PORT']}")
    if probe.is_up(f"http://{host}:{knob['PROMETHEUS_PORT']}/-/ready"):
        say(f"Prometheus     http://{host}:{knob['PROMETHEUS_PORT']}")
    say(f"exporter       http://{host}:{knob['EXPORTER_PORT']}/metrics")
    if probe.is_up(f"http://{host}:{knob['GRAFANA_PORT']}/api/health"):
        say(f"Grafana        http://{host}:{knob['GRAFANA_PORT']}")
    say("")
    status()
    say("stop with `make down`; table with `make status`")


# ---------------------------------------------------------------- down / status


def url_host(url: str) -> str:
    return url.split("//", 1)[-1].rsplit(":", 1)[0] or "127.0.0.1"


def ordered(recs: dict[str, Record]) -> list[Record]:
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(recs.values(), key=lambda r: rank.get(r.name, len(ORDER)))


def down(quiet: bool = False) -> int:
    recs = supervisor.records()
    if not recs:
        if not quiet:
            say("native stack: nothing to stop")
        return 0
    leftovers = []
    for record in reversed(ordered(recs)):
        outcome = supervisor.stop(record)
        if not quiet and outcome != "absent":
            say(f"{record.name}: {outcome}" + (f" (pid {record.pid})" if record.pid else ""))
        if record.pid and record.port and ports.listening(url_host(record.url), record.port):
            leftovers.append(f"{record.name} port {record.port}")
    try:
        if cpu_priority.mode_knob() != "off":
            cpu_priority.remove()  # the group `up` made, once nothing runs in it (a run still in it keeps it)
    except ValueError:
        pass  # a CPU_PRIORITY that is no mode: `up` said so; `down` still stops everything
    if leftovers:
        say(f"still listening after down: {', '.join(leftovers)} (not started by `up`, or it outlived its group)")
        return 1
    return 0


def status() -> int:
    recs = supervisor.records()
    supervisor.print_status(ordered(recs))
    return 0
