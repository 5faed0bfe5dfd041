"""loadgen/manifest.py: the machine a run was made on, described without starting a process."""

from __future__ import annotations

import os
import platform
import subprocess

import pytest

from loadgen import manifest


def test_the_machine_is_described_as_platform_does_without_a_child_process(monkeypatch):
    # platform.platform() looks the processor up with `uname -p` in a child process (a fork of a load generator).
    monkeypatch.setattr(platform, "_uname_cache", None)  # as in a fresh process: nothing looked up yet
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail(f"a child process: {a}"))
    described = manifest.machine()["platform"]
    system = os.uname()
    assert described.startswith(f"{system.sysname}-{system.release}-{system.machine}")
    libc = "".join(platform.libc_ver())
    assert described.endswith(f"-with-{libc}" if libc else system.machine)
