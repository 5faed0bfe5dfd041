"""CPU priority on a busy host (CPU_PRIORITY): the engines and the load generator in a cgroup weighted above the rest."""

from __future__ import annotations

import atexit
import errno
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from servescope.contracts import knobs
from servescope.contracts.thresholds import knob_number
from servescope.host import hostnoise, pidrecords

# Why a cgroup: the kernel shares a busy core between groups by weight. With the sched autogroup on (the default),
# every session is one group of weight 1024, so a `setsid`-started busy loop weighs as much as the whole engine. A
# cgroup directly under the cpu controller's root at CPU_PRIORITY_WEIGHT times a default group's weight (v1 cpu.shares
# = 1024 x W, v2 cpu.weight = 100 x W, at most 10000) gets W times the CPU of any other group when both want it, and
# takes nothing when idle: weights only count under contention. The autogroup's nice is left alone: the kernel applies
# autogroups only to tasks in the root task group, so for a task in this cgroup its weight is the whole story.
# Nothing here raises on a cgroup file that cannot be written (read-only, permission, missing, a pid that exited):
# with CPU_PRIORITY=auto that is "not applied (why)", with CPU_PRIORITY=on `Refused`, one line, and nothing runs.
# The roots (mount table, /proc) are parameters, so the tests point them at a temporary tree.
GROUP = "servescope"
MOUNTS = Path("/proc/self/mounts")
PROC = Path("/proc")
MODES = ("auto", "on", "off")
V1_DEFAULT, V1_MAX = 1024, 262144  # cpu.shares of a default group; the kernel's largest
V2_DEFAULT, V2_MAX = 100, 10000  # cpu.weight of a default group; the largest cgroup v2 takes
MULTIPLE_MAX = 100.0  # CPU_PRIORITY_WEIGHT's bound: beyond it v2 is capped anyway, and v1 starves the rest outright
LOADGEN = "load generator"
OBSERVERS = "observers"  # servescope's exporter, Prometheus and web UI: they read the engines while they run


class Refused(ValueError):
    """CPU_PRIORITY=on where the priority cannot be applied: one line, and the run does not start.

    A ValueError, so the load generator's usage errors (one line, exit 2) take it as they are."""


@dataclass(frozen=True)
class Controller:
    """Where the cpu controller is mounted, and in which cgroup version."""

    version: int  # 1 (cpu.shares) or 2 (cpu.weight)
    root: Path  # the mount point: the controller's root cgroup

    @property
    def label(self) -> str:
        return "v2 cpu.weight" if self.version == 2 else "v1 cpu.shares"

    @property
    def weight_file(self) -> str:
        return "cpu.weight" if self.version == 2 else "cpu.shares"

    def value(self, multiple: float) -> int:
        """The weight to write for `multiple` times a default group's."""
        if self.version == 2:
            return max(1, min(V2_MAX, round(V2_DEFAULT * multiple)))
        return max(2, min(V1_MAX, round(V1_DEFAULT * multiple)))


@dataclass
class Priority:
    """What `apply` did: the manifest's trials.cpu_priority (as_dict) and the run's first lines (describe)."""

    mode: str  # auto | on | off: CPU_PRIORITY as it was read
    applied: bool
    reason: str | None = None  # why not applied: "not root", "CPU_PRIORITY=off", a file that could not be written
    controller: str | None = None  # "v1 cpu.shares" | "v2 cpu.weight"
    weight: int | None = None  # the value written to that file
    multiple: float | None = None  # CPU_PRIORITY_WEIGHT: the weight as a multiple of a default group's
    path: str | None = None  # the group's directory
    pids: list[int] = field(default_factory=list)  # moved into the group: each named process and its children
    gone: list[int] = field(default_factory=list)  # exited before they could be moved
    kept: dict[str, str] = field(default_factory=dict)  # pid -> why it was left where it was
    who: dict[str, list[int]] = field(default_factory=dict)  # "load generator" / engine instance -> its root pids
    # pid -> the cgroup (relative to the controller's root) it was moved from: what `restore` puts back. Not recorded.
    origins: dict[int, str] = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict:
        data = asdict(self)
        data.pop("origins")
        return data

    def describe(self) -> str:
        """The one line said at the start of a run (and by `make up` once its engines started)."""
        return line(self.as_dict(), past=False)

    def restore(self, pids: Iterable[int], mounts: Path = MOUNTS) -> None:
        """Put `pids` back in the cgroup they were moved from (those that were in this group already stay)."""
        controller = find_controller(mounts)
        if controller is None:
            return
        for pid in pids:
            origin = self.origins.get(pid)
            if origin is None or origin.strip("/") == Path(self.path or "").name:
                continue
            try:
                _write(controller.root / origin.lstrip("/") / "cgroup.procs", str(pid), append=True)
            except OSError:
                pass  # exited, or its old group is gone: nothing to give back


def mode_knob() -> str:
    """CPU_PRIORITY, checked: auto, on or off; ValueError with the one line to show otherwise."""
    value = knobs.get("CPU_PRIORITY").strip().lower()
    if value not in MODES:
        raise ValueError(f"CPU_PRIORITY={knobs.get('CPU_PRIORITY')!r}: expected auto, on or off")
    return value


def multiple_knob() -> float:
    """CPU_PRIORITY_WEIGHT: the group's weight as a multiple of a default group's, from 1 to 100."""
    return knob_number("CPU_PRIORITY_WEIGHT", 1.0, MULTIPLE_MAX)


# ---------------------------------------------------------------- finding the controller


def _unescape(text: str) -> str:
    """A mount table field: the kernel writes space, tab, newline and backslash as \\040-style octal escapes."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and len(code := text[i + 1 : i + 4]) == 3 and set(code) <= set("01234567"):
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def find_controller(mounts: Path = MOUNTS) -> Controller | None:
    """The cpu controller: a cgroup2 mount whose root lists `cpu` in cgroup.controllers (a pure v2 host's
    /sys/fs/cgroup, or a hybrid host's /sys/fs/cgroup/unified when cpu is not bound to v1), else a cgroup v1 mount
    with the `cpu` option (/sys/fs/cgroup/cpu, or cpu,cpuacct co-mounted); None when neither is mounted."""
    try:
        table = mounts.read_text(errors="replace").splitlines()
    except OSError:
        return None
    v1 = None
    for entry in table:
        parts = entry.split()
        if len(parts) < 4:
            continue
        point, kind, options = Path(_unescape(parts[1])), parts[2], parts[3].split(",")
        if kind == "cgroup2":
            try:
                if "cpu" in (point / "cgroup.controllers").read_text().split():
                    return Controller(2, point)  # a controller lives in one hierarchy only: v2 listing it wins
            except OSError:
                continue
        elif kind == "cgroup" and "cpu" in options and v1 is None:
            v1 = Controller(1, point)
    return v1


# ---------------------------------------------------------------- the processes


def _ppids(proc: Path) -> dict[int, int]:
    """pid -> parent pid of every process in the table (/proc/PID/stat's 4th field)."""
    parents = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return parents
    for name in names:
        if not name.isdigit():
            continue
        try:
            data = (proc / name / "stat").read_bytes()
        except OSError:
            continue  # exited between the listing and the read
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) > 1 and fields[1].isdigit():
            parents[int(name)] = int(fields[1])
    return parents


def with_descendants(pids: Iterable[int], proc: Path = PROC) -> list[int]:
    """The pids, each followed by every process under it (vLLM's engine core, a process pool's workers): a cgroup
    move takes one process (all its threads), never its children, which keep their own group."""
    children: dict[int, list[int]] = {}
    for pid, parent in _ppids(proc).items():
        children.setdefault(parent, []).append(pid)
    out: list[int] = []
    todo = list(dict.fromkeys(pids))
    while todo:
        pid = todo.pop(0)
        if pid in out:
            continue
        out.append(pid)
        todo.extend(sorted(children.get(pid, ())))
    return out


def _cgroup_of(pid: int, controller: Controller, proc: Path) -> str | None:
    """The process's cgroup in the controller's hierarchy (relative to its root), None when unreadable."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for entry in lines:
        _, names, path = entry.split(":", 2) if entry.count(":") >= 2 else ("", "", "")
        if (controller.version == 2 and entry.startswith("0::")) or (
            controller.version == 1 and "cpu" in names.split(",")
        ):
            return path or "/"
    return None


def _cpu_limit(relative: str, controller: Controller) -> str | None:
    """The CPU limit set on a cgroup or one of its parents (a container's, a service's), as the file says it; None
    when there is none. A process under such a limit is left there: moving it out would lift the limit."""
    parts = [p for p in relative.strip("/").split("/") if p]
    for depth in range(len(parts), 0, -1):
        group = controller.root.joinpath(*parts[:depth])
        try:
            if controller.version == 2:
                quota = (group / "cpu.max").read_text().split()[0]
                limited = quota != "max"
            else:
                quota = (group / "cpu.cfs_quota_us").read_text().strip()
                limited = quota not in ("-1", "")
        except (OSError, IndexError):
            continue
        if limited:
            return f"its cgroup {'/' + '/'.join(parts[:depth])} limits its CPU ({quota})"
    return None


# ---------------------------------------------------------------- applying it


def _write(path: Path, text: str, append: bool = False) -> None:
    """One write(2) to a cgroup file, which must exist (the kernel makes them; never created here)."""
    fd = os.open(path, os.O_WRONLY | (os.O_APPEND if append else os.O_TRUNC))
    try:
        os.write(fd, (text + "\n").encode())  # as `echo` writes it: the kernel strips the newline
    finally:
        os.close(fd)


def _why(exc: OSError, path: Path) -> str:
    """A cgroup write that failed, in a few words."""
    words = {
        errno.EROFS: "read-only file system",
        errno.EACCES: "permission denied",
        errno.EPERM: "not permitted",
        errno.ENOENT: "no such file (the cpu controller is not enabled there)",
        errno.EBUSY: "busy (the group holds processes of its own)",
    }.get(exc.errno, (exc.strerror or str(exc)).lower())
    return f"cannot write {path}: {words}"


def _prepare(controller: Controller, name: str, value: int) -> Path:
    """The group under the controller's root, at `value`; OSError where the filesystem refuses."""
    root = controller.root
    if controller.version == 2:
        # A v2 child has a cpu.weight only once its parent hands the controller down.
        control = root / "cgroup.subtree_control"
        if "cpu" not in control.read_text().split():
            try:
                _write(control, "+cpu")
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, str(control)) from None
    group = root / name
    try:
        group.mkdir(exist_ok=True)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(group)) from None
    weight = group / controller.weight_file
    try:
        _write(weight, str(value))
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(weight)) from None
    return group


def apply(
    pids: Iterable[int],
    *,
    mode: str | None = None,
    multiple: float | None = None,
    name: str = GROUP,
    mounts: Path = MOUNTS,
    proc: Path = PROC,
    euid: int | None = None,
) -> Priority:
    """Move `pids` and their children into the group `name` at CPU_PRIORITY_WEIGHT (created if need be).

    No pids: the group is made ready and nothing moved (a check that CPU_PRIORITY=on can be honoured). A pid that
    exited is noted as gone; a process under a CPU limit of its own (a container's) is left there, noted as kept.
    Raises Refused with mode "on" where it is not applied, ValueError on a bad knob; never OSError."""
    mode = mode_knob() if mode is None else mode
    if mode not in MODES:
        raise ValueError(f"CPU_PRIORITY={mode!r}: expected auto, on or off")
    if mode == "off":
        return Priority(mode, False, reason="CPU_PRIORITY=off")
    multiple = multiple_knob() if multiple is None else multiple
    result = Priority(mode, False, multiple=multiple)
    if (os.geteuid() if euid is None else euid) != 0:
        return _refuse(result, "not root")
    controller = find_controller(mounts)
    if controller is None:
        return _refuse(result, "no cpu controller mounted: neither cgroup2 with cpu nor a cgroup v1 cpu hierarchy")
    result.controller, result.weight = controller.label, controller.value(multiple)
    try:
        group = _prepare(controller, name, result.weight)
    except OSError as exc:
        return _refuse(result, _why(exc, Path(exc.filename or controller.root)))
    result.path = str(group)
    for pid in with_descendants(pids, proc):
        origin = _cgroup_of(pid, controller, proc)
        if origin is None and not (proc / str(pid)).exists():
            result.gone.append(pid)
            continue
        limit = _cpu_limit(origin, controller) if origin and origin.strip("/") != name else None
        if limit:
            result.kept[str(pid)] = limit
            continue
        try:
            _write(group / "cgroup.procs", str(pid), append=True)
        except OSError as exc:
            if exc.errno == errno.ESRCH:  # it exited after the listing: nothing left to protect
                result.gone.append(pid)
                continue
            result.restore(result.pids, mounts)  # all or none: a half-moved run would measure a mix
            result.pids = []
            return _refuse(result, f"{_why(exc, group / 'cgroup.procs')} (pid {pid})")
        result.pids.append(pid)
        result.origins[pid] = origin or "/"
    result.applied = True
    return result


def _refuse(result: Priority, reason: str) -> Priority:
    result.applied, result.reason = False, reason
    if result.mode == "on":
        raise Refused(
            f"CPU priority: not applied ({reason}); CPU_PRIORITY=on asks for it, so nothing runs "
            f"(CPU_PRIORITY=auto measures without it)"
        )
    return result


def release(pids: Iterable[int], *, mounts: Path = MOUNTS) -> None:
    """Move `pids` back to the controller's root group (best effort): a test's cleanup."""
    controller = find_controller(mounts)
    for pid in pids if controller is not None else ():
        try:
            _write(controller.root / "cgroup.procs", str(pid), append=True)
        except OSError:
            pass


def remove(name: str = GROUP, *, mounts: Path = MOUNTS) -> bool:
    """Remove the group when nothing runs in it any more (`make down`); False when it is busy or not there."""
    controller = find_controller(mounts)
    if controller is None:
        return False
    try:
        (controller.root / name).rmdir()
    except OSError:
        return False
    return True


def protect_run(engines: Iterable[tuple[str, str, str]], *, mode: str | None = None) -> Priority:
    """A load generator's run: this process and each (instance, kind, url) engine that runs on this host (the
    native stack's pid record, or what listens on its port: hostnoise's own reading), with their children.

    The engines this run moved go back to where they were when the process exits (those `make up` put in the
    group already stay there); the load generator's own process needs nothing: it ends."""
    mode = mode_knob() if mode is None else mode
    who = {LOADGEN: [os.getpid()]}
    if mode != "off" and os.geteuid() == 0:  # otherwise not applied anyway: no need to look
        records = pidrecords.live()
        observers: set[int] = set()
        for instance, kind, url in engines:
            if hostnoise.on_this_host(url):
                roles = hostnoise.roles_for(instance, kind, url, records=records)
                found = roles.engine - {os.getpid()}
                if found:
                    who[instance] = sorted(found)
                    observers |= {p for pids in roles.observers.values() for p in pids}
        # servescope's exporter and Prometheus read the engines while they run: left outside, an engine at full
        # tilt in the group starves them (one sample in a 2 s burst, seen), and the gauges the verdict reads go.
        observers -= {os.getpid(), *(p for pids in who.values() for p in pids)}
        if observers:
            who[OBSERVERS] = sorted(observers)
    result = apply([p for pids in who.values() for p in pids], mode=mode)
    result.who = who if result.applied else {}
    moved = [p for p in result.pids if p != os.getpid()]  # this process ends: nothing to give back
    if moved:
        atexit.register(result.restore, moved)
    return result


# ---------------------------------------------------------------- saying it


def _subject(who: dict) -> tuple[str, bool]:
    """Who runs in the group, in words, and whether that is one (for the verb)."""
    engines = [str(k) for k in who if k not in (LOADGEN, OBSERVERS)]
    loadgen = LOADGEN in who
    named = f"the engine{'s' if len(engines) > 1 else ''} ({', '.join(engines)})" if engines else ""
    if named and loadgen:
        watch = ", servescope's observers" if OBSERVERS in who else ""
        return f"{named}{watch} and the load generator", False
    if loadgen:
        return "the load generator (no engine of the run found on this host)", True
    return (named, len(engines) == 1) if named else ("nothing yet", True)


def line(record: dict, past: bool = False) -> str:
    """One line from a Priority's dict: applied or not and why, with the weight; `past`: as the report says it."""
    mode = record.get("mode") or "auto"
    tense = (lambda now, then: then) if past else (lambda now, then: now)
    end = "." if past else ""
    equals = f"other programs {tense('compete', 'competed')} for the CPU as equals"
    if not record.get("applied"):
        if mode == "off":
            return f"CPU priority: off (CPU_PRIORITY=off): {equals}{end}"
        why = record.get("reason") or "reason not recorded"
        return f"CPU priority: not applied ({why}): {equals} (CPU_PRIORITY={mode}){end}"
    who, one = _subject(record["who"] if isinstance(record.get("who"), dict) else {})
    multiple = record.get("multiple")
    times = f" ({multiple:g}x a default group)" if isinstance(multiple, (int, float)) else ""
    weight_file = str(record.get("controller") or "cpu weight").split(" ")[-1]
    text = (
        f"CPU priority: {who} {tense('runs' if one else 'run', 'ran')} in cgroup {record.get('path')} at "
        f"{weight_file} {record.get('weight')}{times}: other programs {tense('get', 'got')} the CPU when these "
        f"{tense('are', 'were')} idle"
    )
    kept = record.get("kept")
    if isinstance(kept, dict) and kept:
        text += "; left where they were: " + ", ".join(f"pid {pid} ({why})" for pid, why in kept.items())
    return text + (f" (CPU_PRIORITY={mode}){end}" if past else " (CPU_PRIORITY=off to turn off)")


def report_line(trials: object) -> str | None:
    """The report's setup line from a manifest's `trials` (None for a run recorded before the priority existed)."""
    record = trials.get("cpu_priority") if isinstance(trials, dict) else None
    return line(record, past=True) if isinstance(record, dict) else None
