"""servescope/stack/provision.py and the suite's missing-tool policy: one line per missing tool, skip locally, fail under CI=true."""

from __future__ import annotations

import pytest
from _pytest.outcomes import Failed, Skipped

from servescope.stack import provision
from tests import conftest


def which_only(*present: str):
    return lambda command: f"/usr/bin/{command}" if command in present else None


def test_every_purpose_names_known_tools():
    for names in provision.PURPOSES.values():
        assert set(names) <= set(provision.TOOLS)
    assert "prometheus" in provision.PURPOSES["up"]


def test_missing_tools_are_one_line_each_when_apt_cannot_be_used(monkeypatch, capsys):
    monkeypatch.setattr(provision, "can_use_apt", lambda: False)
    missing = provision.ensure(["prometheus", "chromium"], which=which_only("prometheus", "chromium"))
    assert [tool.name for tool in missing] == ["prometheus", "chromium"]
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "missing: prometheus (promtool) for the native stack's Prometheus; rule and config tests: "
        "apt-get install prometheus (Debian/Ubuntu), or your system's packages for prometheus, promtool",
        "missing: chromium (chromedriver) for Locust web UI tests in a headless browser: "
        "apt-get install chromium chromium-driver (Debian/Ubuntu), or your system's packages for chromium, chromedriver",
    ]


def test_apt_installs_every_missing_package_in_one_call_then_rechecks(monkeypatch, tmp_path):
    monkeypatch.setenv("SERVESCOPE_CACHE", str(tmp_path))
    monkeypatch.setattr(provision, "can_use_apt", lambda: True)
    installed: set[str] = {"docker-compose"}
    calls = []

    def apt_install(packages, log):
        calls.append(sorted(packages))
        installed.update({"prometheus", "promtool"})  # the prometheus package brings both
        return True

    monkeypatch.setattr(provision, "apt_install", apt_install)
    missing = provision.ensure(
        ["prometheus", "docker-compose", "chromium"], which=lambda c: c if c in installed else None
    )
    assert calls == [["chromium", "chromium-driver", "prometheus"]]
    assert [tool.name for tool in missing] == ["chromium"]  # still missing after apt: reported, not hidden


def test_nothing_to_do_when_everything_is_present(monkeypatch):
    monkeypatch.setattr(provision, "apt_install", lambda *a: pytest.fail("nothing is missing: no apt-get"))
    assert provision.ensure(provision.PURPOSES["test"], which=lambda c: f"/bin/{c}") == []


def test_missing_tool_skips_locally_and_fails_under_ci(monkeypatch):
    monkeypatch.setattr(provision.shutil, "which", lambda command: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(Skipped, match="docker-compose not installed"):
        conftest.require_tool("docker-compose")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(Failed, match="CI=true"):
        conftest.require_tool("docker-compose")
