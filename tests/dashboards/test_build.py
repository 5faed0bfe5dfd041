"""Grafana dashboards as code: the generator's --check, and the JSON itself (ids, datasource, units, rates, PromQL)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from dashboards import build, render
from servescope.contracts import series
from servescope.prometheus import prometheus_config

PROMTOOL = shutil.which("promtool")
BOARDS = build.build_all()


def data_panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


def exprs(board: dict) -> list[str]:
    return [t["expr"] for p in data_panels(board) for t in p["targets"]]


def committed() -> dict[str, dict]:
    return {name: json.loads((build.JSON_DIR / f"{name}.json").read_text()) for name in build.DASHBOARDS}


def test_committed_files_are_what_the_generator_writes():
    assert build.main(["--check"]) == 0


def test_check_fails_when_stale_or_extra(tmp_path, monkeypatch, capsys):
    here = tmp_path / "dashboards"
    json_dir = here / "json"
    monkeypatch.setattr(build, "HERE", here)
    monkeypatch.setattr(build, "JSON_DIR", json_dir)
    monkeypatch.setattr(build, "DATASOURCE_FILE", here / "provisioning" / "datasources" / "prometheus.yml")
    monkeypatch.setattr(build, "PROVIDER_FILE", here / "provisioning" / "dashboards" / "servescope.yml")
    assert build.main(["--check"]) == 1  # nothing written yet
    assert build.main([]) == 0
    assert build.main(["--check"]) == 0
    capsys.readouterr()
    board = json_dir / "vllm.json"
    board.write_text(board.read_text().replace("$__rate_interval", "5m", 1))
    assert build.main(["--check"]) == 1
    assert capsys.readouterr().err.splitlines()[0] == "stale: dashboards/json/vllm.json"
    build.main([])
    (json_dir / "hand-made.json").write_text("{}")
    assert build.main(["--check"]) == 1
    assert "not generated (remove it): dashboards/json/hand-made.json" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(build.DASHBOARDS))
def test_panel_ids_unique_and_grid_fits(name):
    board = committed()[name]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, panel["title"]


@pytest.mark.parametrize("name", sorted(build.DASHBOARDS))
def test_every_panel_uses_the_provisioned_datasource(name):
    provisioned = yaml.safe_load(build.DATASOURCE_FILE.read_text())["datasources"]
    assert [d["uid"] for d in provisioned] == [build.DATASOURCE_UID]
    board = committed()[name]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    # Panels point at ${datasource}, whose default is the provisioned uid.
    assert variables["datasource"]["current"]["value"] == build.DATASOURCE_UID
    for panel in data_panels(board):
        uids = {panel["datasource"]["uid"], *(t["datasource"]["uid"] for t in panel["targets"])}
        assert uids <= {"${datasource}", build.DATASOURCE_UID}, panel["title"]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            assert var["datasource"]["uid"] == "${datasource}"


@pytest.mark.parametrize("name", sorted(build.DASHBOARDS))
def test_every_panel_has_a_unit_and_a_description(name):
    for panel in data_panels(committed()[name]):
        assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]
        assert panel.get("description"), panel["title"]
        assert panel["targets"], panel["title"]


@pytest.mark.parametrize("name", sorted(build.DASHBOARDS))
def test_every_range_is_rate_interval(name):
    for expr in exprs(committed()[name]):
        ranges = re.findall(r"\[([^\]]+)\]", expr)
        assert all(r == "$__rate_interval" for r in ranges), expr
        assert expr.count("rate(") == expr.count("[$__rate_interval])"), expr


def test_variables_datasource_engine_instance_model():
    for name in ("engine-comparison", "vllm", "ollama"):
        names = [v["name"] for v in BOARDS[name]["templating"]["list"]]
        assert names == ["datasource", "engine", "instance", "model"], name
    assert [v["name"] for v in BOARDS["load-test"]["templating"]["list"]] == ["datasource", "engine", "scenario"]
    engine = BOARDS["vllm"]["templating"]["list"][1]
    assert (engine["type"], engine["query"], engine["hide"]) == ("constant", "vllm", 2)


def test_comparison_dashboard_has_the_issue_panels():
    titles = [p["title"] for p in data_panels(BOARDS["engine-comparison"])]
    for wanted in (
        "Engine up",
        "Running requests",
        "Waiting requests",
        "KV cache usage",
        "Output tokens/s (server)",
        "TTFT (server)",
        "ITL (server)",
        "TTFT (client)",
        "ITL (client)",
        "Requests/s (client)",
        "Errors/s (client)",
    ):
        assert wanted in titles
    all_exprs = "\n".join(exprs(BOARDS["engine-comparison"]))
    for metric in series.LEVER_GAUGES:
        assert metric in all_exprs


def test_load_phase_annotations_match_what_annotations_posts():
    for board in BOARDS.values():
        phases = [a for a in board["annotations"]["list"] if a.get("name") == "Load phases"]
        assert phases and phases[0]["target"]["tags"] == list(build.PHASE_TAGS)
        assert phases[0]["target"]["matchAny"] is False


def test_provisioning_interval_equals_the_scrape_interval():
    ds = yaml.safe_load(build.DATASOURCE_FILE.read_text())["datasources"][0]
    compose = yaml.safe_load(prometheus_config.COMPOSE_CONFIG.read_text())
    assert (
        ds["jsonData"]["timeInterval"]
        == compose["global"]["scrape_interval"]
        == prometheus_config.DEFAULT_SCRAPE_INTERVAL
    )
    provider = yaml.safe_load(build.PROVIDER_FILE.read_text())["providers"][0]
    assert provider["options"]["path"] == build.GRAFANA_DASHBOARDS_PATH


def test_servescope_names_in_dashboards_exist_in_the_contract():
    known = {getattr(series, n) for n in dir(series) if n.isupper() and isinstance(getattr(series, n), str)}
    for board in BOARDS.values():
        variable_queries = [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
        for expr in exprs(board) + variable_queries:
            # Every name, with a selector or bare (label_values(servescope_engine_up, engine) has none).
            for name in re.findall(r"\b(servescope_[a-z_]+)\b", expr):
                # Exactly a contract name, or a histogram's _bucket/_sum/_count of one (never name + _total).
                assert name in known or re.sub(r"_(bucket|sum|count)$", "", name) in known, name


@pytest.mark.tool("prometheus")
def test_every_query_is_valid_promql(tmp_path):
    """promtool parses each query (variables substituted as Grafana would) as a recording rule."""
    rules = []
    for name, board in BOARDS.items():
        for index, expr in enumerate(exprs(board)):
            query = render.substitute(expr, {}, step=15, rate_interval="1m")
            assert "$" not in query, query
            rules.append({"record": f"check:{name.replace('-', '_')}:{index}", "expr": query})
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    proc = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(rules)} rules found" in proc.stdout


def test_promql_helpers():
    assert build.sel("m", {"engine": "=~$engine"}, outcome="!=ok") == 'm{engine=~"$engine",outcome!="ok"}'
    assert build.rate("m") == "rate(m[$__rate_interval])"
    assert build.quantile(0.5, ["a_bucket", "b_bucket"], ["instance"]) == (
        "histogram_quantile(0.5, sum by (instance, le) (rate(a_bucket[$__rate_interval]) or rate(b_bucket[$__rate_interval])))"
    )
    with pytest.raises(ValueError, match="operator"):
        build.sel("m", {"engine": "vllm"})


def test_render_substitutes_like_grafana():
    assert render.rate_interval_for(5) == "20s"  # 4 x 5s scrape
    assert render.rate_interval_for(60) == "65s"  # step + scrape
    assert render.step_for(0, 1800) == 6
    expr = 'rate(m{engine=~"$engine",instance=~"${instance}"}[$__rate_interval])'
    assert render.substitute(expr, {"engine": "vllm"}, step=5, rate_interval="20s") == (
        'rate(m{engine=~"vllm",instance=~".*"}[20s])'
    )
    assert render.legend_text("{{engine}} {{instance}} p50", {"engine": "vllm", "instance": "a"}) == "vllm a p50"
    assert render.legend_text("", {"engine": "vllm"}) == "engine=vllm"


@pytest.mark.tool("prometheus")
def test_failures_query_gives_failures_and_zero_where_none(tmp_path):
    """The load-test Failures/s query, evaluated by promtool on known series: one failing engine, one clean."""
    panel = next(p for p in data_panels(BOARDS["load-test"]) if p["title"] == "Failures/s")
    query = render.substitute(panel["targets"][0]["expr"], {}, step=15, rate_interval="1m")
    (tmp_path / "empty.yml").write_text("groups: []\n")
    test = {
        "rule_files": ["empty.yml"],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [
                    {
                        "series": 'servescope_client_requests_total{engine="vllm",scenario="burst",outcome="ok"}',
                        "values": "0+15x8",
                    },
                    {
                        "series": 'servescope_client_requests_total{engine="vllm",scenario="burst",outcome="http_5xx"}',
                        "values": "0+3x8",
                    },
                    {
                        "series": 'servescope_client_requests_total{engine="ollama",scenario="burst",outcome="ok"}',
                        "values": "0+15x8",
                    },
                ],
                "promql_expr_test": [
                    {
                        "expr": query,
                        "eval_time": "2m",
                        "exp_samples": [
                            {"labels": '{engine="vllm",scenario="burst",outcome="http_5xx"}', "value": 0.2},
                            {"labels": '{engine="ollama",scenario="burst"}', "value": 0},
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "t.yml").write_text(yaml.safe_dump(test))
    proc = subprocess.run([PROMTOOL, "test", "rules", "t.yml"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_render_cli_unreachable_prometheus_is_one_line(tmp_path, capsys):
    from tests.conftest import free_port

    code = render.main(["--prometheus", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "png")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unreachable" in err
    assert not list(tmp_path.glob("png/*.png"))


def test_ollamas_concurrency_is_what_the_proxy_observed_and_its_queue_comes_from_ollamas_durations():
    """BUG at 7b2f789: the Ollama board drew requests in flight against OLLAMA_NUM_PARALLEL as the
    queue, and the comparison board called Ollama's running min(in flight, OLLAMA_NUM_PARALLEL): the knob's split."""
    ollama = exprs(BOARDS["ollama"])
    proxy = f'{series.SOURCE}="{series.PROXY_SOURCE}"'
    for gauge in (series.REQUESTS_RUNNING, series.REQUESTS_WAITING):
        assert any(gauge in expr and proxy in expr for expr in ollama), gauge
    assert any(f"{series.PROXY_QUEUE_SECONDS}_sum" in expr for expr in ollama)
    assert not any(series.PROXY_IN_FLIGHT in expr for expr in ollama)
    for board in BOARDS.values():
        for panel in data_panels(board):
            assert "min(in flight" not in panel.get("description", ""), panel["title"]


def test_the_builder_names_no_engine_kind():
    """Each engine's panels and words are in its adapter (issue 43 item 4c): build.py reads them from the registry."""
    from servescope import engines

    text = (build.HERE / "build.py").read_text()
    names = "|".join(re.escape(name) for name in engines.ENGINES)
    assert not re.findall(rf"\b({names})\b", text, re.IGNORECASE)
    constants = "|".join(n for n in dir(engines) if isinstance(getattr(engines, n), engines.EngineKind))
    assert not re.findall(rf"\b({constants})\b", text)  # no adapter constant either
    assert {name for name, kind in engines.ENGINES.items() if kind.dashboard.panels} <= set(build.DASHBOARDS)
