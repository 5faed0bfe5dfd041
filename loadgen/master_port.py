"""The master's ZeroMQ port for its workers, guarded: every frame read here first, only admitted workers' messages passed
on, and each of servescope's messages checked field by field; a bad one costs itself (counted, one line), never the run.

Locust's MasterRunner reads the port in one greenlet (client_listener) and trusts what arrives: a frame that was not
msgpack raised out of it and ended it (3 s later every worker was "lost"), a Locust message without its fields did the
same, and any process that could reach the port was a worker once it said `client_ready` (handed users and the plan).
Here the listener's receive (`server.recv_from_client`) and its dispatch (`handle_message`) are wrapped on the runner:

- a frame that is not two parts, an identity and a msgpack (type, data, sender) triple, is dropped;
- a message whose sender is not the identity it came from (ZeroMQ's, which the sender cannot choose for another
  connection) is dropped;
- with `admitted` (`python -m loadgen ... --workers N`: the master starts its workers, each with an identity it
  made up, SERVESCOPE_WORKER_IDENTITY, which only they know), a message from any other identity is dropped before
  it is read; `locust -f --master` (Compose) admits any, as Locust does, on a port bound to SERVESCOPE_BIND;
- a Locust message its handler cannot take (a heartbeat without `state`) is dropped;
- servescope's own messages are checked by `checked()` against their fields in loadgen/distributed.py;
- with `admitted`, once every worker is in, the port takes no new connection (close_door): connections held by the
  thousand would otherwise take the master's file descriptors.

Each reason is said once, when first seen (later ones are counted: `dropped`, in the manifest), so a flood of bad
frames cannot flood the terminal.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import struct
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

IDENTITY_ENV = "SERVESCOPE_WORKER_IDENTITY"  # a worker's identity on the port, from the master that started it
ENGINES_ENV = "SERVESCOPE_WORKER_ENGINES"  # the command's --engine values, credentials included: never in the plan
MAX_TEXT = 4096  # a phase name, a prompt id, a host name, an error: what a worker may say in one field


def new_identity(index: int) -> str:
    """An identity for the index-th worker a master starts: unguessable, so no other process can send as it."""
    return f"servescope-{index}-{secrets.token_hex(16)}"


@contextlib.contextmanager
def worker_identity(identity: str | None) -> Iterator[None]:
    """While a WorkerRunner is made, the identity it connects with is `identity` (Locust makes up its own: the host
    name and a random uuid4, read once in WorkerRunner.__init__; there is no option for it)."""
    if not identity:
        yield
        return
    from locust import runners

    class _Fixed:
        hex = identity

    made = runners.uuid4
    runners.uuid4 = lambda: _Fixed()
    try:
        yield
    finally:
        runners.uuid4 = made


def plan_message(plan, targets) -> dict[str, Any]:
    """The plan as sent to the workers: every text in it redacted (an engine URL's user:password@ reads ***@). A
    worker takes the engines, credentials included, from the environment its master started it with (ENGINES_ENV)."""
    from servescope.contracts.urls import redact

    described = [{"instance": t.instance, "model": t.model, "info": t.info} for t in targets]
    return json.loads(redact(json.dumps({"plan": plan.to_json(), "targets": described})))


def _identity_token(identity: str) -> str:
    # WorkerRunner's client_id is "<host name>_<uuid4().hex>": ours is the part after the last "_".
    return identity.rpartition("_")[2]


class PortGuard:
    """Installed on a MasterRunner before its listener first runs; `drop()` is also how its handlers refuse."""

    def __init__(self, runner, warn: Callable[[str], None], admitted: set[str] | None = None):
        self.runner = runner
        self.warn = warn
        self.admitted = admitted
        self.dropped: Counter[str] = Counter()  # this run's, by reason (a new run starts it afresh)
        self._said: set[str] = set()  # reasons already said, for as long as the port is open
        runner.server.recv_from_client = self._receive
        handle = runner.handle_message

        def guarded(client_id: str, msg) -> None:
            try:
                handle(client_id, msg)
            except Exception as exc:  # noqa: BLE001 - a message Locust cannot take costs that message
                self.drop(f"a {msg.type!r} message Locust could not handle ({type(exc).__name__})")

        runner.handle_message = guarded

    def drop(self, reason: str) -> None:
        self.dropped[reason] += 1
        if reason not in self._said and len(self._said) < 64:
            self._said.add(reason)
            self.warn(f"load generator workers' port: dropped {reason} (more like it are counted in the manifest)")

    def _receive(self) -> tuple[str, Any]:
        """Locust's recv_from_client, except that what is not a message from an admitted worker never leaves here."""
        import zmq.error
        from locust.exception import RPCError
        from locust.rpc.protocol import Message

        while True:
            try:
                frames = self.runner.server.socket.recv_multipart()
            except zmq.error.ZMQError as exc:
                raise RPCError("ZMQ network broken") from exc
            if len(frames) != 2:
                self.drop(f"a message of {len(frames)} frames (Locust's have an identity and a body)")
                continue
            try:
                identity = frames[0].decode("utf-8")
            except UnicodeDecodeError:
                self.drop("a message from an identity that is not text")
                continue
            if self.admitted is not None and _identity_token(identity) not in self.admitted:
                self.drop("a message from a process that is not one of this run's workers")
                continue
            try:
                msg = Message.unserialize(frames[1])
            except Exception:  # noqa: BLE001 - msgpack's errors, or a triple of the wrong length
                self.drop("a frame that is not a Locust message")
                continue
            if not isinstance(msg.type, str) or msg.node_id != identity:
                self.drop("a message naming another sender than the connection it came on")
                continue
            return identity, msg

    def describe(self) -> dict[str, int]:
        return dict(self.dropped)

    def close_door(self) -> bool:
        """Every admitted worker is in: the port takes no new connection (its workers' stay). A local process that
        opened connections to it by the thousand took the master's last file descriptor mid-run (nofile 1024): the
        host's noise, then its run folder, could not be read or written, and the run ended. ZeroMQ's unbind would
        close the workers' connections with the listener, so the listening socket drops every new connection's SYN
        instead (a socket filter: Linux). False where that could not be done (the port stays open, as Locust's)."""
        return refuse_new_connections(self.runner.server.port)


SO_ATTACH_FILTER = 26  # Linux's setsockopt for a classic BPF program on a socket (not in Python's socket module)
# One instruction, BPF_RET|BPF_K with k 0: keep 0 bytes of every packet, which drops it.
DROP_ALL = struct.pack("=HBBI", 0x06, 0, 0, 0)


def refuse_new_connections(port: int) -> bool:
    """This process's TCP listeners on `port` drop every new connection's SYN from now on; the connections they
    accepted before keep theirs (a socket filter is copied to a connection when it is accepted, not after). True
    when every listener on the port took the filter."""
    import ctypes
    import socket

    import psutil

    if not sys.platform.startswith("linux"):
        return False
    try:
        listeners = [
            c.fd
            for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.fd >= 0
        ]
    except (psutil.Error, OSError):
        return False
    program = ctypes.create_string_buffer(DROP_ALL, len(DROP_ALL))
    fprog = struct.pack("@HP", 1, ctypes.addressof(program))  # struct sock_fprog {len; filter*}, read at the call
    for fd in listeners:
        try:
            listener = socket.socket(fileno=os.dup(fd))  # the same socket: its filter is the listener's
        except OSError:
            return False
        try:
            listener.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
        except OSError:
            return False
        finally:
            listener.close()  # the duplicate only: the listener stays ZeroMQ's
    return bool(listeners)


# --- what servescope's messages may hold: checked() against a spec of field -> check (each returns the value or
# raises ValueError with the few words that say why) ---


def integer(low: int = 0, high: int = 2**53):
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"expected a whole number from {low} to {high}")
        return value

    return check


def number(low: float = -math.inf, high: float = math.inf):
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError("expected a finite number")
        if not low <= value <= high:
            raise ValueError(f"expected a number from {low:g} to {high:g}")
        return float(value)

    return check


def text(value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ValueError(f"expected a string of at most {MAX_TEXT} characters")
    return value


def optional(check):
    def maybe(value: Any) -> Any:
        return None if value is None else check(value)

    return maybe


def key(value: Any) -> tuple[int, int, int]:
    """(phase index, burst round or 0, arrival index or the worker's own count)."""
    if not isinstance(value, list) or len(value) != 3:
        raise ValueError("expected a key of three whole numbers")
    return tuple(integer()(part) for part in value)  # type: ignore[return-value]


def mapping(spec: dict[str, tuple[Callable[[Any], Any], bool]]):
    def check(value: Any) -> dict[str, Any]:
        return checked(value, spec)

    return check


def checked(data: Any, spec: dict[str, tuple[Callable[[Any], Any], bool]]) -> dict[str, Any]:
    """data's fields as `spec` says (name -> (check, required)); ValueError naming the first that is wrong."""
    if not isinstance(data, dict):
        raise ValueError("expected an object of fields")
    out = {}
    for name, (check, required) in spec.items():
        if name not in data or data[name] is None:
            if required:
                raise ValueError(f"{name}: missing")
            out[name] = None
            continue
        try:
            out[name] = check(data[name])
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    return out
