"""An installed wheel works outside the checkout: knob defaults, the exporter, a load run and its report."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from servescope.contracts import knob_defaults
from tests.conftest import free_port, wait_http
from tests.doubles.synthetic_openai import SyntheticServer
from tests.paths import REPO


def _packages() -> list[str]:
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    return [pattern.rstrip("*") for pattern in find["include"]]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The interpreter of a fresh venv holding only the wheel built from a copy of the checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"  # setuptools builds in the tree it is given: a copy keeps build/ and *.egg-info out of ours
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for package in _packages():
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "-w", tmp / "dist", src], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("servescope-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp / "venv"], check=True)
    python = tmp / "venv" / "bin" / "python"
    done = subprocess.run([*pip, "--python", python, "install", "--no-deps", "--no-index", wheel], capture_output=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return python


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return folder


def environment() -> dict[str, str]:
    """The third-party packages of this interpreter on the path (not the repository), no knob overridden."""
    env = {k: v for k, v in os.environ.items() if k not in knob_defaults.DEFAULTS}
    env.update(PYTHONPATH=sysconfig.get_paths()["purelib"], SAMPLE_INTERVAL_MS="0", PYTHONDONTWRITEBYTECODE="1")
    return env


def run(python: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, *args], cwd=cwd, env=environment(), capture_output=True, text=True, timeout=120)


def test_the_knob_defaults_come_from_the_installed_package(installed, elsewhere):
    code = "from servescope.contracts import knobs; print(knobs.__file__); print(knobs.get_int('EXPORTER_PORT'))"
    where, port = run(installed, elsewhere, "-c", code).stdout.split()
    assert Path(where).is_relative_to(installed.parent.parent)  # the wheel's copy, not the checkout's
    assert not (Path(where).parent.parent / ".env.example").exists()
    assert port == "9464"


@pytest.mark.parametrize("module", ["servescope.report", "loadgen", "exporter", "servescope.stack"])
def test_every_command_answers_help(installed, elsewhere, module):
    proc = run(installed, elsewhere, "-m", module, "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_exporter_reads_an_engine(installed, elsewhere):
    port = free_port()
    with SyntheticServer(ttft=0.01, itl=0.001, tokens=8) as server:
        args = ["-m", "exporter", "--port", str(port), "--proxy-port", str(free_port()), "--vllm-url", server.url]
        proc = subprocess.Popen([installed, *args], cwd=elsewhere, env=environment(), stderr=subprocess.PIPE)
        try:
            page = wait_http(f"http://127.0.0.1:{port}/metrics", proc=proc).text
        finally:
            proc.terminate()
            proc.communicate(timeout=30)
    assert re.search(r'^servescope_engine_up\{[^}]*engine="vllm"[^}]*\} 1\.0$', page, re.M), page[:2000]


def test_a_load_run_and_its_report_from_another_folder(installed, elsewhere):
    with SyntheticServer(ttft=0.01, itl=0.001, tokens=8) as server:
        proc = run(
            installed, elsewhere, "-m", "loadgen", "burst", "--engine", f"vllm={server.url}",
            "--results", "results", "--run-id", "w", "--metrics-port", "0", "--warmup", "0",
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "run folder: results/w"
    folder = elsewhere / "results" / "w"  # a relative --results is the caller's folder
    assert (folder / "requests.jsonl").read_text().count("\n") == 3  # BURST_SIZE's default, from the wheel's table
    report = run(installed, elsewhere, "-m", "servescope.report", "--run", str(folder))
    assert report.returncode == 0, report.stderr[-3000:]
    assert (folder / "report.md").is_file() and (folder / "report.html").is_file()


def test_run_folders_default_to_the_working_directory_not_site_packages(installed, elsewhere):
    with SyntheticServer(ttft=0.01, itl=0.001, tokens=8) as server:
        args = ["burst", "--engine", f"vllm={server.url}", "--run-id", "d", "--metrics-port", "0", "--warmup", "0"]
        proc = run(installed, elsewhere, "-m", "loadgen", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == f"run folder: {elsewhere / 'results' / 'd'}"
    report = run(installed, elsewhere, "-m", "servescope.report")  # the latest run under the same default
    assert report.returncode == 0, report.stderr[-3000:]
    assert (elsewhere / "results" / "d" / "report.md").is_file()


def test_the_servescope_command_measures_an_engine_that_already_runs(installed, elsewhere):
    """What `pipx install .` gives a user: `servescope quick URL`, then `servescope report --run ID`, from any folder."""
    command = installed.parent / "servescope"
    assert command.is_file()  # the console script the wheel declares
    with SyntheticServer(ttft=0.01, itl=0.002, tokens=16) as server:
        args = [server.url, "--slo", "ttft<=2,tpot<=0.2", "--duration", "2", "--max-tokens", "16", "--budget", "60"]
        proc = subprocess.run(
            [command, "quick", *args], cwd=elsewhere, env=environment(), capture_output=True, text=True, timeout=300
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "  Capacity:" in proc.stdout
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("  Run folder:")]
    run_id = line.split("servescope report --run ")[1].rstrip(")")
    assert (elsewhere / "results" / run_id / "knee.json").is_file()  # under the caller's folder, not site-packages
    report = subprocess.run(
        [command, "report", "--run", run_id], cwd=elsewhere, env=environment(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr[-3000:]
    assert (elsewhere / "results" / run_id / "report.html").is_file()
