"""Compose mode of the stack: `docker compose` (or `docker-compose`) up/down/status, and each engine's CPU and memory against its limit."""

from __future__ import annotations

import io
import os
import secrets
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from servescope import engines as kinds
from servescope.contracts import knobs
from servescope.contracts.runfolder import new_run_id
from servescope.contracts.settings import KnobTable
from servescope.prometheus import prometheus_config
from servescope.stack import llamacpp, summary
from servescope.stack.errors import StackError
from servescope.stack.progress import say
from servescope.text.numbers import elapsed

COMPOSE_FILE = knobs.REPO_ROOT / "docker-compose.yml"
PROJECT = "servescope"
ENGINE_SERVICES = prometheus_config.COMPOSE_ENGINES
# COMPOSE_PROFILES picks among these; every other service always runs.
PROFILES = (*ENGINE_SERVICES, "grafana")
# Where the exporter reaches each engine inside the Compose network.
ENGINE_URLS = {name: f"http://{name}:{prometheus_config.COMPOSE_PORTS[name]}" for name in ENGINE_SERVICES}
# Where the load generator sends requests: an engine the exporter proxies (Ollama) through its proxy, the only place
# its queue is visible.
LOADGEN_URLS = {
    name: f"http://exporter:{prometheus_config.COMPOSE_PORTS[f'{name}-proxy']}"
    if kinds.kind(name).proxy_port_env
    else url
    for name, url in ENGINE_URLS.items()
}
CPU_KNOBS = ("VLLM_CPUS", "OLLAMA_CPUS", "LLAMACPP_CPUS")
MASTER_CONTAINER = "servescope-locust-master"
# A Docker engine that does not answer within this is treated as absent (native stack instead).
PING_TIMEOUT_S = 2.0


def docker_available(timeout: float = PING_TIMEOUT_S) -> bool:
    """True when a Docker engine answers a ping (DOCKER_HOST or the default socket) within `timeout`."""
    try:
        import docker

        client = docker.from_env(timeout=timeout)
    except Exception:  # noqa: BLE001 -- no socket, bad DOCKER_HOST, missing SDK: all mean "no engine"
        return False
    try:
        return bool(client.ping())
    except Exception:  # noqa: BLE001
        return False
    finally:
        client.close()


def compose_command(
    which: Callable[[str], str | None] = shutil.which, run: Callable[..., subprocess.CompletedProcess] = subprocess.run
) -> list[str]:
    """`docker compose` (the v2 plugin) when present, else Debian's `docker-compose`."""
    if which("docker"):
        try:
            probe = run(["docker", "compose", "version"], capture_output=True, text=True, timeout=20)
            if probe.returncode == 0:
                return ["docker", "compose"]
        except (OSError, subprocess.TimeoutExpired):
            pass
    if which("docker-compose"):
        return ["docker-compose"]
    raise StackError(
        "Compose is not installed: install the docker compose plugin (or `apt-get install docker-compose`)"
    )


def active_profiles(env: dict[str, str]) -> list[str]:
    """COMPOSE_PROFILES as a list in PROFILES order; an unknown name is one clear error."""
    named = [p.strip() for p in env.get("COMPOSE_PROFILES", "").split(",") if p.strip()]
    unknown = sorted(set(named) - set(PROFILES))
    if unknown:
        raise StackError(
            f"COMPOSE_PROFILES={env['COMPOSE_PROFILES']}: unknown {', '.join(unknown)}; "
            f"expected a comma list of {', '.join(PROFILES)}"
        )
    return [p for p in PROFILES if p in named]


def engines_in(env: dict[str, str]) -> list[str]:
    return [p for p in active_profiles(env) if p in ENGINE_SERVICES]


def compose_env(environ: dict[str, str] | None = None, cores: int | None = None) -> dict[str, str]:
    """The environment Compose runs with: the process environment plus every knob (environment > .env >
    .env.example), and what follows from the active profiles (which engines the exporter and Locust see)."""
    env = dict(os.environ if environ is None else environ)
    env.update(KnobTable.from_env(env))  # the knob table of that environment: what Compose interpolates
    env.setdefault("COMPOSE_PROJECT_NAME", PROJECT)
    profiles = active_profiles(env)
    engines = engines_in(env)
    for engine in engines:
        # The exporter watches an engine only when its profile runs it; otherwise it would report it down.
        env.setdefault(f"COMPOSE_{engine.upper()}_URL", ENGINE_URLS[engine])
    if engines:
        env.setdefault("COMPOSE_LOADGEN_ENGINE", engines[0])
        env.setdefault("COMPOSE_LOADGEN_ENGINE_URL", LOADGEN_URLS[engines[0]])
    # The container runs on this CPU: where it advertises AMX, llama-server's repacked (AMX) kernels die of SIGILL on
    # this project's VMs (exit 132 in a crash loop), as the native stack finds and mends (servescope/stack/native.py).
    env.setdefault("COMPOSE_LLAMACPP_REPACK", "0" if llamacpp.cpu_advertises_amx() else "1")
    if "grafana" in profiles:
        env.setdefault("COMPOSE_GRAFANA_URL", f"http://grafana:{prometheus_config.COMPOSE_PORTS['grafana']}")
    elif not env.get("GRAFANA_ADMIN_PASSWORD"):
        # Compose interpolates every service, Grafana's `:?` too, even when its profile is off: a one-off
        # value no one sees satisfies it (Grafana does not run, Locust posts no annotations without its URL).
        env["GRAFANA_ADMIN_PASSWORD"] = secrets.token_urlsafe(18)
    wheelhouse = urlsplit(env.get("BUILD_WHEELHOUSE") or "")
    if wheelhouse.scheme == "http" and wheelhouse.hostname:
        env.setdefault("COMPOSE_WHEELHOUSE_HOST", wheelhouse.hostname)  # pip refuses plain http hosts not trusted
    cores = cores or os.cpu_count() or 1
    for knob in CPU_KNOBS:
        try:
            wanted = float(env.get(knob) or cores)
        except ValueError:
            raise StackError(f"{knob}={env[knob]!r} is not a number of CPUs") from None
        if wanted > cores:
            # Docker refuses a limit above the machine's cores ("range of CPUs is from 0.01 to N").
            env[knob] = str(cores)
    return env


def _compose(args: Iterable[str]) -> list[str]:
    return [*compose_command(), "-f", str(COMPOSE_FILE), "-p", PROJECT, *args]


def _check_generated() -> None:
    """The Compose Prometheus mounts a generated file: refuse to start it stale."""
    current = prometheus_config.COMPOSE_CONFIG.read_text() if prometheus_config.COMPOSE_CONFIG.exists() else ""
    if current != prometheus_config.render_compose():
        raise StackError(
            f"{prometheus_config.COMPOSE_CONFIG.name} is stale: run `python -m servescope.prometheus.prometheus_config --write`"
        )


def client_host(env: dict[str, str]) -> str:
    bind = env.get("SERVESCOPE_BIND", "127.0.0.1")
    return "127.0.0.1" if bind in ("0.0.0.0", "", "::") else bind


def up(compare: bool = True, ready_timeout: float | None = None) -> int:
    """Build and start the stack, wait for every service to be healthy, then run the reference experiment."""
    if not docker_available():
        raise StackError("no Docker engine answers: start Docker, or use `python -m servescope.stack up --mode native`")
    env = compose_env()
    profiles = active_profiles(env)
    if "grafana" in profiles and not env.get("GRAFANA_ADMIN_PASSWORD"):
        raise StackError(
            "GRAFANA_ADMIN_PASSWORD is not set: put GRAFANA_ADMIN_PASSWORD=<something> in .env (there is no "
            "default), or leave grafana out of COMPOSE_PROFILES"
        )
    _check_generated()
    asked = KnobTable.from_env()  # as asked, before any was lowered to this machine's cores
    lowered = [k for k in CPU_KNOBS if env[k] != asked.get(k, env[k])]
    if lowered:
        say(f"compose: {', '.join(lowered)} lowered to this machine's {env[lowered[0]]} cores (Docker refuses more)")
    workers = int(env.get("LOCUST_WORKERS") or 0)
    say(
        f"compose: profiles {','.join(profiles) or '(none)'}, {workers} Locust workers; building and starting "
        "(the first build takes a while: vLLM-CPU, the llama.cpp compile, the model conversion)"
    )
    code = subprocess.call(
        _compose(["up", "-d", "--build", "--scale", f"locust-worker={workers}"]), env=env, cwd=knobs.REPO_ROOT
    )
    if code != 0:
        explain_failures()
        raise StackError(f"`compose up` failed (exit {code}): see its output above")
    timeout = ready_timeout if ready_timeout is not None else float(env.get("VLLM_READY_TIMEOUT", "900"))
    wait_healthy(timeout)
    host = client_host(env)
    if "grafana" in profiles:
        say(f"grafana     http://{host}:{env['GRAFANA_PORT']}  (admin / GRAFANA_ADMIN_PASSWORD)")
    say(f"prometheus  http://{host}:{env['PROMETHEUS_PORT']}")
    say(f"locust      http://{host}:{env['LOCUST_PORT']}")
    say(drift_line(env, host))
    if not compare:
        return 0
    return main_job(env)


def drift_line(env: dict[str, str], host: str) -> str:
    """Whether the engines' pages still carry what the exporter, rules and dashboards read (exporter/check.py), on
    the ports Compose published: one line, never a stop, as the native stack prints it."""
    from exporter import check as drift

    ports = {n: env.get(kinds.kind(n).port_env, "") for n in engines_in(env)}  # env holds every knob
    return drift.one_line([f"{n}=http://{host}:{port}" for n, port in ports.items()], KnobTable(env))


def results_dir(env: dict[str, str]) -> Path:
    results = Path(os.path.expanduser(env.get("SERVESCOPE_RESULTS") or "results"))
    return results if results.is_absolute() else knobs.REPO_ROOT / results


def main_job(env: dict[str, str], run_id: str | None = None) -> int:
    """The reference experiment inside locust-master, its run folder copied to SERVESCOPE_RESULTS, then the table."""
    engines = engines_in(env)
    if not engines:
        say("compose: no engine profile runs (COMPOSE_PROFILES): no comparison")
        return 0
    run_id = run_id or new_run_id()
    engine_args = [arg for engine in engines for arg in ("--engine", f"{engine}={LOADGEN_URLS[engine]}")]
    # The web UI's Locust holds the client /metrics port in that container: this run exposes none.
    cmd = ["python", "-m", "loadgen", "compare", *engine_args, "--results", "/results", "--run-id", run_id]
    cmd += ["--metrics-port", "0"]
    say(f"compose: the sequential-vs-burst comparison inside locust-master: {' '.join(cmd[3:])}")
    code = subprocess.call(_compose(["exec", "-T", "locust-master", *cmd]), env=env, cwd=knobs.REPO_ROOT)
    try:
        folder = copy_run_folder(run_id, results_dir(env))
    except StackError as exc:
        say(f"compose: {exc}")
        return code or 1
    say(f"run folder: {folder}")
    say(f"(copied from {MASTER_CONTAINER}:/results/{run_id})")
    if code != 0:
        say(f"comparison failed (exit {code}): the services stay up (`make status`, `make down`)")
        return code
    # The comparison printed the reference page's table itself (the report's: servescope.report.table); the report's summary
    # ends it.
    summary.report_and_summary(folder, f"http://127.0.0.1:{env.get('PROMETHEUS_PORT', '')}")  # env holds every knob
    say(f"`make report RUN={folder}` writes the report again (Prometheus on the published port)")
    return 0


def copy_run_folder(run_id: str, results: Path) -> Path:
    """/results/<run_id> out of the master's volume into the host's results folder (what `make report` reads)."""
    import docker

    client = docker.from_env(timeout=60)
    try:
        stream, _ = client.containers.get(MASTER_CONTAINER).get_archive(f"/results/{run_id}")
        archive = io.BytesIO(b"".join(stream))
    except docker.errors.DockerException as exc:
        raise StackError(f"run folder /results/{run_id} not copied out of {MASTER_CONTAINER}: {exc}") from None
    finally:
        client.close()
    results.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=archive) as tar:
        tar.extractall(results, filter="data")
    return results / run_id


def down() -> int:
    """Stop and remove every container and the network of the project, whatever profiles ran (named volumes
    stay: models, TSDB, Grafana state, results)."""
    env = compose_env()
    profiles = [arg for profile in PROFILES for arg in ("--profile", profile)]
    return subprocess.call(_compose([*profiles, "down", "--remove-orphans"]), env=env, cwd=knobs.REPO_ROOT)


# ---------------------------------------------------------------- health and the resource budget


def _project_containers(client) -> list:
    return client.containers.list(all=True, filters={"label": f"com.docker.compose.project={PROJECT}"})


def _service(container) -> str:
    return container.labels.get("com.docker.compose.service", container.name)


def _health(container) -> str:
    """healthy/unhealthy/starting where a healthcheck exists, else running, or `exited (CODE)` for one-shot steps."""
    state = container.attrs.get("State", {})
    if container.attrs.get("RestartCount", 0) >= CRASH_LOOP_RESTARTS:
        return "crash loop"
    health = state.get("Health", {}).get("Status")
    if health:
        return health
    status = state.get("Status", "unknown")
    return f"exited ({state.get('ExitCode', '?')})" if status == "exited" else status


# A service that died this many times since `up` is in a crash loop (restart: unless-stopped hides it as
# "starting"): say so now rather than at VLLM_READY_TIMEOUT.
CRASH_LOOP_RESTARTS = 3


def _failed(health: str) -> bool:
    return health in ("unhealthy", "dead", "crash loop") or health.startswith("exited (") and health != "exited (0)"


def explain_failures(client=None, log_lines: int = 15) -> None:
    """Each unhealthy or failed container's last health-check output and the tail of its log: the
    container is gone after `make down`, and CI keeps only what was printed."""
    import docker

    own = client is None
    try:
        client = client or docker.from_env(timeout=10)
        for container in _project_containers(client):
            container.reload()
            health = _health(container)
            restarts = container.attrs.get("RestartCount", 0)
            if not _failed(health) and not restarts:
                continue
            if restarts:
                health = f"{health}, restarted {restarts} times"
            checks = container.attrs.get("State", {}).get("Health", {}).get("Log") or []
            if checks:
                last = checks[-1]
                output = " ".join(str(last.get("Output", "")).split())[:400]
                say(f"compose: {_service(container)} {health}; last check exit {last.get('ExitCode')}: {output}")
            else:
                say(f"compose: {_service(container)} {health}")
            tail = container.logs(tail=log_lines).decode("utf-8", "replace").rstrip()
            for line in tail.splitlines():
                say(f"  {_service(container)} | {line}")
    except docker.errors.DockerException as exc:
        say(f"compose: could not read the failed containers' state: {exc}")
    finally:
        if own and client is not None:
            client.close()


def wait_healthy(timeout: float, poll: float = 5.0) -> None:
    """Poll the project's containers until every one with a healthcheck is healthy; progress every ~poll s."""
    import docker

    client = docker.from_env(timeout=10)
    started = time.monotonic()
    try:
        while True:
            containers = _project_containers(client)
            states = {}
            for container in containers:
                container.reload()
                states[_service(container)] = _health(container)
            failed = {s: h for s, h in states.items() if _failed(h)}
            if failed:
                explain_failures(client)
                raise StackError(f"unhealthy: {', '.join(sorted(failed))}: see `docker compose logs <service>`")
            waiting = {s: h for s, h in states.items() if h in ("starting", "created", "restarting")}
            if states and not waiting:
                say(f"compose: {len(states)} containers up and healthy ({elapsed(time.monotonic() - started)})")
                return
            if time.monotonic() - started > timeout:
                raise StackError(f"not healthy after {elapsed(timeout)}: {', '.join(sorted(waiting))}")
            say(f"… waiting for {', '.join(sorted(waiting)) or 'containers'} ({elapsed(time.monotonic() - started)})")
            time.sleep(poll)
    finally:
        client.close()


@dataclass(frozen=True)
class Budget:
    """One engine container's use against its limit: the reference page's `docker stats` line."""

    service: str
    cpu_percent: float  # of one core, as `docker stats` prints it
    cpu_limit_cores: float | None  # None when unlimited
    memory_bytes: int
    memory_limit_bytes: int

    @property
    def memory_percent(self) -> float:
        return 100.0 * self.memory_bytes / self.memory_limit_bytes if self.memory_limit_bytes else 0.0


def cpu_percent(stats: dict) -> float:
    """`docker stats`' CPU %: container CPU time delta over system CPU time delta, times online CPUs."""
    cpu, pre = stats.get("cpu_stats", {}), stats.get("precpu_stats", {})
    cpu_delta = cpu.get("cpu_usage", {}).get("total_usage", 0) - pre.get("cpu_usage", {}).get("total_usage", 0)
    system_delta = cpu.get("system_cpu_usage", 0) - pre.get("system_cpu_usage", 0)
    online = cpu.get("online_cpus") or len(cpu.get("cpu_usage", {}).get("percpu_usage") or []) or 1
    if cpu_delta <= 0 or system_delta <= 0:
        return 0.0
    return cpu_delta / system_delta * online * 100.0


def memory_usage(stats: dict) -> tuple[int, int]:
    """(used, limit) bytes as `docker stats` shows them: usage minus the page cache it can drop."""
    memory = stats.get("memory_stats", {})
    usage = memory.get("usage", 0)
    detail = memory.get("stats", {})
    # cgroup v2 reports inactive_file, v1 total_inactive_file (older CLIs subtracted cache).
    cache = detail.get("inactive_file", detail.get("total_inactive_file", 0))
    return max(usage - cache, 0), memory.get("limit", 0)


def budget_of(service: str, stats: dict, nano_cpus: int) -> Budget:
    used, limit = memory_usage(stats)
    return Budget(service, cpu_percent(stats), nano_cpus / 1e9 if nano_cpus else None, used, limit)


def format_budget(rows: Iterable[Budget]) -> str:
    gib = float(1 << 30)
    lines = [f"{'ENGINE':<10} {'CPU %':>8} {'CPU LIMIT':>10} {'MEM USAGE / LIMIT':>22} {'MEM %':>7}"]
    for row in rows:
        cpu_limit = f"{row.cpu_limit_cores:g} cores" if row.cpu_limit_cores else "none"
        memory = f"{row.memory_bytes / gib:.3f}GiB / {row.memory_limit_bytes / gib:.3g}GiB"
        lines.append(
            f"{row.service:<10} {row.cpu_percent:>7.2f}% {cpu_limit:>10} {memory:>22} {row.memory_percent:>6.2f}%"
        )
    return "\n".join(lines)


def engine_budgets(client) -> list[Budget]:
    rows = []
    for container in _project_containers(client):
        service = _service(container)
        if service not in ENGINE_SERVICES or container.status != "running":
            continue
        stats = container.stats(stream=False)
        rows.append(budget_of(service, stats, container.attrs.get("HostConfig", {}).get("NanoCpus", 0) or 0))
    return rows


def status() -> int:
    """`compose ps`, then each engine's CPU and memory against its limit (the reference page's `docker stats`)."""
    if not docker_available():
        raise StackError("no Docker engine answers: nothing to show in compose mode (try `--mode native`)")
    env = compose_env()
    env["GRAFANA_ADMIN_PASSWORD"] = env.get("GRAFANA_ADMIN_PASSWORD") or "unused-by-status"
    code = subprocess.call(_compose(["ps"]), env=env, cwd=knobs.REPO_ROOT)
    import docker

    client = docker.from_env(timeout=10)
    try:
        rows = engine_budgets(client)
    finally:
        client.close()
    if rows:
        print()
        print(format_budget(rows))
    else:
        print("no engine container is running")
    return code
