"""Kernel receive stamps (Linux SO_TIMESTAMPNS): when a read's bytes reached this host's socket, on a local clock."""

from __future__ import annotations

import _socket  # the C sockets: a gevent-patched process's socket module would make the loopback probe cooperative
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterable

# Python's socket module does not export SO_TIMESTAMPNS; with it set, every recvmsg() carries the
# kernel's receive time of its bytes (CLOCK_REALTIME, a struct timespec) as ancillary data.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform.startswith("linux") else None)
TIMESPEC = struct.Struct("@qq")
CMSG_SIZE = socket.CMSG_SPACE(TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0

# The wall clock less the monotonic one changes only when the wall clock is stepped (NTP slews both alike): a change
# past this is a step, after which the kernel's wall clock is compared with this process's again.
STEP_S = 1e-3
LOOPBACK_PROBES = 5  # datagrams to this host's loopback, the one with the shortest round trip kept
LOOPBACK_TIMEOUT_S = 0.1  # for one datagram to come back over the loopback


def wall_time() -> float:
    """This process's reading of the wall clock the kernel stamps with (CLOCK_REALTIME): time.clock_gettime, not
    time.time, which a test or a hook may have replaced."""
    gettime = getattr(time, "clock_gettime", None)
    return gettime(time.CLOCK_REALTIME) if gettime is not None else time.time()


# Read on every socket read of a stream (a token each): bound once here.
_SOL_SOCKET, _TIMESPEC_SIZE, _UNPACK_TIMESPEC = socket.SOL_SOCKET, TIMESPEC.size, TIMESPEC.unpack_from


def kernel_time(ancillary: Iterable[tuple[int, int, bytes]]) -> float | None:
    """The kernel's receive time in a recvmsg() result's ancillary data (its wall clock, epoch seconds); None without one."""
    for level, kind, data in ancillary:
        if level == _SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC_SIZE:
            sec, nsec = _UNPACK_TIMESPEC(data)
            return sec + nsec * 1e-9
    return None


class _Relation:
    """Per local clock: this process's wall clock less it when last compared with the kernel's, and how far the
    kernel's wall clock is from this process's (0 when they agree: the usual case)."""

    def __init__(self) -> None:
        self.wall_less_clock: float | None = None
        self.kernel_less_wall = 0.0


_relations: dict[Callable[[], float], _Relation] = {}


def receive_stamp(
    ancillary: Iterable[tuple[int, int, bytes]], clock: Callable[[], float] = time.monotonic
) -> float | None:
    """The receive time in a recvmsg() result's ancillary data, moved from the kernel's wall clock onto `clock`; None
    without one.

    `clock` is time.monotonic or time.perf_counter (both CLOCK_MONOTONIC on Linux): the two are slewed alike with the
    wall clock, so their difference holds until the wall clock is stepped. A step (a change of that difference past
    STEP_S), and the first stamp, compare the kernel's wall clock with this process's over the loopback: a process
    whose wall clock is not the kernel's (a faked clock, libfaketime) would otherwise move every stamp by the
    difference, and a duration measured from one (a TTFT) would come out negative or stretched.
    """
    stamp = kernel_time(ancillary)
    if stamp is None:
        return None
    # Stamps come only where clock_gettime is (Linux): read here, not through wall_time(), on every socket read.
    wall_less_clock = time.clock_gettime(time.CLOCK_REALTIME) - clock()
    relation = _relations.get(clock)
    if relation is None:
        relation = _relations[clock] = _Relation()
    if relation.wall_less_clock is None or abs(wall_less_clock - relation.wall_less_clock) > STEP_S:
        relation.wall_less_clock = wall_less_clock
        relation.kernel_less_wall = kernel_less_wall()
    return stamp - relation.kernel_less_wall - wall_less_clock


def kernel_less_wall(probes: int = LOOPBACK_PROBES) -> float:
    """How far the kernel's wall clock (its receive stamps) is from this process's reading of it: 0 when the stamp of a
    datagram sent to this host's loopback lies between the readings before its send and after its receipt (the usual
    case), else the stamp less those readings' midpoint, from the probe with the shortest round trip. 0 when it cannot
    be measured (no stamps, no socket to spare): the process's reading is taken as the kernel's, as before."""
    if SO_TIMESTAMPNS is None or CMSG_SIZE == 0:
        return 0.0
    best: tuple[float, float, float] | None = None
    receiver = sender = None
    try:
        receiver = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
        sender = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
        receiver.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        receiver.bind(("127.0.0.1", 0))
        receiver.settimeout(LOOPBACK_TIMEOUT_S)
        address = receiver.getsockname()
        for _ in range(probes):
            before = wall_time()
            sender.sendto(b"\0", address)
            _data, ancillary, _flags, _addr = receiver.recvmsg(1, CMSG_SIZE)
            after = wall_time()
            stamp = kernel_time(ancillary)
            if stamp is not None and (best is None or after - before < best[1] - best[0]):
                best = (before, after, stamp)
    except OSError:
        pass  # what was measured before the failure (if anything) still stands
    finally:
        for sock in (receiver, sender):
            if sock is not None:
                sock.close()
    if best is None:
        return 0.0
    before, after, stamp = best
    if before - STEP_S <= stamp <= after + STEP_S:
        return 0.0
    return stamp - (before + after) / 2
