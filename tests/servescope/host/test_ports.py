"""servescope.host.ports: listening ports outside the ephemeral range, apart per process share, skipping held ones."""

from __future__ import annotations

import socket

from servescope.host import ports


def test_the_candidates_stay_below_the_ephemeral_range():
    candidates = ports.listen_candidates(ephemeral=(25000, 60999))
    assert candidates.start == ports.LISTEN_RANGE[0] and candidates.stop == 25000


def test_a_range_apart_from_the_ephemeral_one_is_kept_whole():
    assert ports.listen_candidates(ephemeral=(32768, 60999)) == range(*ports.LISTEN_RANGE)


def test_shares_do_not_overlap():
    shares = [set(ports.listen_candidates((i, 3), ephemeral=(32768, 60999))) for i in range(3)]
    assert all(shares) and not (shares[0] & shares[1] or shares[1] & shares[2] or shares[0] & shares[2])


def test_the_ephemeral_range_is_read_from_the_kernel_file(tmp_path):
    file = tmp_path / "ip_local_port_range"
    file.write_text("40000\t50000\n")
    assert ports.ephemeral_range(file) == (40000, 50000)
    assert ports.ephemeral_range(tmp_path / "missing") == ports.DEFAULT_EPHEMERAL


def test_two_picks_before_either_is_bound_differ_and_are_outside_the_ephemeral_range():
    low, high = ports.ephemeral_range()
    first, second = ports.free_port(), ports.free_port()
    assert first != second
    assert not (low <= first <= high) and not (low <= second <= high)


def test_a_held_port_is_skipped(monkeypatch):
    # The held port comes from outside the ephemeral range and the search gets fifty candidates after it: a parallel
    # run's outgoing connection once held the single port next to a kernel-picked one (CI, stop 48).
    with socket.socket() as held:
        held.bind(("127.0.0.1", ports.free_port()))
        held.listen()
        port = held.getsockname()[1]
        monkeypatch.setattr(ports, "LISTEN_RANGE", (port, port + 50))
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 1025))
        monkeypatch.setattr(ports, "_cursor", port)
        picked = ports.free_port(share=(0, 1))
        assert port < picked < port + 50


def test_no_candidates_falls_back_to_the_kernels_pick(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (100, 60999))
    monkeypatch.setattr(ports, "LISTEN_RANGE", (20000, 30000))
    with socket.socket() as probe:
        port = ports.free_port()
        probe.bind(("127.0.0.1", port))  # it was free
