"""N replicas of one engine started natively, each on its own cores, behind nginx: `python -m servescope.stack replicas`."""

from __future__ import annotations

import os
import shutil
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

from servescope import engines as kinds
from servescope.contracts import knobs
from servescope.contracts.settings import KnobTable
from servescope.engines import llamacpp as adapter
from servescope.stack import llamacpp, model, paths, ports, supervisor
from servescope.stack.errors import ServiceExited, StackError
from servescope.stack.progress import say
from servescope.stack.router import POLICIES, Router
from servescope.stack.supervisor import Record, Service
from servescope.text import words

# llama.cpp only: two vLLM-CPU replicas of this model need more memory and cores than the sizing this stack checks.
STARTABLE = (kinds.LLAMACPP.name,)
MAX_REPLICAS = 64  # replicas on one host, each a llama-server holding the model: past it, no host here has the memory
MAX_THREADS = 1024  # REPLICAS_THREADS: llama-server's threads per replica


@dataclass(frozen=True)
class Fleet:
    """What is up: the replicas' own URLs (for the exporter and per-replica reads) and the router's (for load)."""

    urls: tuple[str, ...]
    router: str
    exporter_config: Path  # the exporter's YAML listing each replica as an instance (exporter/config.py)


def exporter_config(kind: str, urls: tuple[str, ...], path: Path) -> Path:
    """Each replica an `instance` of its own: through the router one scrape would read whichever replica nginx
    picked."""
    lines = ["engines:"]
    for i, url in enumerate(urls, 1):
        lines += [f"  - kind: {kind}", f"    name: {kind}-{i}", f"    url: {url}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def cores_of(index: int, count: int, threads: int, available: list[int]) -> list[int]:
    """Replica `index`'s cores: consecutive blocks of `threads`, wrapping when the replicas outnumber the cores
    (then they share, and the note says so)."""
    start = (index * threads) % len(available)
    return [available[(start + k) % len(available)] for k in range(threads)]


def replica_services(
    count: int, threads: int, slots: int, base_port: int, pin: bool, host: str = "127.0.0.1", *, table: KnobTable
) -> list[Service]:
    """One llama-server per replica: the stack's own command line (servescope/stack/llamacpp.py) with the replica's port,
    its threads and batch slots, under `taskset` when pinned (without it the replicas' threads migrate across
    every core and each one's speed depends on the others' load, which the plan's one-replica knee did not see).
    `table`: the knobs the stack's command line is made of."""
    knob = KnobTable({**table, adapter.SLOTS.env: str(slots)})
    binary, gguf = llamacpp.ensure_built(knob), model.ensure_gguf()
    available = sorted(os.sched_getaffinity(0))
    taskset = shutil.which("taskset") if pin else None
    # The AMX kernels die on this project's VMs (servescope/stack/native.py says why): read /proc/cpuinfo once, not per replica.
    no_repack = ["--no-repack"] if llamacpp.cpu_advertises_amx() else []
    if pin and taskset is None:
        raise StackError("REPLICAS_PIN=1 needs taskset (Debian: util-linux)")
    services = []
    for i in range(count):
        port = base_port + i
        cmd = llamacpp.command(binary, gguf, knob, host, port) + ["--threads", str(threads), *no_repack]
        if taskset:
            cmd = [taskset, "-c", ",".join(map(str, cores_of(i, count, threads, available))), *cmd]
        name = f"{kinds.LLAMACPP.name}-{i + 1}"
        title = f"{kinds.LLAMACPP.title} replica {i + 1}"
        services.append(Service(name, title, cmd, host, port, "REPLICAS_BASE_PORT", kinds.LLAMACPP.health_path, 120))
    return services


class Replicas:
    """`with Replicas(...) as fleet:` N replicas and their router, all stopped again on the way out (or on failure).
    Their pid files and logs live in their own folder, apart from the native stack's."""

    def __init__(
        self,
        kind: str,
        count: int,
        *,
        table: KnobTable,
        threads: int | None = None,
        slots: int = 1,
        pin: bool = True,
        base_port: int | None = None,
        policy: str | None = None,
        router_port: int | None = None,
        workdir: Path | None = None,
    ):
        if kind not in STARTABLE:
            raise StackError(f"replicas: --engine {kind!r}: the stack starts replicas of {', '.join(STARTABLE)}")
        if not 1 <= count <= MAX_REPLICAS:
            raise StackError(f"replicas: --count {count}: expected 1 to {MAX_REPLICAS} (each loads the model here)")
        cores = len(os.sched_getaffinity(0))
        self.kind, self.count, self.slots, self.pin = kind, count, slots, pin
        self.threads = threads or max(1, cores // count)
        self.table = table  # the knobs, read at the entry: ports and policy unless given, the replicas' command line
        self.base_port = base_port or table.port("REPLICAS_BASE_PORT")
        if self.base_port + count - 1 > 65535:
            raise knobs.KnobError(f"REPLICAS_BASE_PORT={self.base_port}: {count} replicas from it run past port 65535")
        self.router_port = router_port or table.port("ROUTER_PORT")
        self.policy = policy or table.choice("PLAN_ROUTING", tuple(POLICIES))
        # One fleet at a time (the ports say so), so one folder: its logs stay for reading after a failure.
        self.workdir = Path(workdir) if workdir else paths.state_dir() / "replicas"
        self.started: list[Record] = []
        self.router: Router | None = None
        if count * self.threads > cores:
            say(f"replicas: {count} x {self.threads} threads on {cores} cores: they share cores")

    def __enter__(self) -> Fleet:
        try:
            return self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def _start(self) -> Fleet:
        services = replica_services(self.count, self.threads, self.slots, self.base_port, self.pin, table=self.table)
        for service in services:
            ports.require_free(service.host, service.port, service.title, service.port_env)
        ports.require_free("127.0.0.1", self.router_port, "the replicas' router", "ROUTER_PORT")
        records = self.workdir / "pids"
        records.mkdir(parents=True, exist_ok=True)
        launched = []
        for service in services:
            proc, record = supervisor.start(service, directory=records, log_dir=self.workdir)
            self.started.append(record)
            launched.append((proc, record))
        for proc, record in launched:  # all load their weights at once; then each is waited for
            try:
                supervisor.wait_ready(record, proc, 120, directory=records)
            except ServiceExited as exc:
                raise StackError(str(exc).splitlines()[0]) from None
        urls = tuple(s.url for s in services)
        self.router = Router(list(urls), self.router_port, self.policy, self.workdir / "nginx")
        router_url = self.router.__enter__()
        say(
            f"{self.count} {kinds.LLAMACPP.title} replicas ({words.count(self.threads, 'thread')}, {words.count(self.slots, 'slot')} each"
            f"{', pinned' if self.pin else ''}) at {', '.join(urls)}; nginx {self.policy} at {router_url}"
        )
        return Fleet(urls, router_url, exporter_config(self.kind, urls, self.workdir / "exporter.yml"))

    def __exit__(self, *exc) -> None:
        if self.router is not None:
            self.router.__exit__(None, None, None)
            self.router = None
        for record in reversed(self.started):
            supervisor.stop(record, directory=self.workdir / "pids")
        self.started = []


def settings(table: KnobTable) -> tuple[int | None, int, bool]:
    """The REPLICAS_* knobs, each checked where it is read (KnobError: one line naming it): threads per replica (None:
    the cores divided among them), batch slots, pinned or not."""
    threads = None
    if table["REPLICAS_THREADS"].strip():  # empty: the cores divided among the replicas
        threads = table.int_in("REPLICAS_THREADS", 1, MAX_THREADS)
    slots = table.int_in("REPLICAS_SLOTS", 1, adapter.MAX_SLOTS)
    return threads, slots, table.choice("REPLICAS_PIN", ("0", "1")) == "1"


def serve(kind: str, count: int) -> int:
    """The command: start them, print where they are, hold them until Ctrl-C or SIGTERM."""
    table = KnobTable.from_env()  # the verb's entry: the knobs, read once
    threads, slots, pin = settings(table)
    with Replicas(kind, count, table=table, threads=threads, slots=slots, pin=pin) as fleet:
        say(f"load through the router: python -m loadgen ... --engine {kind}={fleet.router}")
        say(f"read each replica: python -m exporter --config {fleet.exporter_config} --port N")
        say("Ctrl-C stops them")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            while not stop.wait(1):
                pass
        except KeyboardInterrupt:
            pass
    say("replicas stopped")
    return 0
