"""Supervision of the native services: start in their own process group, wait for readiness, pid files, stop, status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from servescope.host import children, probe
from servescope.host.process_memory import tree_memory
from servescope.stack import paths
from servescope.stack.errors import ServiceExited, StackError
from servescope.stack.progress import Step, say, tail
from servescope.text.numbers import elapsed


@dataclass
class Service:
    """What to run and how to know it is ready."""

    name: str  # vllm, llamacpp, ollama, exporter, prometheus, locust
    title: str  # vLLM-CPU, llama.cpp server, ...
    cmd: list[str]
    host: str
    port: int
    port_env: str  # the knob that moves it, for the port-in-use line
    ready_path: str  # vLLM /v1/models, llama.cpp /health, Prometheus /-/ready, exporter /metrics
    ready_timeout: float = 60.0
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"


@dataclass
class Record:
    """A pid file: enough to prove, later, that a pid is still the process `up` started."""

    name: str
    title: str
    url: str
    ready_url: str
    port: int | None = None
    pid: int | None = None
    create_time: float | None = None
    cmdline: list[str] = field(default_factory=list)
    log: str | None = None
    started_at: float | None = None
    absent: str | None = None  # why a service is not part of this stack (Ollama not installed)

    def save(self, directory: Path | None = None) -> Path:
        path = (directory or paths.pid_dir()) / f"{self.name}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: Path) -> Record:
        data = json.loads(path.read_text())
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def records(directory: Path | None = None) -> dict[str, Record]:
    directory = directory or paths.pid_dir()
    found: dict[str, Record] = {}
    for path in sorted(directory.glob("*.json")):
        try:
            record = Record.load(path)
        except (ValueError, TypeError):
            continue  # a torn pid file proves nothing: never kill on its word
        found[record.name] = record
    return found


def forget(name: str, directory: Path | None = None) -> None:
    ((directory or paths.pid_dir()) / f"{name}.json").unlink(missing_ok=True)


def process_of(record: Record) -> psutil.Process | None:
    """The live process behind a record, only if pid, start time and command line all still match."""
    if not record.pid:
        return None
    try:
        proc = psutil.Process(record.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        if record.create_time is not None and abs(proc.create_time() - record.create_time) > 1.0:
            return None  # the pid was reused by another process
        if record.cmdline and proc.cmdline() != record.cmdline:
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def start(
    service: Service, directory: Path | None = None, log_dir: Path | None = None
) -> tuple[subprocess.Popen, Record]:
    """Start in a new session (its own process group) so `down` can stop it and every child it spawns."""
    log = (log_dir or paths.service_logs()) / f"{service.name}.log"
    out = open(log, "a")
    out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} $ {' '.join(service.cmd)}\n")
    out.flush()
    try:
        proc = subprocess.Popen(
            service.cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **service.env},
            cwd=service.cwd,
            start_new_session=True,
        )
    except OSError as exc:
        raise StackError(f"{service.title}: cannot start {service.cmd[0]}: {exc}") from None
    finally:
        out.close()
    try:
        ps = psutil.Process(proc.pid)
        create_time, cmdline = ps.create_time(), _exec_cmdline(ps) or list(service.cmd)
    except psutil.NoSuchProcess:
        create_time, cmdline = None, list(service.cmd)
    record = Record(
        name=service.name,
        title=service.title,
        url=service.url,
        ready_url=service.url + service.ready_path,
        port=service.port,
        pid=proc.pid,
        create_time=create_time,
        cmdline=cmdline,
        log=str(log),
        started_at=time.time(),
    )
    record.save(directory)
    return proc, record


EXEC_ARGS_S = 2.0  # the longest a just-started child's command line is waited for (a busy host's exec)


def _exec_cmdline(ps: psutil.Process) -> list[str]:
    """A just-started child's command line as the kernel shows it (a script's: its interpreter's, then the script).
    Popen returns once the exec is past its point of no return, before the new program's arguments are in place:
    meanwhile the kernel shows an empty command line (seen on a busy host; the record then matched any command line
    and the engine's flags read as absent). Empty after EXEC_ARGS_S: [] (the caller records the command it ran)."""
    deadline = time.monotonic() + EXEC_ARGS_S
    while not (cmdline := ps.cmdline()) and time.monotonic() < deadline:
        time.sleep(0.005)
    return cmdline


def last_log_line(log: str | None):
    def detail() -> str:
        lines = tail(Path(log), 3).splitlines() if log else []
        line = lines[-1].strip() if lines else ""
        return f"| {line[:100]}" if line else ""

    return detail


def refresh_identity(record: Record, directory: Path | None = None) -> None:
    """Re-read the command line once ready: a service may exec another program (the Locust UI execs locust),
    keeping its pid and start time but not its argv."""
    try:
        record.cmdline = psutil.Process(record.pid).cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return
    record.save(directory)


def wait_ready(
    record: Record,
    proc: subprocess.Popen | None,
    timeout: float,
    label: str | None = None,
    poll: float = 1.0,
    heartbeat: float | None = None,
    directory: Path | None = None,
    key: str | None = None,
) -> float:
    """Poll the readiness URL; fail early with the log's last lines if the process exits or time runs out.

    With a `key`, the wait says how long it took on this machine last time and keeps this one's duration."""
    label = label or f"waiting for {record.title} at {record.ready_url}"
    kwargs = {"interval": heartbeat} if heartbeat else {}
    with Step(label, detail=last_log_line(record.log), key=key, **kwargs) as step:
        deadline = time.monotonic() + timeout
        while True:
            if probe.is_up(record.ready_url):
                if proc is not None and proc.poll() is None:
                    refresh_identity(record, directory)
                return step.seconds
            code = proc.poll() if proc is not None else (None if process_of(record) else "gone")
            if code is not None:
                raise ServiceExited(
                    f"{record.title} exited (code {code}) before it was ready; log {record.log}:\n"
                    f"{tail(Path(record.log), 20) if record.log else ''}",
                    code if isinstance(code, int) else 0,
                )
            if time.monotonic() > deadline:
                raise StackError(
                    f"{record.title} not ready at {record.ready_url} after {elapsed(timeout)}; log {record.log}:\n"
                    f"{tail(Path(record.log), 20) if record.log else ''}"
                )
            time.sleep(poll)


def start_ready(
    service: Service,
    label: str | None = None,
    directory: Path | None = None,
    log_dir: Path | None = None,
    grace: float = 20.0,
    poll: float = 1.0,
) -> Record:
    """Start a service and wait until it is ready; one that exits or hangs is stopped (stop(): never left running,
    half up, holding its port) before the reason is raised."""
    proc, record = start(service, directory, log_dir)
    try:
        wait_ready(record, proc, service.ready_timeout, label=label, poll=poll, directory=directory)
    except BaseException:
        stop(record, grace=grace, directory=directory)
        raise
    return record


def tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop(record: Record, grace: float = 20.0, directory: Path | None = None) -> str:
    """Stop one service by its recorded pid (verified), its process group and any child that left it, on the schedule
    every child of the tools gets (servescope/host/children.py): SIGINT (its own Ctrl-C: an engine finishes its shutdown),
    SIGTERM after `grace` s, SIGKILL children.KILL_AFTER_TERM_S later (a hung server that ignores both included)."""
    proc = process_of(record)
    if proc is None:
        forget(record.name, directory)
        return "not running" if record.pid else "absent"
    members = tree(proc)
    group = record.pid if _pgid(record.pid) == record.pid else None
    alive = members
    for sig, wait_s in ((signal.SIGINT, grace), (signal.SIGTERM, children.KILL_AFTER_TERM_S)):
        _signal(alive, group, sig)
        _, alive = psutil.wait_procs(alive, timeout=wait_s)
        if not alive:
            break
    if alive:
        _signal(alive, group, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5)
    if group is not None:
        try:  # a grandchild reparented to init but still in the group
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    forget(record.name, directory)
    return "stopped" if not alive else "killed"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _signal(members: list[psutil.Process], group: int | None, sig: int) -> None:
    """`sig` once to each: the group, then the members that left it. Twice would be a second Ctrl-C, which an engine
    (uvicorn's vLLM) takes as "exit now" instead of its orderly shutdown."""
    if group is not None:
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            group = None
    for member in members:
        try:
            if group is not None and _pgid(member.pid) == group:
                continue
            member.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def status_rows(recs: list[Record]) -> list[tuple[str, str, str, str, str]]:
    rows = []
    for rec in recs:
        if rec.absent:
            rows.append((rec.name, "-", rec.url or "-", "absent", "-"))
            continue
        if rec.pid is None:  # not ours: an Ollama that was already running
            rows.append((rec.name, "external", rec.url, "yes" if probe.is_up(rec.ready_url) else "no", "-"))
            continue
        proc = process_of(rec)
        if proc is None:
            rows.append((rec.name, str(rec.pid or "-"), rec.url, "dead", "-"))
            continue
        ready = "yes" if probe.is_up(rec.ready_url) else "no"
        rows.append((rec.name, str(rec.pid), rec.url, ready, f"{tree_memory(proc) / (1 << 20):.0f} MiB"))
    return rows


def format_table(
    rows: list[tuple[str, ...]], header: tuple[str, ...] = ("service", "pid", "URL", "ready", "memory (PSS)")
) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]
    ]
    return "\n".join(lines)


def print_status(recs: list[Record]) -> None:
    if not recs:
        say("native stack: nothing running (no pid files in " + str(paths.pid_dir()) + ")")
        return
    say(format_table(status_rows(recs)))
