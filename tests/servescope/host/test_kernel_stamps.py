"""Kernel receive stamps moved onto the monotonic clock: right whatever this process's wall clock reads."""

from __future__ import annotations

import socket
import time

import pytest

from servescope.host import kernel_stamps

pytestmark = pytest.mark.skipif(
    kernel_stamps.SO_TIMESTAMPNS is None or kernel_stamps.CMSG_SIZE == 0, reason="no kernel receive stamps on this OS"
)


def _received(clock) -> tuple[float, float, float | None]:
    """A datagram over the loopback: the clock before its send, after its stamp was converted, and the stamp."""
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with receiver, sender:
        receiver.setsockopt(socket.SOL_SOCKET, kernel_stamps.SO_TIMESTAMPNS, 1)
        receiver.bind(("127.0.0.1", 0))
        receiver.settimeout(30)
        before = clock()
        sender.sendto(b"x", receiver.getsockname())
        _data, ancillary, _flags, _addr = receiver.recvmsg(1, kernel_stamps.CMSG_SIZE)
        stamp = kernel_stamps.receive_stamp(ancillary, clock)
        return before, clock(), stamp


@pytest.fixture(autouse=True)
def _fresh_relations(monkeypatch):
    monkeypatch.setattr(kernel_stamps, "_relations", {})


@pytest.mark.parametrize("moved", ["nothing", "time.time", "the process's wall clock", "every wall clock"])
def test_a_stamp_lands_between_the_send_and_its_conversion_whatever_wall_clock_moved(monkeypatch, moved):
    """Issue 42: a worker whose time.time() read +30 s (its kernel's stamps did not move) gave TTFTs of -30 s, and the
    run folder refused 32 of 48 records. A stamp on the monotonic clock must fall between the send and the read, after
    a step of time.time() alone, of every reading this process makes (libfaketime), or of the kernel's clock too."""
    assert _received(time.perf_counter)[2] is not None  # the relation measured before the step
    if moved != "nothing":
        real_time = time.time
        monkeypatch.setattr(time, "time", lambda: real_time() + 30.0)
    if moved in ("the process's wall clock", "every wall clock"):
        gettime = time.clock_gettime
        monkeypatch.setattr(time, "clock_gettime", lambda c: gettime(c) + (30.0 if c == time.CLOCK_REALTIME else 0.0))
    if moved == "every wall clock":
        parse = kernel_stamps.kernel_time
        monkeypatch.setattr(kernel_stamps, "kernel_time", lambda ancillary: parse(ancillary) + 30.0)
    for clock in (time.perf_counter, time.monotonic):
        before, after, stamp = _received(clock)
        assert stamp is not None and before - 0.01 <= stamp <= after + 0.01, (moved, stamp - before, after - stamp)


def test_the_kernels_wall_clock_agrees_with_this_process_unless_the_process_reads_a_faked_one(monkeypatch):
    assert kernel_stamps.kernel_less_wall() == 0.0  # no bias where nothing is faked
    gettime = time.clock_gettime
    monkeypatch.setattr(time, "clock_gettime", lambda c: gettime(c) - 30.0)
    assert abs(kernel_stamps.kernel_less_wall() - 30.0) < 1.0
