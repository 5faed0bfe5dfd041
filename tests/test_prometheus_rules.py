"""Prometheus rules: promtool check + unit tests, and every alert actionable and tested firing and not firing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from servescope import series
from servescope.prometheus_config import PROMETHEUS_DIR, RULES_DIR

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.tool("prometheus")
TESTS_DIR = PROMETHEUS_DIR / "tests"


def rule_files() -> list[Path]:
    return sorted(RULES_DIR.glob("*.yml"))


def alerts() -> list[dict]:
    found = []
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            found += [rule for rule in group["rules"] if "alert" in rule]
    return found


def unit_tests() -> list[dict]:
    cases = []
    for path in sorted(TESTS_DIR.glob("*.yml")):
        for case in yaml.safe_load(path.read_text())["tests"]:
            cases += case.get("alert_rule_test", [])
    return cases


@needs_promtool
def test_promtool_check_rules():
    proc = subprocess.run([PROMTOOL, "check", "rules", *map(str, rule_files())], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
def test_promtool_unit_tests_pass():
    files = sorted(TESTS_DIR.glob("*.yml"))
    assert files
    proc = subprocess.run([PROMTOOL, "test", "rules", *map(str, files)], capture_output=True, text=True, cwd=TESTS_DIR)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
def test_promtool_unit_tests_can_fail(tmp_path):
    """A unit test expecting the wrong lever must fail: the suite is not vacuous."""
    source = (TESTS_DIR / "vllm_levers_test.yml").read_text()
    wrong = source.replace("lever: max-num-seqs", "lever: kv-cache-space", 1)
    assert wrong != source
    (tmp_path / "rules").mkdir()
    shutil.copy(RULES_DIR / "vllm_levers.yml", tmp_path / "rules" / "vllm_levers.yml")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.yml").write_text(wrong)
    proc = subprocess.run([PROMTOOL, "test", "rules", "t.yml"], capture_output=True, text=True, cwd=tmp_path / "tests")
    assert proc.returncode != 0


def test_every_alert_is_actionable():
    found = alerts()
    assert {a["alert"] for a in found} >= {
        "VllmQueueWithKvCacheToSpare",
        "VllmQueueWithKvCacheFull",
        "EngineDown",
        "OllamaInFlightAboveNumParallel",
    }
    for alert in found:
        name = alert["alert"]
        assert alert.get("for"), f"{name}: no for:"
        assert alert["labels"]["severity"] in ("warning", "critical"), name
        assert alert["annotations"]["summary"].strip(), name
        assert len(alert["annotations"]["description"].split()) >= 15, f"{name}: description too thin to act on"


def test_the_levers_name_the_seeds_flags():
    by_name = {a["alert"]: a for a in alerts()}
    spare = by_name["VllmQueueWithKvCacheToSpare"]["annotations"]
    assert "max-num-seqs" in spare["summary"] and "VLLM_MAX_NUM_SEQS" in spare["description"]
    full = by_name["VllmQueueWithKvCacheFull"]["annotations"]
    assert "VLLM_CPU_KVCACHE_SPACE" in full["summary"] and "max-model-len" in full["summary"]
    assert "Not --swap-space" in full["description"]
    ollama = by_name["OllamaInFlightAboveNumParallel"]
    assert series.PROXY_IN_FLIGHT in ollama["expr"] and series.PROXY_NUM_PARALLEL in ollama["expr"]


def test_every_alert_has_a_firing_and_a_quiet_unit_test():
    cases = unit_tests()
    for alert in alerts():
        name = alert["alert"]
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c.get("exp_alerts") for c in mine), f"{name}: no unit test where it fires"
        assert any(not c.get("exp_alerts") for c in mine), f"{name}: no unit test where it stays quiet"


def test_rules_only_use_series_that_exist():
    """Every servescope_ name in the rules is one the exporter/loadgen contract defines."""
    import re

    known = {getattr(series, n) for n in dir(series) if n.isupper() and isinstance(getattr(series, n), str)}
    text = "\n".join(p.read_text() for p in rule_files())
    used = set(re.findall(r"\b(servescope_[a-z_]+?)(?:_bucket|_sum|_count)?\b(?=[\[{(\s)])", text))
    unknown = {name for name in used if name not in known and name.removesuffix("_total") not in known}
    assert not unknown, unknown
