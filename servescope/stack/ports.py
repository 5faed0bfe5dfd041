"""Port checks before a service starts: a port in use is one line naming the port and the knob that moves it."""

from __future__ import annotations

import errno
import socket

from servescope.stack.errors import StackError


def in_use(host: str, port: int) -> bool:
    """True when something already listens on host:port (or the address cannot be bound for that reason)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Without SO_REUSEADDR a lingering TIME_WAIT would count as "in use"; that is not a listener.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def port_in_use_message(port: int, title: str, env_var: str) -> str:
    return f"port {port} is in use ({title}): set {env_var} to another port"


def require_free(host: str, port: int, title: str, env_var: str) -> None:
    if in_use(host, port):
        raise StackError(port_in_use_message(port, title, env_var))


def listening(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when a TCP connect to host:port succeeds (used by `down` to prove nothing is left)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
