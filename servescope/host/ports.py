"""A port to listen on: free now, and outside the kernel's ephemeral range that outgoing connections draw from."""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default, when the file cannot be read
# Above the stack's fixed ports (Ollama 11434, the replicas from 18500) and below SGLang's 30000.
LISTEN_RANGE = (20000, 30000)

_cursor: int | None = None  # where the next search starts: two calls before either port is bound get two ports


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The ports the kernel hands to outgoing connections (and to a bind to port 0), inclusive."""
    try:
        low, high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return low, high


def listen_candidates(share: tuple[int, int] = (0, 1), ephemeral: tuple[int, int] | None = None) -> range:
    """The ports to try, `share` = (index, count) of the range split among processes that pick at once."""
    low, high = LISTEN_RANGE
    eph_low, eph_high = ephemeral or ephemeral_range()
    if eph_low < high and eph_high >= low:  # the range overlaps the ephemeral one: keep the part below it
        high = max(low, eph_low)
    index, count = share
    width = (high - low) // max(count, 1)
    return range(low + index * width, low + (index + 1) * width)


def free_port(host: str = "127.0.0.1", *, share: tuple[int, int] = (0, 1)) -> int:
    """A port free on `host` right now, outside the ephemeral range.

    The kernel's own pick (bind to port 0) is an ephemeral port: the next outgoing connection of any process
    may take it before our server binds it, which is how a busy parallel test run met "port already in use".
    """
    global _cursor
    candidates = listen_candidates(share)
    if len(candidates) == 0:
        return _kernel_pick(host)
    if _cursor not in candidates:
        _cursor = random.choice(candidates)  # processes started together begin apart
    start = candidates.index(_cursor)
    for step in range(len(candidates)):
        port = candidates[(start + step) % len(candidates)]
        if _bindable(host, port):
            _cursor = candidates[(start + step + 1) % len(candidates)]
            return port
    return _kernel_pick(host)


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _kernel_pick(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
