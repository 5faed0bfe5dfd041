"""A port already in use is one line naming the port and the knob that moves it."""

from __future__ import annotations

import socket

import pytest

from servescope.stack import ports
from servescope.stack.errors import StackError
from tests.conftest import free_port


def test_listener_makes_the_port_in_use_with_the_seeds_message():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert ports.in_use("127.0.0.1", port)
        assert ports.listening("127.0.0.1", port)
        with pytest.raises(StackError) as err:
            ports.require_free("127.0.0.1", port, "vLLM-CPU", "VLLM_PORT")
    assert str(err.value) == f"port {port} is in use (vLLM-CPU): set VLLM_PORT to another port"
    assert "\n" not in str(err.value)


def test_free_port_is_free():
    port = free_port()
    assert not ports.in_use("127.0.0.1", port)
    assert not ports.listening("127.0.0.1", port)
    ports.require_free("127.0.0.1", port, "Prometheus", "PROMETHEUS_PORT")
