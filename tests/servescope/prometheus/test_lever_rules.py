"""Prometheus rules: promtool check + unit tests, and every alert actionable and tested firing and not firing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from servescope import engines
from servescope.contracts import series
from servescope.prometheus.prometheus_config import PROMETHEUS_DIR, RULES_DIR

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
        "OllamaRequestsQueued",
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
    ollama = by_name["OllamaRequestsQueued"]
    assert "OLLAMA_NUM_PARALLEL" in ollama["annotations"]["summary"]


def test_ollamas_alert_reads_what_was_observed_never_in_flight_against_the_knob():
    """BUG at 7b2f789: Ollama's alert compared requests in flight with the configured
    OLLAMA_NUM_PARALLEL ("the rest queue unseen") and then recommended raising it: the knob's assumption read back
    as a measurement. It reads Ollama's own durations as the proxy saw them, with the report's threshold."""
    from servescope.contracts import thresholds

    expressions = [rule["expr"] for rule in alerts() if rule["labels"].get("lever") == "ollama-num-parallel"]
    assert expressions, "no alert names OLLAMA_NUM_PARALLEL"
    for expr in expressions:
        assert series.PROXY_NUM_PARALLEL not in expr and series.PROXY_IN_FLIGHT not in expr, expr
        assert f"{series.PROXY_QUEUE_SECONDS}_sum" in expr and f"{series.PROXY_QUEUE_SECONDS}_count" in expr, expr
        assert expr.rstrip().endswith(f">= {thresholds.TTFT_QUEUED_MIN_S:g}"), expr


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


def test_lever_rules_are_the_threshold_tables(monkeypatch, tmp_path, capsys):
    """The committed lever rules are what servescope/prometheus/lever_rules.py renders from the table; a stale one fails --check."""
    from servescope.contracts import thresholds
    from servescope.prometheus import lever_rules

    assert lever_rules.main(["--check"]) == 0
    text = (RULES_DIR / "vllm_levers.yml").read_text()
    assert f"< {thresholds.KV_ROOM:g}\n" in text and f">= {thresholds.KV_FULL:g}\n" in text
    assert f"[{thresholds.ALERT_WINDOW}]" in text and f"for: {thresholds.ALERT_FOR}\n" in text
    stale = tmp_path / "vllm_levers.yml"
    stale.write_text(text.replace(f"< {thresholds.KV_ROOM:g}", "< 0.7"))
    monkeypatch.setattr(lever_rules, "FILES", {stale: lambda: lever_rules.levers(engines.VLLM)})
    monkeypatch.setattr(lever_rules, "REPO_ROOT", tmp_path)
    assert lever_rules.main(["--check"]) == 1
    assert "vllm_levers.yml is stale" in capsys.readouterr().err


@needs_promtool
def test_the_alert_rules_and_the_verdict_pick_the_same_vllm_lever(tmp_path):
    """One table, two readers: for the same waiting and KV series, the generated alert expressions fire exactly
    where servescope/report/verdict.py names the same lever (both read the KV pool's highest and mean usage while waiting)."""
    from servescope.contracts import thresholds
    from servescope.prometheus import lever_rules
    from servescope.report.gauges import EngineGauges
    from servescope.report.load import EngineInfo
    from servescope.report.verdict import decide

    room, full = thresholds.KV_ROOM, thresholds.KV_FULL
    patterns = {
        "below-room": [room - 0.01],
        "at-room": [room],
        "between": [(room + full) / 2],
        "at-full": [full],
        "spiky": [room - 0.1, full + 0.05],  # touched full, never pinned: neither
        "pinned": [room + 0.05, 0.99, 0.99],  # mean past full while waiting: the KV pool
    }
    info = EngineInfo("vllm", "vllm", flags={"max-num-seqs": 8})
    rules = {r["alert"]: r["expr"] for g in lever_rules.levers(engines.VLLM)["groups"] for r in g["rules"]}
    lever_of_alert = {
        "VllmQueueWithKvCacheToSpare": "max_num_seqs",
        "VllmQueueWithKvCacheFull": "kv_cache_space_or_max_model_len",
    }
    series_lines, expected = [], {name: [] for name in rules}
    for name, pattern in patterns.items():
        values = (pattern * 40)[:29]
        window = values[-5:]  # the last minute at a 15 s interval, what [1m] sees at 7m
        eg = EngineGauges("vllm", "vllm", kv_while_waiting=(max(window), sum(window) / len(window)))
        lever = decide(
            info,
            {series.REQUESTS_RUNNING: 8, series.REQUESTS_WAITING: 2, series.KV_CACHE_USAGE: max(window)},
            gauges=eg,
        ).lever
        labels = f'engine="vllm",instance="{name}",model="m"'
        series_lines += [
            {"series": f"{series.REQUESTS_WAITING}{{{labels}}}", "values": " ".join(["2"] * 29)},
            {"series": f"{series.KV_CACHE_USAGE}{{{labels}}}", "values": " ".join(f"{v:g}" for v in values)},
        ]
        for alert, alert_lever in lever_of_alert.items():
            if lever == alert_lever:
                expected[alert].append({"labels": f"{{{labels}}}", "value": 2})
    fired = {alert: {e["labels"].split('instance="')[1].split('"')[0] for e in exp} for alert, exp in expected.items()}
    assert fired == {
        "VllmQueueWithKvCacheToSpare": {"below-room"},
        "VllmQueueWithKvCacheFull": {"at-full", "pinned"},
    }
    test = {
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": series_lines,
                "promql_expr_test": [
                    {"expr": expr, "eval_time": "7m", "exp_samples": expected[alert]} for alert, expr in rules.items()
                ],
            }
        ],
    }
    (tmp_path / "agree.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    proc = subprocess.run([PROMTOOL, "test", "rules", "agree.yml"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
