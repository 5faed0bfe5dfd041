"""Fleet-mode scrape configs (servescope/prometheus/fleet_config.py): discovery, the mode's rules, and a real Prometheus on them."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
import yaml

from servescope.contracts import metrics_mode, series
from servescope.contracts.runfolder import RunFolder
from servescope.prometheus import fleet_config
from servescope.prometheus import prometheus_config as pc
from servescope.prometheus.sampler import FROM_PROMETHEUS, Sampler
from servescope.stack import prometheus as stack_prometheus
from tests.doubles.recorded_engine import vllm_engine

PROMTOOL = shutil.which("promtool")
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_file_and_dns_discovery_render_one_job_per_kind(tmp_path):
    fleet = fleet_config.discovered(
        [f"vllm={tmp_path / 'a.json'}", f"vllm={tmp_path / 'b.json'}"], ["llamacpp=llama.fleet.internal:8080"]
    )
    config = yaml.safe_load(fleet_config.render(fleet, exporter="127.0.0.1:9464"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"exporter", "vllm-fleet", "llamacpp-fleet"}
    assert jobs["vllm-fleet"]["file_sd_configs"][0]["files"] == [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    assert jobs["llamacpp-fleet"]["dns_sd_configs"] == [
        {"names": ["llama.fleet.internal"], "type": "A", "port": 8080, "refresh_interval": "30s"}
    ]
    assert jobs["exporter"]["honor_labels"] is True
    assert str(pc.MODE_DIR / "fleet" / "*.yml") in config["rule_files"]


@pytest.mark.tool("prometheus")
def test_promtool_accepts_the_fleet_config(tmp_path):
    (tmp_path / "vllm.json").write_text(pc.file_sd([("127.0.0.1:8000", {"instance": "vllm-a"})]))
    config = tmp_path / "prometheus.yml"
    config.write_text(fleet_config.render(fleet_config.discovered([f"vllm={tmp_path / 'vllm.json'}"], [])))
    proc = subprocess.run([PROMTOOL, "check", "config", str(config)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "neutral.yml" in proc.stdout  # the fleet rules were found and checked


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--dns", "ollama=ollama:11434"], "ollama has no /metrics page"),
        (["--dns", "vllm=vllm"], "not host:port"),
        (["--file-sd", "targets.json"], "expected KIND="),
        (["--file-sd", "triton=targets.json"], "unknown engine kind 'triton'"),
        ([], "at least one"),
    ],
)
def test_bad_discovery_options_are_one_line_and_exit_2(capsys, argv, said):
    assert fleet_config.main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1


def test_one_knob_picks_the_rules_natively_and_in_compose():
    fleet = stack_prometheus.rule_files(mode=metrics_mode.FLEET)
    exporter = stack_prometheus.rule_files(mode=metrics_mode.EXPORTER)
    assert any(path.endswith("mode/fleet/neutral.yml") for path in fleet)
    assert not any("/mode/" in path for path in exporter)
    assert set(exporter) < set(fleet)
    compose = yaml.safe_load((pc.REPO_ROOT / "docker-compose.yml").read_text())["services"]
    assert "./prometheus/mode/${METRICS_MODE:-exporter}:/etc/prometheus/mode:ro" in compose["prometheus"]["volumes"]
    assert compose["exporter"]["environment"][metrics_mode.KNOB] == "${METRICS_MODE:-exporter}"
    assert "/etc/prometheus/mode/*.yml" in yaml.safe_load(pc.COMPOSE_CONFIG.read_text())["rule_files"]
    for mode in metrics_mode.MODES:
        assert (pc.MODE_DIR / mode).is_dir()  # what the Compose mount names exists for every mode


def test_a_misspelt_mode_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="METRICS_MODE='fleat': expected exporter or fleet"):
        metrics_mode.parse("fleat")
    from exporter import cli, config

    monkeypatch.setenv(metrics_mode.KNOB, "fleat")
    with pytest.raises(config.ConfigError, match="^config error: METRICS_MODE: 'fleat': expected exporter or fleet$"):
        config.load(cli.build_parser().parse_args(["--vllm-url", "http://127.0.0.1:8000"]))
    monkeypatch.setenv(metrics_mode.KNOB, "Fleet")
    assert config.load(cli.build_parser().parse_args(["--vllm-url", "http://127.0.0.1:8000"])).fleet
    # the flag wins over the knob
    args = cli.build_parser().parse_args(["--vllm-url", "http://127.0.0.1:8000", "--metrics-mode", "exporter"])
    assert not config.load(args).fleet


def test_real_prometheus_makes_the_neutral_series_from_discovered_engines(prometheus_server, tmp_path):
    """Two recorded vLLM pages found through a target file: the rules give each its own instance's series."""
    with vllm_engine("vllm-0.32.0-cpu-metrics-burst.txt") as a, vllm_engine("vllm-0.32.0-cpu-metrics-idle.txt") as b:
        targets = tmp_path / "vllm.json"
        targets.write_text(
            pc.file_sd(
                [(a.url.removeprefix("http://"), {"instance": "a"}), (b.url.removeprefix("http://"), {"instance": "b"})]
            )
        )
        fleet = fleet_config.discovered([f"vllm={targets}"], [])
        prometheus_server.start(
            fleet_config.render(fleet, scrape_interval="1s", rule_files=(str(pc.MODE_DIR / "fleet" / "*.yml"),))
        )
        query = f'{series.REQUESTS_WAITING}{{engine="vllm"}}'
        found = prometheus_server.wait_for(query, timeout=40)
        for _ in range(80):  # both targets discovered, scraped and evaluated; at most 40 s
            if len(found) >= 2:
                break
            time.sleep(0.5)
            found = prometheus_server.query(query)
        by_instance = {r["metric"]["instance"]: r for r in found}
        assert set(by_instance) == {"a", "b"}
        assert float(by_instance["a"]["value"][1]) == 5.0 and float(by_instance["b"]["value"][1]) == 0.0
        # The run's own samples in fleet mode: one read of Prometheus' query API gives each instance its record.
        folder = RunFolder.create(tmp_path / "results", "fleet-samples")
        records = Sampler(folder, prometheus_server.url, 1.0, kind=FROM_PROMETHEUS).read_once()
        sampled = {(r.engine, r.instance): r for r in records}
        assert set(sampled) == {("vllm", "a"), ("vllm", "b")}
        assert sampled[("vllm", "a")].values[series.REQUESTS_WAITING] == 5.0
        assert sampled[("vllm", "b")].values[series.REQUESTS_WAITING] == 0.0
        assert sampled[("vllm", "a")].missing is None and series.REQUESTS_RUNNING in sampled[("vllm", "a")].values
        assert {r["metric"]["model"] for r in found} == {MODEL}
        assert "job" not in by_instance["a"]["metric"] and "model_name" not in by_instance["a"]["metric"]


# ---------------------------------------------------------------- options Prometheus refuses (issue 42)

ATTACK = [
    (["--dns", "vllm=h:8000", "--interval", "1ms"], "scrape interval '1ms': expected 100ms to 120s"),
    (["--dns", "vllm=h:8000", "--interval", "99999999999h"], "scrape interval '99999999999h'"),
    (["--dns", "vllm=h:8000", "--interval", "0s"], "scrape interval '0s'"),
    (["--dns", "llamacpp=h:0"], "'h:0' is not host:port (a port 1 to 65535)"),
    (["--dns", "vllm=h:99999"], "'h:99999' is not host:port"),
    (["--dns", "vllm=a b:80"], "'a b' is not a host name"),
    (["--file-sd", "vllm=/**/*.json"], "'/**/*.json' is not a file_sd path Prometheus takes"),
    (["--file-sd", "vllm=/tmp/targets.txt"], "is not a file_sd path Prometheus takes"),
    (["--file-sd", "vllm=/tmp/a\nb.json"], "holds a control character"),
    (["--dns", "vllm=h:8000", "--exporter", "h:0"], "target exporter: 'h:0' is not host:port"),
]


@pytest.mark.parametrize("argv, said", ATTACK)
def test_options_prometheus_refuses_are_one_line_and_exit_2(capsys, argv, said):
    """fleet_config printed (exit 0) configs a real Prometheus refuses: an interval of 1ms or 99999999999h, a DNS port
    of 0, a file_sd glob over directories, a path with a newline. Each is now one line naming what is wrong."""
    assert fleet_config.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and said in err and err.count("\n") == 1, err


@pytest.mark.tool("prometheus")
def test_a_config_promtool_refuses_is_never_printed(capsys, monkeypatch):
    """What passes the checks here still goes through the real `promtool check config` before it is printed."""
    assert pc.promtool_verdict_of("global:\n  scrape_interval: 1ms\n  scrape_timeout: 100ms\n") == (
        "FAILED: parsing YAML file the generated config: global scrape timeout greater than scrape interval"
    )
    assert fleet_config.main(["--dns", "vllm=vllm.fleet.internal:8000", "--interval", "100ms"]) == 0
    assert "job_name: vllm-fleet" in capsys.readouterr().out
    # A refusal the checks here do not know of: promtool's line, exit 2, nothing printed.
    monkeypatch.setattr(pc, "checked_interval", lambda interval: interval)
    assert fleet_config.main(["--dns", "vllm=vllm.fleet.internal:8000", "--interval", "1ms"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "promtool check config refuses it: " in err and "scrape timeout greater than scrape interval" in err


def _option_text():
    from hypothesis import strategies as st

    pieces = st.sampled_from(
        ["h", "vllm", ":", "8000", "0", "99999", "/", "/", "*", "**", ".json", ".yml", ".txt", "\n", " ", "-", "ms"]
    )
    return st.lists(pieces, min_size=0, max_size=6).map("".join) | st.text(max_size=12)


@pytest.mark.tool("prometheus")
def test_any_options_give_one_line_or_a_config_promtool_accepts(capsys):
    """Property (fixed seed): whatever --dns, --file-sd, --exporter and --interval say, fleet_config exits 2 with one
    line, or prints a config the real `promtool check config` accepts; never a traceback."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(
        derandomize=True, max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(  # mostly good values beside the one being varied, so a bad one is not hidden behind another
        kind=st.sampled_from(["vllm", "vllm", "llamacpp", "triton"]),
        where=_option_text(),
        file_sd=st.booleans(),
        exporter=st.one_of(st.none(), st.none(), st.just("127.0.0.1:9464"), _option_text()),
        interval=st.one_of(st.just("5s"), st.just("100ms"), st.just("2m"), _option_text()),
    )
    def check(kind, where, file_sd, exporter, interval):
        argv = ["--file-sd" if file_sd else "--dns", f"{kind}={where}", "--interval", interval]
        argv += ["--exporter", exporter] if exporter is not None else []
        code = fleet_config.main(argv)
        out, err = capsys.readouterr()
        if code == 2:
            assert out == "" and err.count("\n") == 1 and err.startswith("fleet_config: "), err
            return
        assert code == 0 and err == "", err
        assert pc.promtool_verdict_of(out) is None, (argv, out)

    check()
