"""Host noise per load phase: the CPU every process other than the engine under test and the load generator used, by program; CPU steal; load average; the engine's own CPU.

Two reads of the kernel's process table (/proc/<pid>/stat) and CPU counters (/proc/stat), one
just before a phase's first request and one just after its last, never during it (a sweep of a
few hundred processes blocks the load generator's event loop for several milliseconds). Each
process is then put in one group:

  engine      the engine under test and every process under it (vLLM's engine core is a child)
  loadgen     this load generator and its children: the measurement itself, left out
  observers   servescope's own exporter, Prometheus and web UI (the native stack's pid records, and
              LOADGEN_OBSERVER_PIDS: the exporter `python -m loadgen quick` starts for its knee):
              shown, but they run alike in every phase, so they never flag one (their cost is
              `make bench`'s observer effect)
  other engines   the other engines of this run (by the port they listen on) and the ones the
              native stack started (their pid records), named by engine
  processes   everything else, by program name (`python -m pytest`, `cc1plus`, `kworker`)
  unattributed  the machine's busy CPU time no process seen at the end accounts for: processes that
              ended inside the phase (a short compile job) and the kernel's interrupts

A process counts its own CPU only (utime + stime), never the children it reaped (cutime): a
container runtime that reaps a container's init would otherwise be charged that container's
whole life. Shares are in cores: CPU seconds / the window's seconds.
The rule that flags a phase (thresholds.NoiseRule) is applied by `flags` below, the one place
the load generator and the report both use.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from servescope.contracts import knobs
from servescope.contracts.thresholds import NoiseRule
from servescope.host import listening, pidrecords
from servescope.text import numbers, words

PROC = Path("/proc")
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
TOP_GROUPS = 6  # groups kept per phase record, largest first; the rest are summed into "others"
INTERPRETERS = ("python", "node", "java", "ruby", "perl", "bash", "sh")
KERNEL_THREADS = "kernel threads"
UNATTRIBUTED = "exited processes and interrupts"
ENGINE, LOADGEN, OBSERVER, OTHER_ENGINE, PROCESS = "engine", "loadgen", "observer", "other engine", "process"


@dataclass(frozen=True)
class Proc:
    """One process of the kernel's process table: its pid, parent, program name and CPU seconds so far."""

    pid: int
    ppid: int
    comm: str
    cpu_s: float  # utime + stime: its own CPU seconds (all threads)


@dataclass
class Snapshot:
    """One read of the process table and the machine's CPU counters."""

    t: float  # epoch seconds (the clock of the run folder's records)
    mono: float
    procs: dict[tuple[int, int], Proc]  # (pid, start time in ticks since boot): a reused pid is another key
    busy_s: float | None  # the machine's non-idle CPU seconds since boot (all cores), steal excluded
    steal_s: float | None  # None where the kernel does not report steal
    total_s: float | None
    load1: float | None
    # The load generator's own threads: seconds they were ready to run but waited for a core (the kernel's
    # schedstat run delay). CPU used plus this wait near the whole window means the client could not keep up.
    self_wait_s: float | None = None


# A read that fails for want of a file descriptor or memory says nothing of the process read: the whole reading fails
# (Unread), where a process that exited between the listing and the read is simply left out.
EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


class Unread(OSError):
    """The host could not be read (no file descriptor to spare, /proc unreadable): a gap in a phase's noise."""


def _exhausted(exc: OSError) -> bool:
    return exc.errno in EXHAUSTED


def read_procs(root: Path = PROC) -> dict[tuple[int, int], Proc]:
    procs: dict[tuple[int, int], Proc] = {}
    try:
        names = os.listdir(root)
    except OSError as exc:
        raise Unread(exc.errno, f"cannot list {root}: {exc.strerror or exc}") from None
    base = os.fspath(root)  # a path joined as text: per process, pathlib's joins cost more than the read
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"{base}/{name}/stat", "rb") as fh:
                data = fh.read()
        except OSError as exc:
            if _exhausted(exc):
                raise Unread(exc.errno, f"cannot read {base}/{name}/stat: {exc.strerror or exc}") from None
            continue  # exited between the listing and the read
        close = data.rfind(b")")
        fields = data[close + 2 :].split()
        if close < 0 or len(fields) < 20:
            continue
        comm = data[data.find(b"(") + 1 : close].decode("utf-8", "replace")
        # Fields after "(comm)": state(0) ppid(1) ... utime(11) stime(12) ... starttime(19)
        key = (int(name), int(fields[19]))
        procs[key] = Proc(int(name), int(fields[1]), comm, (int(fields[11]) + int(fields[12])) / CLK_TCK)
    return procs


def read_cpu(root: Path = PROC) -> tuple[float | None, float | None, float | None]:
    """(busy, steal, total) CPU seconds of the whole machine since boot, from /proc/stat's `cpu` line."""
    try:
        with open(root / "stat", encoding="ascii") as fh:
            line = fh.readline().split()
    except OSError:
        return None, None, None
    if not line or line[0] != "cpu" or len(line) < 5:
        return None, None, None
    # user nice system idle iowait irq softirq steal guest guest_nice (guest time is inside user already)
    v = [int(x) / CLK_TCK for x in line[1:11]]
    v += [0.0] * (10 - len(v))
    busy = v[0] + v[1] + v[2] + v[5] + v[6]
    steal = v[7] if len(line) > 8 else None
    return busy, steal, busy + v[3] + v[4] + (steal or 0.0)


def run_delay_s(pid: int, root: Path = PROC) -> float | None:
    """Seconds the threads of `pid` spent runnable but waiting for a core, since each began (/proc/PID/task/*/schedstat,
    its second field, in ns); None where the kernel keeps no schedstat."""
    total, seen = 0, False
    try:
        tasks = os.listdir(root / str(pid) / "task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(root / str(pid) / "task" / tid / "schedstat", "rb") as fh:
                fields = fh.read().split()
        except OSError as exc:
            if _exhausted(exc):
                return None  # a partial sum would be too small: not measured
            continue  # a thread that ended between the listing and the read
        if len(fields) >= 2 and fields[1].isdigit():
            total += int(fields[1])
            seen = True
    return total / 1e9 if seen else None


def allowed_cores(pid: int, root: Path = PROC) -> float | None:
    """The cores process `pid` may use: its CPU affinity, capped by its cgroup's cpu.max quota (cgroup v2) when set."""
    try:
        cores: float = float(len(os.sched_getaffinity(pid)))
    except OSError:
        return None
    try:
        line = (root / str(pid) / "cgroup").read_text().splitlines()
        path = next((x.split("::", 1)[1] for x in line if x.startswith("0::")), None)
        if path is not None:
            quota, period = Path("/sys/fs/cgroup", path.lstrip("/"), "cpu.max").read_text().split()[:2]
            if quota != "max" and float(period) > 0:
                cores = min(cores, float(quota) / float(period))
    except (OSError, ValueError, StopIteration):
        pass  # no cgroup v2 quota readable: the affinity is the bound
    return cores


def take(root: Path = PROC) -> Snapshot:
    busy, steal, total = read_cpu(root)
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = None
    return Snapshot(
        time.time(), time.monotonic(), read_procs(root), busy, steal, total, load1, run_delay_s(os.getpid(), root)
    )


# ---------------------------------------------------------------- who is who


@dataclass
class Roles:
    """Root pids of each known party; every descendant of a root belongs to it."""

    engine: set[int] = field(default_factory=set)
    engine_how: str = ""  # how the engine's process was found, or why it was not
    loadgen: set[int] = field(default_factory=set)
    others: dict[str, set[int]] = field(default_factory=dict)  # other engines by name
    observers: dict[str, set[int]] = field(default_factory=dict)


# Each scan of who listens walks every process's open files (0.002 CPU-s on a quiet 2-core VM; 0.009 through psutil,
# most of it in /proc/net/tcp), and a run asks for each engine's port a moment apart: as it sets the CPU priority, as
# its noise keeper locates the engine and its neighbours. A port the last scan found listening, within this long, is
# answered from it; any other port is a scan.
LISTENERS_FRESH_S = 1.0
_last_scan: tuple[float, dict[int, set[int]]] = (-LISTENERS_FRESH_S, {})


def listeners(port: int) -> set[int]:
    """Pids with a TCP socket listening on `port` on this host (empty when unknown or not permitted), as the last scan
    found them if it found the port listening less than LISTENERS_FRESH_S ago."""
    global _last_scan
    at, by_port = _last_scan
    if port in by_port and time.monotonic() - at <= LISTENERS_FRESH_S:
        return set(by_port[port])
    by_port = listening.listening()
    _last_scan = (time.monotonic(), by_port)
    return set(by_port.get(port, ()))


def _port(url: str) -> int | None:
    try:
        parts = urlsplit(url)
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


def _local(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "127.0.0.1", "::1", "0.0.0.0", "") or host.startswith("127.")


def on_this_host(url: str) -> bool:
    """The URL names this machine (localhost, a loopback address): what runs there shares its counters."""
    return _local(url)


def same_endpoint(a: str, b: str) -> bool:
    """Two URLs reach the same listener on this host: the same port, both local (or the same host)."""
    if _port(a) != _port(b):
        return False
    host_a, host_b = urlsplit(a).hostname, urlsplit(b).hostname
    return (_local(a) and _local(b)) or host_a == host_b


def roles_for(
    instance: str,
    kind: str,
    url: str,
    others: Iterable[tuple[str, str]] = (),
    records: dict[str, pidrecords.LiveRecord] | None = None,
) -> Roles:
    """Who is who while `instance` (at `url`) is measured; `others` are the run's other (instance, url) engines.

    The engine under test is the native stack's record at that URL, else what listens on its port
    (when that is the exporter's Ollama proxy: the stack's record of the engine's kind).
    """
    records = pidrecords.live() if records is None else records
    roles = Roles(loadgen={os.getpid()})
    for rec in records.values():
        if rec.name in pidrecords.OBSERVERS:
            roles.observers[rec.name] = {rec.pid}
    for name, pid in extra_observers():
        roles.observers.setdefault(name, set()).add(pid)
    engine_records = {r.name: r for r in records.values() if r.is_engine}
    roles.engine, roles.engine_how = _locate(kind, url, engine_records, roles.observers)
    for name, rec in engine_records.items():
        if rec.pid not in roles.engine:
            roles.others[name] = {rec.pid}
    for other, other_url in others:
        if other == instance:
            continue
        pids, _ = _locate(other.split(":")[0], other_url, engine_records, roles.observers)
        pids -= roles.engine
        if pids and not any(pids & p for p in roles.others.values()):
            roles.others[other] = pids
    return roles


def extra_observers() -> list[tuple[str, int]]:
    """LOADGEN_OBSERVER_PIDS (NAME=PID,...): observers the stack's pid records do not name, such as the exporter
    `python -m loadgen quick` starts for one measurement; shown like the stack's, never flagging a phase."""
    out = []
    for part in knobs.get("LOADGEN_OBSERVER_PIDS", "").split(","):
        name, _, pid = part.strip().rpartition("=")
        if pid.isdigit():
            out.append((name or "observer", int(pid)))
    return out


def _locate(
    kind: str, url: str, records: dict[str, pidrecords.LiveRecord], observers: dict[str, set[int]]
) -> tuple[set[int], str]:
    port = _port(url)
    for rec in records.values():
        if rec.url and same_endpoint(rec.url, url):
            return {rec.pid}, f"pid {rec.pid} from the native stack's {rec.name} record"
    if not _local(url):
        return set(), f"not measured: {url} is not on this host"
    pids = listeners(port) if port else set()
    if pids & set().union(*observers.values()) and kind in records:
        rec = records[kind]  # the exporter's Ollama proxy listens there; the engine behind it is recorded
        return {rec.pid}, f"pid {rec.pid} from the native stack's {rec.name} record (behind the exporter's proxy)"
    if pids and pids <= set().union(*observers.values()):
        # An exporter's proxy (quick's own) with no record of the engine behind it: the proxy is not the engine.
        return set(), f"not measured: port {port} is an exporter's proxy, and no pid record names the engine behind it"
    if pids:
        return pids, f"pid {', '.join(map(str, sorted(pids)))} listening on port {port}"
    return set(), (
        f"not measured: nothing visible from here listens on port {port} (the load generator runs in a container, "
        f"or the engine in another namespace)"
    )


# ---------------------------------------------------------------- one phase's noise


def _program(proc: Proc, root: Path = PROC) -> str:
    """A process's program name: its command, and for interpreters the module or script they run."""
    comm = proc.comm
    if comm.startswith("kworker"):
        return "kworker"
    base = comm.split("/")[0]
    if not any(base == i or base.startswith(i) for i in INTERPRETERS):
        return comm
    try:
        argv = (root / str(proc.pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return comm
    args = [a.decode("utf-8", "replace") for a in argv if a]
    for i, arg in enumerate(args[1:], start=1):
        if arg == "-m" and i + 1 < len(args):
            return f"{base} -m {args[i + 1]}"
        if arg == "-c":
            return f"{base} -c"
        if not arg.startswith("-"):
            return f"{base} {os.path.basename(arg)}"
    return base


def _owner(pid: int, parents: dict[int, int], roots: dict[int, tuple[str, str]]) -> tuple[str, str] | None:
    """(role, name) of the first known root on the way up from pid, or None."""
    seen = 0
    while pid and seen < 256:  # a bounded walk: the table is a snapshot, a loop would be a kernel bug
        if pid in roots:
            return roots[pid]
        pid = parents.get(pid, 0)
        seen += 1
    return None


def measure(begin: Snapshot, end: Snapshot, roles: Roles, root: Path = PROC) -> dict:
    """The noise between two snapshots, as a phase record carries it (PhaseRecord.noise)."""
    window = max(end.mono - begin.mono, 1e-9)
    roots: dict[int, tuple[str, str]] = {}
    for pid in roles.loadgen:
        roots[pid] = (LOADGEN, "load generator")
    for name, pids in roles.observers.items():
        roots.update({p: (OBSERVER, name) for p in pids})
    for name, pids in roles.others.items():
        roots.update({p: (OTHER_ENGINE, name) for p in pids})
    for pid in roles.engine:
        roots[pid] = (ENGINE, "engine under test")
    parents = {p.pid: p.ppid for p in begin.procs.values()}
    parents.update({p.pid: p.ppid for p in end.procs.values()})

    def group(proc: Proc) -> tuple[str, str]:
        owner = _owner(proc.pid, parents, roots)
        if owner is not None:
            return owner
        return PROCESS, KERNEL_THREADS if proc.pid == 2 or proc.ppid == 2 else _program(proc, root)

    seconds: dict[tuple[str, str], float] = {}
    for key, proc in end.procs.items():
        before = begin.procs.get(key)
        delta = proc.cpu_s - (before.cpu_s if before else 0.0)  # born inside the window: all of it
        if delta > 0:
            owner = group(proc)
            seconds[owner] = seconds.get(owner, 0.0) + delta
    by_role: dict[str, float] = {}
    for (role, _), s in seconds.items():
        by_role[role] = by_role.get(role, 0.0) + s
    busy = _delta(begin.busy_s, end.busy_s)
    unattributed = max(0.0, busy - sum(seconds.values())) if busy is not None else 0.0
    groups = [
        {"name": name, "kind": role, "cores": s / window}
        for (role, name), s in seconds.items()
        if role in (OTHER_ENGINE, PROCESS)
    ]
    if unattributed / window >= 0.01:
        groups.append({"name": UNATTRIBUTED, "kind": PROCESS, "cores": unattributed / window})
    groups.sort(key=lambda g: -g["cores"])
    foreign = sum(g["cores"] for g in groups)
    kept = groups[:TOP_GROUPS]
    rest = sum(g["cores"] for g in groups[TOP_GROUPS:])
    if rest > 0:
        kept.append({"name": f"{len(groups) - TOP_GROUPS} more", "kind": PROCESS, "cores": rest})
    steal, total = _delta(begin.steal_s, end.steal_s), _delta(begin.total_s, end.total_s)
    waited = _delta(begin.self_wait_s, end.self_wait_s)
    engine_allowed = [c for c in (allowed_cores(p, root) for p in sorted(roles.engine)) if c is not None]
    return {
        "window_s": window,
        "cores": os.cpu_count() or 1,
        "engine_found": bool(roles.engine),
        "engine_how": roles.engine_how,
        "engine_cores": by_role.get(ENGINE, 0.0) / window if roles.engine else None,
        "engine_allowed_cores": max(engine_allowed) if engine_allowed else None,
        "loadgen_cores": by_role.get(LOADGEN, 0.0) / window,
        # This process only (its workers are measured by their own): ready to run, no core to run on.
        "loadgen_wait_cores": waited / window if waited is not None else None,
        "loadgen_allowed_cores": allowed_cores(os.getpid(), root),
        "observer_cores": by_role.get(OBSERVER, 0.0) / window,
        "foreign_cores": foreign,
        "groups": kept,
        "steal_share": (steal / total) if steal is not None and total else None,
        "load1_start": begin.load1,
        "load1_end": end.load1,
    }


def other_engine_cores(noise: dict | None) -> float:
    """The cores the run's other engines used in a window (0 when none was seen)."""
    groups = (noise or {}).get("groups") or []
    return sum(g["cores"] for g in groups if isinstance(g, dict) and g.get("kind") == OTHER_ENGINE)


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else max(0.0, b - a)


class Watch:
    """One phase's window: `begin()` before its first request, `measure()` after its last. A reading that fails (the
    process is out of file descriptors: a local process holding connections to its ports) is a gap, never an end:
    measure() then gives None and `unread` says why."""

    def __init__(self, roles: Roles, root: Path = PROC):
        self.roles, self.root = roles, root
        self.start: Snapshot | None = None
        self.unread: str | None = None  # why the last window has no noise (None: it was read, or never begun)

    def _take(self) -> Snapshot | None:
        try:
            return take(self.root)
        except OSError as exc:
            self.unread = f"host noise not read: {exc.strerror or exc}"
            return None

    def begin(self) -> None:
        self.unread = None
        self.start = self._take()

    def measure(self) -> dict | None:
        if self.start is None:
            return None
        end = self._take()
        if end is None:
            return None
        try:
            return measure(self.start, end, self.roles, self.root)
        except OSError as exc:
            self.unread = f"host noise not read: {exc.strerror or exc}"
            return None


# ---------------------------------------------------------------- the rule and how it reads


def flags(noise: dict | None, instance: str, rule: NoiseRule | None = None) -> list[str]:
    """Why a phase of `instance` with this noise is not trusted (empty: it is); the rule is thresholds.NoiseRule."""
    if not isinstance(noise, dict):
        return []
    rule = rule or NoiseRule.current()
    out = []
    groups = [g for g in noise.get("groups") or [] if isinstance(g, dict) and isinstance(g.get("cores"), (int, float))]
    foreign = noise.get("foreign_cores")
    # Without the engine's own process the foreign share holds the engine itself: only steal is judged.
    if noise.get("engine_found"):
        # One program each; the sums ("N more", exited processes) count towards the total only.
        named = [g for g in groups if g.get("name") != UNATTRIBUTED and not str(g.get("name", "")).endswith(" more")]
        loud = [g for g in named if g["cores"] >= rule.group_cores]
        if loud:
            used = ", ".join(f"{numbers.cores(g['cores'])} used by {g['name']}" for g in loud)
            out.append(f"noisy: {used} while measuring {instance}")
        elif isinstance(foreign, (int, float)) and foreign >= rule.foreign_cores:
            top = ", ".join(f"{g['name']} {g['cores']:.2f}" for g in groups[:3])
            out.append(f"noisy: {numbers.cores(foreign)} used by other processes ({top}) while measuring {instance}")
    steal = noise.get("steal_share")
    if isinstance(steal, (int, float)) and steal >= rule.steal_share:
        out.append(f"noisy: the hypervisor stole {steal:.0%} of the CPU time while measuring {instance}")
    return out


# The most a phase is said to have been stretched by other programs: past this the engine had almost no CPU at all.
MAX_SLOWDOWN = 10.0


def slowdown_bound(noise: dict | None) -> float | None:
    """How much longer a phase could have taken because of the CPU other programs (and the hypervisor) took: 1.0 for
    none; None where the engine's own processes were not found (the foreign share then holds the engine itself).

    A model, stated in docs/trust.md: a CPU-bound engine allowed A cores, of which others took F, ran on A - F of them,
    so its phase took at most A / (A - F) times as long as on a quiet host (capped at MAX_SLOWDOWN). What both phases
    of a pair saw alike cancels in their ratio; what one side saw more shifts it by at most the ratio of the bounds."""
    if not isinstance(noise, dict) or not noise.get("engine_found"):
        return None
    cores = noise.get("cores")
    allowed = noise.get("engine_allowed_cores") or cores
    if not isinstance(allowed, (int, float)) or allowed <= 0:
        return None
    foreign = noise.get("foreign_cores")
    taken = foreign if isinstance(foreign, (int, float)) and foreign > 0 else 0.0
    steal = noise.get("steal_share")
    if isinstance(steal, (int, float)) and steal > 0 and isinstance(cores, (int, float)):
        taken += steal * cores
    left = allowed - min(taken, allowed)
    return min(MAX_SLOWDOWN, allowed / left) if left > allowed / MAX_SLOWDOWN else MAX_SLOWDOWN


def describe(noise: dict | None) -> str:
    """One line: the engine's own CPU, the others' (largest first), observers, steal, load average."""
    if not isinstance(noise, dict):
        return "host noise not recorded"
    parts = []
    engine = noise.get("engine_cores")
    parts.append(f"engine {engine:.2f} cores" if isinstance(engine, (int, float)) else "engine CPU not measured")
    groups = [g for g in noise.get("groups") or [] if isinstance(g, dict) and isinstance(g.get("cores"), (int, float))]
    foreign = noise.get("foreign_cores")
    if isinstance(foreign, (int, float)):
        top = ", ".join(f"{g.get('name')} {g['cores']:.2f}" for g in groups[:3])
        parts.append(f"others {foreign:.2f}" + (f" ({top})" if top else ""))
    observers = noise.get("observer_cores")
    if isinstance(observers, (int, float)) and observers >= 0.005:
        parts.append(f"exporter/Prometheus {observers:.2f}")
    steal = noise.get("steal_share")
    if isinstance(steal, (int, float)):
        parts.append(f"steal {steal:.0%}")
    load = noise.get("load1_end")
    if isinstance(load, (int, float)):
        parts.append(f"load {load:.1f}")
    settle = noise.get("settle")
    if isinstance(settle, dict) and isinstance(settle.get("waited_s"), (int, float)):
        state = "went quiet" if settle.get("settled") else "still busy"
        parts.append(f"after {settle['waited_s']:.1f}s waiting for the other engines ({state})")
    return "host: " + ", ".join(parts)


def busy_notes(probes: list[dict[str, Any]]) -> list[str]:
    """A knee's probes (knee.json) measured on a busy host: concluded from, or outweighed by a quiet one of the same level."""
    noisy = [p for p in probes if p.get("noisy")]
    if not noisy:
        return []
    used = [p for p in noisy if p.get("trusted")]
    out = []
    if used:
        out.append(
            f"note: {words.count(len(used), 'measurement')} taken on a busy host and concluded from (no quiet one of their level): "
            f"{used[0]['noisy'][0]}; the capacity is this host's as it ran"
        )
    if len(used) < len(noisy):
        out.append(
            f"note: {words.count(len(noisy) - len(used), 'measurement')} on a busy host outweighed by a quiet one of the same level"
        )
    return out
