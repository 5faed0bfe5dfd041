"""Locust's web UI and distributed mode on the project's locustfile, against the synthetic server (a real browser where present)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests

from servescope.runfolder import RunFolder
from tests.conftest import free_port, stop_process, wait_http
from tests.doubles.synthetic_openai import SyntheticServer

REPO = Path(__file__).resolve().parent.parent
LOCUSTFILE = REPO / "loadgen" / "locustfile.py"


@pytest.fixture
def server():
    with SyntheticServer(ttft=0.02, itl=0.002, tokens=64) as s:
        yield s


@pytest.fixture
def webui(server, tmp_path):
    port = free_port()
    log = open(tmp_path / "webui.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loadgen",
            "webui",
            "--port",
            str(port),
            "--metrics-port",
            "0",
            "--results",
            str(tmp_path / "results"),
            "--engine-url",
            server.url,
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/", timeout=60, proc=proc)
        yield f"http://127.0.0.1:{port}", tmp_path / "results"
    finally:
        stop_process(proc, 15)
        log.close()


def wait_for_chat_requests(base: str, count: int, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    stats: dict = {}
    while time.monotonic() < deadline:
        stats = requests.get(f"{base}/stats/requests", timeout=5).json()
        chat = [s for s in stats["stats"] if s["method"] == "chat"]
        if sum(s["num_requests"] for s in chat) >= count and stats["state"] == "stopped":
            return stats
        time.sleep(0.2)
    raise AssertionError(f"web UI did not count {count} chat requests in {timeout}s: {json.dumps(stats)[:800]}")


def finished_run(results: Path, timeout: float = 10) -> RunFolder:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = [p for p in results.iterdir() if (p / "manifest.json").exists()] if results.exists() else []
        if runs and RunFolder(runs[0]).manifest()["status"] != "running":
            return RunFolder(runs[0])
        time.sleep(0.2)
    raise AssertionError(f"no finished run folder under {results}")


def test_swarm_with_custom_parameters_runs_the_chosen_engine_and_scenario(webui):
    base, results = webui
    form = {
        "user_count": "1",
        "spawn_rate": "1",
        "host": "",
        "engine": "llamacpp",
        "scenario": "burst",
        "burst_size": "4",
        "bursts": "2",
        "burst_pause": "0.1",
        "max_tokens": "8",
    }
    answer = requests.post(f"{base}/swarm", data=form, timeout=10).json()
    assert answer["success"], answer
    stats = wait_for_chat_requests(base, 8)
    rows = {(s["method"], s["name"]): s for s in stats["stats"]}
    assert (
        rows[("chat", "llamacpp burst")]["num_requests"] == 8 and rows[("chat", "llamacpp burst")]["num_failures"] == 0
    )
    assert rows[("TTFT", "llamacpp burst")]["num_requests"] == 8
    folder = finished_run(results)
    assert folder.manifest()["status"] == "complete" and folder.manifest()["engines"]["llamacpp"]["url"]
    assert [p.phase for p in folder.phases()] == ["burst-1", "burst-2"]
    assert all(r.engine == "llamacpp" and r.ok for r in folder.requests())
    assert (folder.path / "locust_stats.csv").exists()


@pytest.mark.browser
@pytest.mark.tool("chromium")
def test_web_ui_in_headless_chromium(webui):
    chromium = shutil.which("chromium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait

    base, results = webui
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tempfile.mkdtemp(prefix='servescope-chromium-')}",
    ):
        options.add_argument(flag)
    # Debian's chromedriver, never a download (Selenium Manager cannot reach its hosts here).
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get(base + "/")
        wait = WebDriverWait(driver, 30)
        wait.until(lambda d: d.find_elements(By.XPATH, "//button[normalize-space()='Custom parameters']"))
        driver.find_element(By.XPATH, "//button[normalize-space()='Custom parameters']").click()
        wait.until(lambda d: d.find_element(By.NAME, "engine").is_displayed())
        Select(driver.find_element(By.NAME, "engine")).select_by_value("llamacpp")
        Select(driver.find_element(By.NAME, "scenario")).select_by_value("burst")
        for name, value in (("burstSize", "5"), ("maxTokens", "8"), ("bursts", "1")):
            field = driver.find_element(By.NAME, name)
            field.send_keys(Keys.CONTROL, "a")
            field.send_keys(value)
        driver.find_element(By.XPATH, "//button[normalize-space()='START' or normalize-space()='Start']").click()
        stats = wait_for_chat_requests(base, 5)
        rows = {(s["method"], s["name"]): s["num_requests"] for s in stats["stats"]}
        assert rows[("chat", "llamacpp burst")] == 5
        # The page itself shows the counted requests.
        wait.until(lambda d: "llamacpp burst" in d.find_element(By.TAG_NAME, "body").text)
    finally:
        driver.quit()
    folder = finished_run(results)
    assert len(list(folder.requests())) == 5 and folder.manifest()["flags"]["driver"] == "locust-web-ui"


def test_distributed_master_and_two_workers(server, tmp_path):
    master_port = free_port()
    common = [
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--engine",
        "vllm",
        "--engine-url",
        server.url,
        "--metrics-port",
        "0",
        "--results",
        str(tmp_path),
        "--max-tokens",
        "4",
    ]
    master = subprocess.Popen(
        [
            sys.executable,
            *common,
            "--headless",
            "--master",
            "--expect-workers",
            "2",
            "--master-bind-host",
            "127.0.0.1",
            "--master-bind-port",
            str(master_port),
            "--scenario",
            "sweep",
            "--concurrencies",
            "2,4",
            "--duration",
            "1.5",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    workers = [
        subprocess.Popen(
            [sys.executable, *common, "--worker", "--master-host", "127.0.0.1", "--master-port", str(master_port)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    try:
        out, _ = master.communicate(timeout=60)
    finally:
        for proc in (master, *workers):
            if proc.poll() is None:
                proc.terminate()
        for proc in (master, *workers):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert master.returncode == 0, out[-3000:]
    folder = finished_run(tmp_path)
    assert folder.manifest()["status"] == "complete"
    phases = {p.phase: p for p in folder.phases()}
    assert set(phases) == {"sweep-c2", "sweep-c4"}
    records = list(folder.requests())
    # Every record was measured on a worker and shipped to the master, which alone writes the folder.
    assert len(records) > 10 and all(r.ok and r.phase in phases for r in records)
    assert phases["sweep-c4"].requests > 0 and phases["sweep-c4"].concurrency == 4
    assert server.stats.requests >= len(records)
