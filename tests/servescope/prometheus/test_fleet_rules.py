"""Fleet-mode rules (servescope/prometheus/fleet_rules.py): generated from the adapters, and equal to the exporter on real pages."""

from __future__ import annotations

import json
import shutil
import subprocess
from contextlib import contextmanager

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import Config, Instance
from exporter.server import build as build_exporter
from servescope import engines
from servescope.contracts import series
from servescope.prometheus import fleet_rules
from tests.doubles.recorded_engine import RecordedEngine, fixture, vllm_engine
from tests.servescope.engines.test_sglang import sglang_engine

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.tool("prometheus")

# Each engine kind's recorded page (llama.cpp's second one counts cached prompt tokens: the `plus` sum is exercised).
PAGES = {
    "vllm": "vllm-0.32.0-cpu-metrics-burst.txt",
    "llamacpp": "llamacpp-11434.0.0-metrics-busy.txt",
    "sglang": "sglang-0.5-metrics-from-docs.txt",
}
CASES = [*PAGES.items(), ("llamacpp", "llamacpp-11434.0.0-metrics-after-two.txt")]


def llamacpp_engine(page: str) -> RecordedEngine:
    engine = RecordedEngine()
    engine.set_text("/metrics", fixture(page))
    for path, name in (("/props", "props"), ("/slots", "slots-busy"), ("/v1/models", "v1-models")):
        engine.set_json(path, json.loads(fixture(f"llamacpp-11434.0.0-{name}.json")))
    return engine


@contextmanager
def recorded(kind: str, page: str):
    if kind == "vllm":
        with vllm_engine(page) as engine:
            yield engine
    elif kind == "llamacpp":
        with llamacpp_engine(page) as engine:
            yield engine
    else:
        with sglang_engine(fixture(page)) as engine:
            yield engine


def exported(
    kind: str, *, fleet: bool, page: str | None = None
) -> tuple[dict[tuple[str, tuple], float], RecordedEngine]:
    """Every sample the exporter gives for one recorded engine: (name, sorted labels) -> value."""
    with recorded(kind, page or PAGES[kind]) as engine:
        exporter = build_exporter(
            Config(instances=(Instance(kind=kind, name=f"{kind}-a", url=engine.url),), fleet=fleet)
        )
        registry: CollectorRegistry = exporter.registry
        found = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in registry.collect()
            for sample in family.samples
            if sample.name.startswith(series.PREFIX)
        }
        exporter.close()
    return found, engine


def input_series(page: str, labels: dict[str, str]) -> list[dict]:
    """The recorded page as Prometheus stores one scrape of it, with the target's labels added."""
    lines = []
    for family in text_string_to_metric_families(fixture(page)):
        for sample in family.samples:
            merged = {**sample.labels, **labels}
            shown = ",".join(f"{key}={json.dumps(value)}" for key, value in sorted(merged.items()))
            lines.append({"series": f"{sample.name}{{{shown}}}", "values": repr(float(sample.value))})
    return lines


def promtool_test(tmp_path, page: str, expected: dict[tuple[str, tuple], float], target: dict[str, str]) -> str:
    """A promtool unit test: the rules over the recorded page must give exactly `expected`."""
    by_name: dict[str, list] = {}
    for (name, labels), value in sorted(expected.items()):
        shown = ",".join(f"{key}={json.dumps(val)}" for key, val in labels)
        by_name.setdefault(name, []).append({"labels": f"{name}{{{shown}}}", "value": value})
    test = {
        "rule_files": [str(fleet_rules.RULES_FILE)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": input_series(page, target),
                "promql_expr_test": [
                    {"expr": name, "eval_time": "0m", "exp_samples": samples} for name, samples in by_name.items()
                ],
            }
        ],
    }
    path = tmp_path / f"{page}.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    return str(path)


def test_committed_rules_are_the_adapters(monkeypatch, tmp_path):
    """The committed file is what the generator renders; a stale one fails --check."""
    assert fleet_rules.main(["--check"]) == 0
    stale = tmp_path / "prometheus" / "fleet" / "neutral.yml"
    stale.parent.mkdir(parents=True)
    stale.write_text(fleet_rules.rendered().replace("vllm:num_requests_waiting", "vllm:num_requests_queued"))
    monkeypatch.setattr(fleet_rules, "RULES_FILE", stale)
    monkeypatch.setattr(fleet_rules, "REPO_ROOT", tmp_path)
    assert fleet_rules.main(["--check"]) == 1
    assert fleet_rules.main(["--write"]) == 0 and fleet_rules.main(["--check"]) == 0


def test_every_page_source_has_a_rule_with_the_neutral_labels():
    groups = yaml.safe_load(fleet_rules.RULES_FILE.read_text())["groups"]
    made = {(rule["record"], rule["labels"]["engine"]) for group in groups for rule in group["rules"]}
    for adapter in fleet_rules.adapters():
        assert {(name, adapter.name) for name in adapter.metrics.page_series} <= made
    assert engines.OLLAMA.name not in {engine for _, engine in made}  # no page: the exporter's alone


@needs_promtool
def test_promtool_checks_the_rules():
    proc = subprocess.run([PROMTOOL, "check", "rules", str(fleet_rules.RULES_FILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
@pytest.mark.parametrize("kind, page", CASES, ids=[page for _, page in CASES])
def test_rules_give_what_the_exporter_gives_on_the_recorded_page(tmp_path, kind, page):
    """One source of truth: the exporter's collector on the page is the expected output of the rules on that page."""
    adapter = engines.kind(kind)
    found, _ = exported(kind, fleet=False, page=page)
    expected = {key: value for key, value in found.items() if key[0] in adapter.metrics.page_series}
    assert {name for name, _ in expected} >= {series.REQUESTS_RUNNING, series.REQUESTS_WAITING}
    model = dict(next(iter(expected))[1]).get("model")
    # llama.cpp's page names no model: the scrape target's label carries it (docs/fleet.md)
    target = {"instance": f"{kind}-a", "job": kind, **({"model": model} if adapter.metrics.model_label is None else {})}
    path = promtool_test(tmp_path, page, expected, target)
    proc = subprocess.run([PROMTOOL, "test", "rules", path], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
def test_the_comparison_can_fail(tmp_path):
    """An expected value off by one must fail promtool: the comparison is not vacuous."""
    found, _ = exported("vllm", fleet=False)
    expected = {key: value for key, value in found.items() if key[0] in engines.VLLM.metrics.page_series}
    key = next(k for k in expected if k[0] == series.REQUESTS_WAITING)
    expected[key] += 1
    path = promtool_test(tmp_path, PAGES["vllm"], expected, {"instance": "vllm-a", "job": "vllm"})
    proc = subprocess.run([PROMTOOL, "test", "rules", path], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode != 0


@pytest.mark.parametrize("kind", list(PAGES))
def test_fleet_mode_exports_nothing_the_rules_make(kind):
    """One source per series: in fleet mode exporter output and rule output share no (series, engine)."""
    adapter = engines.kind(kind)
    rules = {(name, adapter.name) for name in fleet_rules.made(adapter)}
    fleet, _ = exported(kind, fleet=True)
    exporter_mode, _ = exported(kind, fleet=False)
    in_fleet = {(name, dict(labels).get("engine")) for name, labels in fleet}
    in_exporter_mode = {(name, dict(labels).get("engine")) for name, labels in exporter_mode}
    assert not in_fleet & rules
    assert in_exporter_mode & rules  # the exporter path does give them
    # Between the two paths nothing the exporter mode gives is lost: what the rules leave, the exporter still gives.
    assert in_exporter_mode - rules <= in_fleet
    assert (series.ENGINE_UP, adapter.name) in in_fleet


def test_fleet_mode_keeps_what_no_page_gives_and_skips_a_page_it_does_not_need():
    fleet, _ = exported("vllm", fleet=True)
    names = {name for name, _ in fleet}
    assert {series.KV_CAPACITY_TOKENS, series.KV_BLOCKS, series.ENGINE_INFO} <= names  # cache_config_info, /version
    fleet, engine = exported("llamacpp", fleet=True)
    names = {name for name, _ in fleet}
    assert {series.KV_CACHE_USAGE, series.KV_CAPACITY_TOKENS} <= names  # from /slots
    assert engine.hits.get("/metrics", 0) == 0 and engine.hits.get("/slots", 0) >= 1
