"""Kernel receive stamps (Linux SO_TIMESTAMPNS): when a read's bytes reached this host's socket, on a local clock."""

from __future__ import annotations

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


def receive_stamp(
    ancillary: Iterable[tuple[int, int, bytes]], clock: Callable[[], float] = time.monotonic
) -> float | None:
    """The receive time in a recvmsg() result's ancillary data, moved from the wall clock onto `clock`; None without one.

    `clock` is time.monotonic or time.perf_counter (both CLOCK_MONOTONIC on Linux): the two are
    slewed alike with the wall clock, so only a step of the wall clock in between shifts the result.
    """
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= TIMESPEC.size:
            sec, nsec = TIMESPEC.unpack_from(data)
            return sec + nsec * 1e-9 - (time.time() - clock())
    return None
