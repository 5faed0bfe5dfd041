"""Resource budget: each engine's CPU and memory against its limit, from the process table (native) or docker stats (Compose).

Exposition produced for a native vLLM (no cgroup limit: the machine's cores and memory) and a container::

    servescope_engine_cpu_seconds_total{engine="vllm",instance="vllm",source="process"} 812.4
    servescope_engine_resident_memory_bytes{engine="vllm",instance="vllm",source="process"} 2.1e+09
    servescope_engine_cpu_limit_cores{engine="vllm",instance="vllm",source="process"} 2.0
    servescope_engine_memory_limit_bytes{engine="vllm",instance="vllm",source="process"} 2.5e+10
    servescope_engine_cpu_seconds_total{engine="ollama",instance="ollama",source="container"} 95.1
    servescope_engine_memory_limit_bytes{engine="ollama",instance="ollama",source="container"} 5.0e+09

A native engine's memory is the PSS of its process tree (servescope.host.process_memory: shared pages
counted once). Read on every scrape (never from a timer). A process that is not running (no pid file, a pid
that is gone or was reused) or a container Docker cannot show has NO series for that scrape,
and one log line when that starts, never an error for the other engines.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from servescope.contracts import series
from servescope.host.process_memory import process_memory

log = logging.getLogger("exporter")

LABELS = (*series.ENGINE_LABELS, series.SOURCE)
# cgroup v1 writes "no limit" as the largest page-aligned 63-bit number; anything this big is no limit.
UNLIMITED_BYTES = 1 << 62
# A plain pid file written before its process started is not that process's (the pid was reused).
PIDFILE_SLACK_S = 1.0

HELP = {
    series.ENGINE_CPU_SECONDS: (
        "CPU seconds (user + system) used by the engine. Native: the process in its pid file and all its "
        "children (vLLM's engine core is one), from the process table; container: docker stats "
        "cpu_stats.cpu_usage.total_usage."
    ),
    series.ENGINE_RESIDENT_BYTES: (
        "Memory in use by the engine. Native: proportional set size (PSS) summed over the process and its "
        "children, so pages they share count once (servescope.host.process_memory; RSS for a process whose PSS "
        "cannot be read); container: docker stats memory usage minus inactive page cache, as `docker stats` "
        "shows it."
    ),
    series.ENGINE_CPU_LIMIT: (
        "CPU cores the engine may use. Native: its cgroup's CPU quota (cpu.max, or cfs_quota_us/cfs_period_us "
        "on cgroup v1) when it has one, else ALL of the machine's cores (no limit); container: NanoCpus or "
        "CpuQuota/CpuPeriod, else the host's online CPUs."
    ),
    series.ENGINE_MEMORY_LIMIT: (
        "Memory the engine may use. Native: its cgroup's memory.max (memory.limit_in_bytes on cgroup v1) when "
        "set, else ALL of the machine's memory (no limit); container: docker stats memory_stats.limit."
    ),
}


@dataclass(frozen=True)
class WatchedProcess:
    """A native engine process, found through the pid file its launcher wrote."""

    kind: str
    name: str  # the `instance` label
    pidfile: Path


@dataclass(frozen=True)
class WatchedContainer:
    """An engine container, found by name or id through the Docker engine."""

    kind: str
    name: str
    container: str


@dataclass(frozen=True)
class Budget:
    """One engine's use against its limits at one instant."""

    cpu_seconds: float
    resident_bytes: float
    cpu_limit_cores: float
    memory_limit_bytes: float
    limited_by: str  # "cgroup", "machine" or "container": where the limits came from


class NotRunning(Exception):
    """The watched process or container cannot be read now; str() is the log line's reason."""


# --- native processes ---


def read_pidfile(path: Path) -> tuple[int, float | None]:
    """(pid, expected create time or None) from a plain pid file or the stack's JSON record (`pid`, `create_time`)."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        raise NotRunning(f"no pid file {path}") from None
    except OSError as exc:
        raise NotRunning(f"cannot read pid file {path}: {exc.strerror or exc}") from None
    if text.startswith("{"):
        try:
            record = json.loads(text)
            pid, created = record.get("pid"), record.get("create_time")
        except (ValueError, AttributeError):
            raise NotRunning(f"pid file {path} is not a pid or a JSON record") from None
    else:
        pid, created = text.split()[0] if text else None, None
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        raise NotRunning(f"pid file {path} holds no pid") from None
    if pid < 1:
        raise NotRunning(f"pid file {path} holds no pid")
    return pid, (float(created) if isinstance(created, (int, float)) else None)


def process_from_pidfile(path: Path) -> psutil.Process:
    """The live process a pid file names; NotRunning when it is gone, a zombie, or its pid was reused."""
    pid, created = read_pidfile(path)
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            raise NotRunning(f"pid {pid} from {path} has exited")
        started = proc.create_time()
    except psutil.NoSuchProcess:
        raise NotRunning(f"pid {pid} from {path} is not running (stale pid file)") from None
    except psutil.AccessDenied:
        raise NotRunning(f"pid {pid} from {path}: access denied") from None
    if created is not None:
        if abs(started - created) > PIDFILE_SLACK_S:
            raise NotRunning(f"pid {pid} from {path} is another process now (stale pid file)")
    else:
        try:
            written = path.stat().st_mtime
        except OSError:
            written = None
        if written is not None and started > written + PIDFILE_SLACK_S:
            raise NotRunning(f"pid {pid} from {path} started after the pid file was written (stale pid file)")
    return proc


def _usage(proc: psutil.Process) -> tuple[float, int]:
    members = [proc]
    try:
        members += proc.children(recursive=True)
    except psutil.NoSuchProcess:
        raise NotRunning(f"pid {proc.pid} exited") from None
    cpu, memory = 0.0, 0
    for index, member in enumerate(members):
        try:
            with member.oneshot():
                times = member.cpu_times()
                # children_* hold the CPU of children already reaped: a worker that exits keeps its
                # seconds in the sum, so the counter does not step back.
                cpu += times.user + times.system + times.children_user + times.children_system
                memory += process_memory(member)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            if index == 0:
                raise NotRunning(f"pid {proc.pid} exited") from None
            # A child that exited between the listing and the read: its time is in its parent's children_*.
        except psutil.AccessDenied:
            if index == 0:
                raise NotRunning(f"pid {proc.pid}: access denied") from None
    return cpu, memory


def machine_limits() -> tuple[float, float]:
    """(cores, memory bytes) of the whole machine: the limit of a process no cgroup limits."""
    return float(psutil.cpu_count() or 1), float(psutil.virtual_memory().total)


def _cgroup_paths(pid: int, proc_root: Path) -> tuple[str | None, dict[str, str]]:
    """(cgroup v2 path, {v1 controller: path}) from /proc/<pid>/cgroup."""
    unified, v1 = None, {}
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None, {}
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            unified = path
        else:
            for controller in controllers.split(","):
                v1[controller] = path
    return unified, v1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _ancestors(base: Path, cgroup: str) -> Iterator[Path]:
    """The cgroup's directory and every parent up to the mount: a parent's limit binds its children too."""
    parts = [p for p in cgroup.strip("/").split("/") if p and p != ".."]
    for depth in range(len(parts), -1, -1):
        yield base.joinpath(*parts[:depth])


def cgroup_limits(
    pid: int, *, proc_root: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")
) -> tuple[float | None, float | None]:
    """(CPU cores, memory bytes) the process's cgroups allow, None where no cgroup sets a limit (v2, else v1)."""
    unified, v1 = _cgroup_paths(pid, proc_root)
    cores: float | None = None
    memory: float | None = None

    def tighter(current: float | None, value: float | None) -> float | None:
        if value is None:
            return current
        return value if current is None else min(current, value)

    if unified is not None and (cgroup_root / "cgroup.controllers").exists():
        for directory in _ancestors(cgroup_root, unified):
            memory_max = _read(directory / "memory.max")
            if memory_max and memory_max != "max" and memory_max.isdigit():
                memory = tighter(memory, float(memory_max))
            cpu_max = _read(directory / "cpu.max")
            if cpu_max:
                quota, _, period = cpu_max.partition(" ")
                if quota != "max" and quota.isdigit() and period.isdigit() and int(period) > 0:
                    cores = tighter(cores, int(quota) / int(period))
        return cores, memory
    if "memory" in v1:
        for directory in _ancestors(cgroup_root / "memory", v1["memory"]):
            limit = _read(directory / "memory.limit_in_bytes")
            if limit and limit.isdigit() and int(limit) < UNLIMITED_BYTES:
                memory = tighter(memory, float(limit))
    cpu_path = v1.get("cpu")
    if cpu_path is not None:
        for directory in _ancestors(cgroup_root / "cpu", cpu_path):
            quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
            if quota and period and quota.isdigit() and period.isdigit() and int(period) > 0:
                cores = tighter(cores, int(quota) / int(period))  # -1 (no quota) fails isdigit
    return cores, memory


def process_budget(
    proc: psutil.Process,
    *,
    proc_root: Path = Path("/proc"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    machine: Callable[[], tuple[float, float]] = machine_limits,
) -> Budget:
    cpu, memory_used = _usage(proc)
    cores, memory = machine()
    cgroup_cores, cgroup_memory = cgroup_limits(proc.pid, proc_root=proc_root, cgroup_root=cgroup_root)
    limited = cgroup_cores is not None and cgroup_cores < cores or cgroup_memory is not None and cgroup_memory < memory
    # A cgroup limit above the machine's size limits nothing: report what can actually be used.
    return Budget(
        cpu,
        float(memory_used),
        min(cores, cgroup_cores or cores),
        min(memory, cgroup_memory or memory),
        "cgroup" if limited else "machine",
    )


# --- containers (docker stats) ---


def container_budget(stats: dict, host_config: dict) -> Budget:
    """Docker Engine API `GET /containers/{id}/stats` + the container's HostConfig -> Budget.

    CPU: cpu_stats.cpu_usage.total_usage (nanoseconds); memory: usage - inactive_file (cgroup v2) or
    - total_inactive_file / cache (v1), as the docker CLI computes it; limits: memory_stats.limit and
    NanoCpus, else CpuQuota/CpuPeriod, else online CPUs.
    """
    cpu_stats = stats.get("cpu_stats") or {}
    usage = cpu_stats.get("cpu_usage") or {}
    if "total_usage" not in usage:
        raise NotRunning("docker stats has no cpu_stats.cpu_usage.total_usage (container not running?)")
    memory = stats.get("memory_stats") or {}
    if "usage" not in memory:
        raise NotRunning("docker stats has no memory_stats.usage (container not running?)")
    detail = memory.get("stats") or {}
    if "inactive_file" in detail:
        cache = detail["inactive_file"]
    else:
        cache = detail.get("total_inactive_file", detail.get("cache", 0))
    used = max(float(memory["usage"]) - float(cache), 0.0)
    online = cpu_stats.get("online_cpus") or len(usage.get("percpu_usage") or []) or psutil.cpu_count() or 1
    nano = host_config.get("NanoCpus") or 0
    quota, period = host_config.get("CpuQuota") or 0, host_config.get("CpuPeriod") or 0
    if nano > 0:
        cores = nano / 1e9
    elif quota > 0:
        cores = quota / (period or 100_000)  # Docker's default CFS period is 100 ms
    else:
        cores = float(online)
    return Budget(
        float(usage["total_usage"]) / 1e9, used, min(cores, float(online)), float(memory.get("limit") or 0), "container"
    )


class DockerStats:
    """Reads one container's stats and HostConfig through the docker SDK (DOCKER_HOST or the default socket)."""

    def __init__(self, timeout: float = 3.0, client_factory: Callable | None = None):
        self.timeout = timeout
        self.client_factory = client_factory
        self._client = None

    def _docker(self):
        if self._client is None:
            if self.client_factory is not None:
                self._client = self.client_factory()
            else:
                import docker

                self._client = docker.from_env(timeout=self.timeout)
        return self._client

    def budget(self, container: str) -> Budget:
        try:
            found = self._docker().containers.get(container)
            # one_shot: no second sample for precpu_stats; the counter is all Prometheus needs, and it
            # answers at once instead of after Docker's 1 s sampling interval.
            stats = found.stats(stream=False, one_shot=True)
            host_config = found.attrs.get("HostConfig") or {}
        except Exception as exc:  # noqa: BLE001 -- no Docker, no such container, refused: all mean "not readable now"
            self.close()  # a new client next scrape: Docker may have come up meanwhile
            reason = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise NotRunning(f"docker cannot show container {container}: {reason}") from None
        return container_budget(stats, host_config)

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001
                pass
            self._client = None


# --- the collector ---


class ResourceCollector:
    """Custom collector over every watched process and container; `describe()` touches nothing."""

    def __init__(
        self,
        processes: Sequence[WatchedProcess] = (),
        containers: Sequence[WatchedContainer] = (),
        *,
        docker: DockerStats | None = None,
        timeout: float = 3.0,
        proc_root: Path = Path("/proc"),
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        machine: Callable[[], tuple[float, float]] = machine_limits,
    ):
        self.processes = list(processes)
        self.containers = list(containers)
        self.docker = docker or (DockerStats(timeout=timeout) if self.containers else None)
        self.proc_root, self.cgroup_root, self.machine = proc_root, cgroup_root, machine
        self._reasons: dict[tuple[str, str, str], str | None] = {}
        self._limited_by: dict[tuple[str, str, str], str] = {}

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(series.ENGINE_CPU_SECONDS.removesuffix("_total"), "", labels=LABELS)
        for name in (series.ENGINE_RESIDENT_BYTES, series.ENGINE_CPU_LIMIT, series.ENGINE_MEMORY_LIMIT):
            yield GaugeMetricFamily(name, "", labels=LABELS)

    def budgets(self) -> Iterator[tuple[str, str, str, Budget]]:
        """(kind, instance, source, Budget) for each watched engine readable right now."""
        for watched in self.processes:
            key = (watched.kind, watched.name, "process")
            try:
                proc = process_from_pidfile(watched.pidfile)
                budget = process_budget(
                    proc, proc_root=self.proc_root, cgroup_root=self.cgroup_root, machine=self.machine
                )
            except NotRunning as exc:
                self._absent(key, str(exc))
                continue
            self._present(key, budget)
            yield (*key, budget)
        for container in self.containers:
            key = (container.kind, container.name, "container")
            try:
                budget = self.docker.budget(container.container)
            except NotRunning as exc:
                self._absent(key, str(exc))
                continue
            self._present(key, budget)
            yield (*key, budget)

    def collect(self) -> Iterator[Metric]:
        cpu = CounterMetricFamily(
            series.ENGINE_CPU_SECONDS.removesuffix("_total"), HELP[series.ENGINE_CPU_SECONDS], labels=LABELS
        )
        resident = GaugeMetricFamily(series.ENGINE_RESIDENT_BYTES, HELP[series.ENGINE_RESIDENT_BYTES], labels=LABELS)
        cpu_limit = GaugeMetricFamily(series.ENGINE_CPU_LIMIT, HELP[series.ENGINE_CPU_LIMIT], labels=LABELS)
        memory_limit = GaugeMetricFamily(series.ENGINE_MEMORY_LIMIT, HELP[series.ENGINE_MEMORY_LIMIT], labels=LABELS)
        for kind, name, source, budget in self.budgets():
            labels = [kind, name, source]
            cpu.add_metric(labels, budget.cpu_seconds)
            resident.add_metric(labels, budget.resident_bytes)
            cpu_limit.add_metric(labels, budget.cpu_limit_cores)
            memory_limit.add_metric(labels, budget.memory_limit_bytes)
        yield from (cpu, resident, cpu_limit, memory_limit)

    def close(self) -> None:
        if self.docker is not None:
            self.docker.close()

    # one log line when a watched engine appears, disappears or changes reason, never one per scrape
    def _absent(self, key: tuple[str, str, str], reason: str) -> None:
        if self._reasons.get(key, "") != reason:
            log.warning("%s %s %s: no resource series: %s", key[0], key[1], key[2], reason)
        self._reasons[key] = reason
        self._limited_by.pop(key, None)

    def _present(self, key: tuple[str, str, str], budget: Budget) -> None:
        if self._reasons.get(key, "") is not None or self._limited_by.get(key) != budget.limited_by:
            where = {
                "machine": "no cgroup limit: limits are the machine's",
                "cgroup": "limits are its cgroup's",
                "container": "limits are the container's",
            }[budget.limited_by]
            log.info(
                "%s %s %s: resource series on; %s %.3g cores and %.3g GiB",
                key[0],
                key[1],
                key[2],
                where,
                budget.cpu_limit_cores,
                budget.memory_limit_bytes / (1 << 30),
            )
        self._reasons[key] = None
        self._limited_by[key] = budget.limited_by
