"""`python -m exporter check` on the drift it exists for, and on input that carries a password or forges a line
(issue 42 cases 12 and 14)."""

from __future__ import annotations

import pytest

from exporter import check
from tests.doubles.hostile_http import Hostile, reply

pytestmark = pytest.mark.timeout(120)


def drifted(version: str = "0.99.0") -> dict[str, bytes]:
    """A vLLM whose page carries `vllm:` series, none of those servescope reads."""
    page = "# TYPE vllm:brand_new_gauge gauge\nvllm:brand_new_gauge 1\nvllm:other_total 3\n"
    return {"/metrics": reply(page), "/version": reply({"version": version}), "/v1/models": reply({"data": []})}


def test_a_page_with_engine_series_but_none_it_reads_is_every_reading_gone(capsys):
    """Was a ValueError out of servescope/prometheus/exposition.py: the exporter's collector found none of its series."""
    with Hostile(drifted()) as engine:
        code = check.main([engine.url])
    out, err = capsys.readouterr()
    assert code == check.EXIT_GONE and err == "", err
    lines = out.splitlines()
    assert lines[0] == f"vLLM-CPU 0.99.0 at {engine.url}"
    assert any("vllm:num_requests_running" in line and "gone" in line for line in lines)
    assert lines[-1].startswith("  summary: ") and " 0 current" in lines[-1]


def test_a_version_cannot_forge_a_line_of_the_checks_own(capsys):
    with Hostile(drifted("0.32.0\nok: everything is fine\x1b[2J")) as engine:
        check.main([engine.url])
    out = capsys.readouterr().out
    assert not any(line.startswith("ok:") for line in out.splitlines()) and "\x1b" not in out
    assert "0.32.0 ok: everything is fine[2J at" in out.splitlines()[0]


@pytest.mark.parametrize("spec", ["bob:PW@127.0.0.1:1", "vllm=bob:PW@127.0.0.1:1", "http://bob:PW@127.0.0.1:1"])
def test_a_password_in_a_target_is_never_printed(capsys, spec):
    assert check.main([spec, "--timeout", "2"]) == check.EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert "PW" not in out + err and err.startswith("check: ") and err.count("\n") == 1, err
