"""`up`/`down`/`status` for the native stack: prepare (installs, build, conversion), start in order, run the main job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from servescope import engines as kinds
from servescope.contracts import knobs
from servescope.contracts.runfolder import MANIFEST, new_run_id
from servescope.host import cpu_priority, pidrecords, probe
from servescope.prometheus import prometheus_config
from servescope.stack import llamacpp, model, ollama, paths, ports, prometheus, summary, supervisor, vllm
from servescope.stack.errors import ServiceExited, StackError
from servescope.stack.progress import elapsed, say
from servescope.stack.supervisor import Record, Service

VLLM, LLAMACPP, OLLAMA = kinds.VLLM.name, kinds.LLAMACPP.name, kinds.OLLAMA.name
# The engines `up` builds and starts itself (servescope/stack/vllm.py, servescope/stack/llamacpp.py); Ollama joins when one is there.
STARTED = (VLLM, LLAMACPP)
ORDER = (VLLM, LLAMACPP, OLLAMA, "exporter", "prometheus", "locust")


@dataclass
class Prepared:
    gguf: Path
    vllm_python: Path | None
    vllm_model: Path | None
    llama_server: Path | None
    prometheus_bin: str | None
    prometheus_note: str | None


def client_host(bind: str) -> str:
    return "127.0.0.1" if bind in ("0.0.0.0", "", "::") else bind


# ---------------------------------------------------------------- preparation


def wanted_engines() -> list[str]:
    """SERVESCOPE_ENGINES (default vllm,llamacpp): the engines `up` starts itself; Ollama joins when present."""
    names = [n.strip() for n in knobs.get("SERVESCOPE_ENGINES", "vllm,llamacpp").split(",") if n.strip()]
    unknown = [n for n in names if n not in STARTED]
    if unknown or not names:
        raise StackError(f"SERVESCOPE_ENGINES={','.join(names)!s}: expected a comma list of vllm, llamacpp")
    return names


def prepare(engines: list[str]) -> Prepared:
    """Two independent chains at once: the llama.cpp build (CPU-bound) beside the vLLM install (mostly download)."""
    started = time.monotonic()
    chains = (
        (["llama.cpp build"] if LLAMACPP in engines else [])
        + ["GGUF"]
        + (["venv-vllm → float32 weights for vLLM"] if VLLM in engines else [])
    )
    say(f"preparing (cached after the first time): {' | '.join(chains)}")

    def model_chain() -> tuple[Path, Path | None, Path | None]:
        gguf = model.ensure_gguf()
        if VLLM not in engines:
            return gguf, None, None
        python = vllm.ensure_venv()
        return gguf, python, model.ensure_vllm_model(gguf, python)

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="prepare") as pool:
        llama_future = pool.submit(llamacpp.ensure_built) if LLAMACPP in engines else None
        model_future = pool.submit(model_chain)
        gguf, vllm_python, vllm_model = model_future.result()
        llama_server = llama_future.result() if llama_future else None
    prometheus_bin, note = prometheus.find_or_install()
    say(f"prepared in {elapsed(time.monotonic() - started)}")
    return Prepared(gguf, vllm_python, vllm_model, llama_server, prometheus_bin, note)


# ---------------------------------------------------------------- the services


def engine_services(knob: dict[str, str], prep: Prepared, host: str, swap_used: bool) -> list[Service]:
    services = []
    if prep.vllm_python and prep.vllm_model:
        port = int(knob[kinds.VLLM.port_env])
        services.append(
            Service(
                VLLM,
                kinds.VLLM.title,
                vllm.command(prep.vllm_python, prep.vllm_model, knob, host, port, swap_used),
                host,
                port,
                kinds.VLLM.port_env,
                kinds.VLLM.health_path,
                ready_timeout=float(knobs.get("VLLM_READY_TIMEOUT", "600")),
                env=vllm.environment(knob),
            )
        )
    if prep.llama_server:
        port = int(knob[kinds.LLAMACPP.port_env])
        services.append(
            Service(
                LLAMACPP,
                kinds.LLAMACPP.title,
                llamacpp.command(prep.llama_server, prep.gguf, knob, host, port),
                host,
                port,
                kinds.LLAMACPP.port_env,
                kinds.LLAMACPP.health_path,
                ready_timeout=120,
            )
        )
    return services


def exporter_service(knob: dict[str, str], host: str, engines: dict[str, str], ollama_url: str | None) -> Service:
    port = int(knob["EXPORTER_PORT"])
    # Each engine read within the native 1 s scrape (servescope/prometheus/prometheus_config.py).
    budget = prometheus_config.engine_budget_s(prometheus_config.NATIVE_SCRAPE_INTERVAL)
    cmd = [sys.executable, "-m", "exporter", "--listen-address", host, "--port", str(port), "--timeout", f"{budget:g}"]
    for name in STARTED:
        if name in engines:
            # Each engine's CPU and memory against its limit (the dashboards' resource panels) from the pid
            # record `up` wrote for it: the exporter checks pid and start time, so a reused pid reads as down.
            cmd += [f"--{name}-url", engines[name], "--process", f"{name}={paths.pid_dir() / f'{name}.json'}"]
    if ollama_url:
        # The proxy in front of Ollama is what makes its queue visible; only with a real Ollama behind it.
        cmd += [
            "--ollama-url",
            ollama_url,
            "--proxy-port",
            knob["OLLAMA_PROXY_PORT"],
            "--ollama-num-parallel",
            knob["OLLAMA_NUM_PARALLEL"],
        ]
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
    knob = knobs.load()
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
    engines_wanted = wanted_engines()
    # Fail before a long preparation when a port is taken, and before starting anything: no half-started stack.
    check_ports(knob, bind, engines_wanted)
    try:  # the group ready before anything starts; CPU_PRIORITY=on where it cannot be: one line, nothing started
        priority = cpu_priority.apply([])
    except ValueError as exc:  # Refused, or a CPU_PRIORITY / CPU_PRIORITY_WEIGHT that is not one
        raise StackError(str(exc)) from None
    prep = prepare(engines_wanted)
    swap_used = False
    if prep.vllm_python and prep.vllm_model:
        swap_used = check_vllm_plan(knob, prep)
    check_ports(knob, bind, engines_wanted)
    services = engine_services(knob, prep, bind, swap_used)

    launch = Launch(priority)
    try:
        engines = start_engines(launch, services, knob, prep, bind, host, swap_used)
        say(launch.priority.describe())
        ollama_url = engines.pop("_ollama_backend", None)
        launch.start(exporter_service(knob, bind, {k: v for k, v in engines.items() if k != OLLAMA}, ollama_url))
        start_prometheus(launch, knob, prep, bind, host, running={r.name for r in launch.started})
    except BaseException:
        launch.rollback()
        raise
    say("")
    status()
    # Whether the engines' pages still carry what the exporter, rules and dashboards read (exporter/check.py): one
    # line, never a stop (the comparison still runs on what is there).
    from exporter import check as drift

    say(drift.one_line([f"{name}={url}" for name, url in engines.items() if not name.startswith("_")]))
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


def check_vllm_plan(knob: dict[str, str], prep: Prepared) -> bool:
    """The reference page's inequality before vLLM starts: refuse, naming the knob, what cannot fit. Returns
    swap_used."""
    swap_used = vllm.swap_space_supported(prep.vllm_python)
    if not swap_used:
        say(
            "note: vLLM 0.32 has no --swap-space flag (removed upstream); VLLM_SWAP_SPACE is not passed "
            "(the reference page showed it added no KV blocks on CPU anyway)"
        )
    kv = vllm.plan(prep.vllm_model, knob, model.weights_bytes(prep.vllm_model), swap_used)
    say(
        f"vLLM plan: {kv.kv_tokens:,} KV tokens ({kv.bytes_per_token:,} B/token) → {kv.max_concurrency:.2f}x "
        f"concurrency at max-model-len {kv.max_model_len}; needs ~{kv.resident_bytes / vllm.GIB:.1f} GiB"
    )
    overcommit = knob.get("VLLM_KV_OVERCOMMIT", "0").strip() == "1"
    reason = vllm.refusal(kv, vllm.available_memory(), overcommit)
    if reason:
        raise StackError(f"refusing to start vLLM: {reason}")
    note = vllm.overcommit_note(kv) if overcommit else None
    if note:
        say(note)
    return swap_used


def start_engines(
    launch: Launch, services: list[Service], knob: dict[str, str], prep: Prepared, bind: str, host: str, swap_used: bool
) -> dict[str, str]:
    """vLLM first (its warm-up is the long pole), llama.cpp and Ollama while it warms, then wait for vLLM."""
    by_name = {service.name: service for service in services}
    engines: dict[str, str] = {}
    vllm_started = None
    if VLLM in by_name:
        vllm_started = launch.start(by_name[VLLM], wait=False)
        engines[VLLM] = by_name[VLLM].url
    if LLAMACPP in by_name:
        try:
            launch.start(by_name[LLAMACPP])
        except ServiceExited as exc:
            if exc.code not in (-signal.SIGILL, -signal.SIGSEGV) or not llamacpp.cpu_advertises_amx():
                raise
            # Seen on this project's VMs: the CPU advertises AMX and the kernel grants it, yet the native build's
            # AMX kernels die on their first tile instruction (SIGILL at tilezero, SIGSEGV at ldtilecfg).
            # --no-repack keeps weights out of the AMX (and repacked) buffers; plain AVX-512 kernels serve them.
            say(
                f"llama-server died of signal {-exc.code} in its AMX kernels (AMX advertised but unusable here): "
                "restarting with --no-repack"
            )
            by_name[LLAMACPP].cmd.append("--no-repack")
            launch.start(by_name[LLAMACPP])
        engines[LLAMACPP] = by_name[LLAMACPP].url
    ollama_backend = start_ollama(launch, knob, prep, bind)
    if ollama_backend:
        engines["_ollama_backend"] = ollama_backend
        engines[OLLAMA] = f"http://{host}:{knob[kinds.OLLAMA.proxy_port_env]}"
    if vllm_started:
        proc, record = vllm_started
        supervisor.wait_ready(
            record,
            proc,
            by_name[VLLM].ready_timeout,
            label=f"vLLM warming up at {record.ready_url}",
            key="vLLM warm-up",
        )
        print_kv_sizing(by_name[VLLM].url, knob, swap_used)
    return engines


def start_ollama(launch: Launch, knob: dict[str, str], prep: Prepared, bind: str) -> str | None:
    """A real Ollama serves the same GGUF; none here means "absent", which is not a failure."""

    url = ollama.host_url(knob.get("OLLAMA_HOST"), int(knob["OLLAMA_PORT"]))
    if ollama.binary() or ollama.answers(url):
        ports.require_free(bind, int(knob["OLLAMA_PROXY_PORT"]), "exporter's Ollama proxy", "OLLAMA_PROXY_PORT")
    if not ollama.answers(url):
        binary = ollama.binary()
        if binary is None:
            Record(
                name=OLLAMA,
                title="Ollama",
                url=url,
                ready_url=url + "/api/version",
                absent="no `ollama` on PATH and nothing answers at " + url,
            ).save()
            say(f"Ollama: absent (no `ollama` on PATH, nothing at {url}): not compared")
            return None
        port = int(knob["OLLAMA_PORT"])
        launch.start(
            Service(
                OLLAMA,
                kinds.OLLAMA.title,
                ollama.serve_command(binary),
                bind,
                port,
                "OLLAMA_PORT",
                "/api/version",
                ready_timeout=60,
                env=ollama.serve_environment(bind, port, knob["OLLAMA_NUM_PARALLEL"]),
            )
        )
        url = f"http://{client_host(bind)}:{port}"
    else:
        Record(name=OLLAMA, title=kinds.OLLAMA.title, url=url, ready_url=url + kinds.OLLAMA.health_path).save()
        say(f"Ollama: using the one already answering at {url}")
    ollama.create_model(url, knob["OLLAMA_MODEL"], prep.gguf)
    return url


def print_kv_sizing(vllm_url: str, knob: dict[str, str], swap_used: bool) -> None:
    from servescope.host import bounded_http

    try:  # bounded as a whole (servescope/host/bounded_http.py): a page dripping or past the cap is "unreadable"
        answer = bounded_http.get(f"{vllm_url}/metrics", 10)
        if answer.status != 200:
            raise bounded_http.ServiceError(f"HTTP {answer.status}")
        info = vllm.cache_config_info(answer.text())
    except bounded_http.ServiceError as exc:
        say(f"vLLM /metrics unreadable ({exc}): no KV pool arithmetic")
        return
    if not info or "block_size" not in info:
        say("vLLM /metrics has no vllm:cache_config_info with block_size: no KV pool arithmetic")
        return
    for line in vllm.kv_sizing_lines(info, knob, swap_used):
        say(line)


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
    config = prometheus.write_config(prometheus_targets(knob, host, running))
    problem = prometheus.check_config(config)
    if problem:
        raise StackError(f"generated Prometheus config {config} is invalid: {problem.splitlines()[-1]}")
    launch.start(
        Service(
            "prometheus",
            "Prometheus",
            prometheus.command(prep.prometheus_bin, config, bind, port),
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
    for name in (VLLM, LLAMACPP, OLLAMA):
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
    summary.report_and_summary(run, f"http://127.0.0.1:{knob.get('PROMETHEUS_PORT') or knobs.get('PROMETHEUS_PORT')}")
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
