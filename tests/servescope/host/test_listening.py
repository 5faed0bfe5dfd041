"""Who listens on a TCP port, from the kernel's socket diagnostics: this process's own listeners found, a connection's
port never, the same answer as psutil's reading of /proc/net/tcp, and a malformed or refused answer one clear error."""

from __future__ import annotations

import os
import socket
import struct

import psutil
import pytest

from servescope.host import listening


def by_netlink() -> dict[int, set[int]]:
    """listening()'s answer from the kernel's socket diagnostics alone (its psutil fallback would answer the same)."""
    return listening._from_sock_diag(listening.PROC)


def listener(family: int = socket.AF_INET, host: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen()
    return sock


def test_a_listening_socket_is_found_with_this_process_and_a_closed_one_is_not():
    sock = listener()
    port = sock.getsockname()[1]
    try:
        assert os.getpid() in by_netlink().get(port, set())
    finally:
        sock.close()
    assert os.getpid() not in by_netlink().get(port, set())


def test_an_ipv6_listener_is_found():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    try:
        sock = listener(socket.AF_INET6, "::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    with sock:
        assert os.getpid() in by_netlink().get(sock.getsockname()[1], set())


def test_a_connections_ports_are_not_listeners():
    """Both ends of an accepted connection are this process's, and neither's port listens."""
    with listener() as server, socket.create_connection(server.getsockname()) as client:
        accepted, _ = server.accept()
        with accepted:
            found = by_netlink()
            assert os.getpid() in found[server.getsockname()[1]]
            assert os.getpid() not in found.get(client.getsockname()[1], set())


def test_the_same_answer_as_psutil_for_this_processs_listeners():
    """psutil reads /proc/net/tcp and tcp6 (the whole connection table) for the same question."""
    socks = [listener(), listener()]
    try:
        ports = {s.getsockname()[1] for s in socks}
        mine = {p: pids for p, pids in by_netlink().items() if p in ports}
        theirs = {}
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.pid and c.laddr.port in ports:
                theirs.setdefault(c.laddr.port, set()).add(c.pid)
        assert mine == theirs == {p: {os.getpid()} for p in ports}
    finally:
        for s in socks:
            s.close()


def header(length: int, kind: int) -> bytes:
    return struct.pack("=IHHII", length, kind, 0, 1, 0)


def socket_message(port: int, inode: int) -> bytes:
    body = bytearray(72)  # struct inet_diag_msg
    body[0], body[1] = socket.AF_INET, listening.TCP_LISTEN
    struct.pack_into("!H", body, 4, port)
    struct.pack_into("=I", body, 68, inode)
    return header(16 + len(body), listening.SOCK_DIAG_BY_FAMILY) + bytes(body)


class Kernel:
    """The kernel's side of a sock_diag dump: the datagrams it answers with, one per recv."""

    def __init__(self, *datagrams: bytes):
        self.datagrams, self.sent = list(datagrams), []

    def sendto(self, data: bytes, address) -> int:
        self.sent.append((data, address))
        return len(data)

    def recv(self, size: int) -> bytes:
        return self.datagrams.pop(0) if self.datagrams else b""


def test_a_dump_over_several_datagrams_is_read_to_its_end():
    done = header(20, listening.NLMSG_DONE) + bytes(4)
    kernel = Kernel(socket_message(8009, 101) + socket_message(8010, 102), socket_message(9000, 103) + done)
    assert list(listening._listeners(kernel, socket.AF_INET)) == [(8009, 101), (8010, 102), (9000, 103)]
    ((request, address),) = kernel.sent
    assert address == (0, 0) and len(request) == 16 + 56  # nlmsghdr + inet_diag_req_v2
    assert struct.unpack_from("=IHH", request) == (72, listening.SOCK_DIAG_BY_FAMILY, 0x301)
    family, protocol, _, _, states = struct.unpack_from("=BBBBI", request, 16)
    assert (family, protocol, states) == (socket.AF_INET, socket.IPPROTO_TCP, 1 << 10)  # listening sockets only


@pytest.mark.parametrize(
    ("datagrams", "said"),
    [
        ((header(20, listening.NLMSG_ERROR) + struct.pack("=i", -1),), "sock_diag: Operation not permitted"),
        ((socket_message(8009, 101)[:-8],), "a message of length 88 at byte 0 of 80"),
        ((socket_message(8009, 101) + b"\0\0",), "2 stray bytes after the last message"),
        ((header(16 + 40, listening.SOCK_DIAG_BY_FAMILY) + bytes(40),), "a socket's message of 40 bytes, 72 expected"),
        ((socket_message(8009, 101),), "the kernel's answer ended before its end-of-dump message"),
        ((header(8, listening.NLMSG_DONE),), "a message of length 8 at byte 0 of 16"),
    ],
)
def test_an_answer_that_does_not_parse_is_one_oserror(datagrams, said):
    with pytest.raises(OSError, match=said):
        list(listening._listeners(Kernel(*datagrams), socket.AF_INET))
