"""Locust's web UI and distributed mode on the project's locustfile, against the synthetic server (a real browser where present)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

from servescope.contracts.runfolder import RunFolder
from tests.conftest import free_port, stop_process, wait_http
from tests.doubles.synthetic_openai import SyntheticServer
from tests.harness import run_cli, spawn_cli, start_cli
from tests.paths import REPO

LOCUSTFILE = REPO / "loadgen" / "locustfile.py"


@pytest.fixture
def server():
    with SyntheticServer(ttft=0.02, itl=0.002, tokens=64) as s:
        yield s


def start_webui(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(tmp_path / "webui.log", "w")
    proc = spawn_cli(
        *["loadgen", "webui", "--port", str(port), "--metrics-port", "0", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    log.close()
    wait_http(f"http://127.0.0.1:{port}/", timeout=60, proc=proc)
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture
def webui(server, tmp_path):
    """As the stack starts it: the engine's URL, the burst size as users, the scenario."""
    proc, base = start_webui(
        tmp_path,
        "--results",
        str(tmp_path / "results"),
        "--engine-url",
        server.url,
        "--users",
        "3",
        "--scenario",
        "burst",
        "--max-tokens",
        "8",
    )
    try:
        yield base, tmp_path / "results"
    finally:
        stop_process(proc, 15)


def template_args(base: str) -> dict:
    """What Locust fills its form with: the JSON its page carries."""
    page = requests.get(f"{base}/", timeout=10).text
    match = re.search(r"templateArgs = (\{.*?\})\s*</script>", page, re.S)
    assert match, page[:2000]
    return json.loads(match.group(1))


def start(base: str, form: dict, **headers: str) -> requests.Response:
    """POST the START form as the web UI's own page does: with its Origin (another site's page cannot send it)."""
    return requests.post(f"{base}/swarm", data=form, headers={"Origin": base, **headers}, timeout=10)


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


def test_the_form_opens_filled_in_from_flags(webui, server):
    base, _results = webui
    args = template_args(base)
    assert args["host"] == server.url and not args["missing_host_warning"]
    assert args["num_users"] == 3 and args["spawn_rate"] == 3
    extra = {name: option["default_value"] for name, option in args["extra_options"].items()}
    assert extra["engine"] == "vllm" and extra["scenario"] == "burst" and extra["max_tokens"] == 8
    assert "burst_size" not in extra and "engine_url" not in extra  # one field each: Number of users, Host


def test_the_form_opens_filled_in_from_environment_variables(server, tmp_path):
    proc, base = start_webui(
        tmp_path,
        "--results",
        str(tmp_path / "results"),
        env={
            "LOADGEN_ENGINE_URL": server.url,
            "BURST_SIZE": "5",
            "LOADGEN_SCENARIO": "sweep",
            "LOADGEN_ENGINE": "llamacpp",
            # Compose passes unset knobs as empty (`${SLO_ATTAINMENT:-}`): empty means the default, not an error.
            "SLO_ATTAINMENT": "",
            "SLO": "",
        },
    )
    try:
        args = template_args(base)
    finally:
        stop_process(proc, 15)
    extra = {name: option["default_value"] for name, option in args["extra_options"].items()}
    assert args["host"] == server.url and args["num_users"] == 5
    assert extra["scenario"] == "sweep" and extra["engine"] == "llamacpp"
    assert extra["slo_attainment"] in (None, "") and extra["slo"] in (None, "")


def test_swarm_with_custom_parameters_runs_the_chosen_engine_and_scenario(webui, server):
    base, results = webui
    form = {
        "user_count": "4",  # the burst size
        "spawn_rate": "4",
        "host": server.url,
        "engine": "llamacpp",
        "scenario": "burst",
        "bursts": "2",
        "burst_pause": "0.1",
        "max_tokens": "8",
    }
    answer = start(base, form).json()
    assert answer["success"], answer
    stats = wait_for_chat_requests(base, 8)
    rows = {(s["method"], s["name"]): s for s in stats["stats"]}
    assert (
        rows[("chat", "llamacpp burst")]["num_requests"] == 8 and rows[("chat", "llamacpp burst")]["num_failures"] == 0
    )
    assert rows[("TTFT", "llamacpp burst")]["num_requests"] == 8
    folder = finished_run(results)
    assert folder.manifest()["status"] == "complete" and folder.manifest()["engines"]["llamacpp"]["url"] == server.url
    phases = list(folder.phases())
    assert [p.phase for p in phases] == ["burst-1", "burst-2"] and all(p.concurrency == 4 for p in phases)
    assert all(r.engine == "llamacpp" and r.ok for r in folder.requests())
    assert (folder.path / "locust_stats.csv").exists()


def test_a_bad_value_in_the_form_is_one_line_and_the_next_start_runs(webui, server, tmp_path):
    base, results = webui
    form = {"user_count": "2", "spawn_rate": "2", "host": server.url, "scenario": "ramp", "steps": "1"}
    answer = start(base, {**form, "duration": "nan"}).json()
    expected = "--duration: expected a number of seconds > 0, at most 604800 (a week), got 'nan'"
    assert not answer["success"] and answer["message"] == expected  # one line in the UI, nothing started
    log = tmp_path / "webui.log"
    assert log.read_text().count(f"loadgen: web UI START refused: {expected}") == 1
    assert "Traceback" not in log.read_text() and not (results.exists() and any(results.iterdir()))
    assert requests.get(f"{base}/stats/requests", timeout=5).json()["state"] in ("ready", "stopped")
    # The same form with a good value: a run, as if the bad one never happened.
    answer = start(base, {**form, "duration": "", "requests": "2", "scenario": "sequential"})
    assert answer.json()["success"]
    wait_for_chat_requests(base, 2)
    assert finished_run(results).manifest()["status"] == "complete"


def test_credentials_in_the_engine_url_are_sent_but_stay_out_of_the_output_and_the_run_folder(server, tmp_path):
    url = server.url.replace("http://", "http://zqx-user:s3cret@")
    results = tmp_path / "results"
    proc, base = start_webui(tmp_path, "--results", str(results), "--engine-url", url, "--users", "2")
    try:
        form = {"user_count": "2", "spawn_rate": "2", "host": url, "scenario": "burst", "max_tokens": "4"}
        assert start(base, form).json()["success"]
        wait_for_chat_requests(base, 2)
        folder = finished_run(results)
    finally:
        stop_process(proc, 15)
    assert server.stats.authorizations == {"Basic " + base64.b64encode(b"zqx-user:s3cret").decode(): 2}
    assert folder.manifest()["engines"]["vllm"]["url"] == server.url.replace("http://", "http://***@")
    for path in [tmp_path / "webui.log", *folder.path.iterdir()]:
        text = path.read_text(errors="replace")
        assert "s3cret" not in text and "zqx-user" not in text, path.name


@pytest.mark.browser
@pytest.mark.tool("chromium")
def test_web_ui_in_headless_chromium_opens_filled_in_and_start_runs_it_untouched(webui, server, tmp_path):
    chromium = shutil.which("chromium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    base, results = webui
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--window-size=1280,1100",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        options.add_argument(flag)
    # Debian's chromedriver, never a download (Selenium Manager cannot reach its hosts here).
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    screenshot = tmp_path / "webui-filled.png"
    try:
        driver.get(base + "/")
        wait = WebDriverWait(driver, 30)
        wait.until(lambda d: d.find_elements(By.NAME, "host"))
        fields = ("userCount", "spawnRate", "host")
        assert {name: driver.find_element(By.NAME, name).get_attribute("value") for name in fields} == {
            "userCount": "3",
            "spawnRate": "3",
            "host": server.url,
        }
        body = driver.find_element(By.TAG_NAME, "body").text
        assert "no host attribute set" not in body
        driver.find_element(By.XPATH, "//button[normalize-space()='Custom parameters']").click()
        wait.until(lambda d: d.find_element(By.NAME, "engine").is_displayed())
        custom = ("engine", "scenario", "maxTokens")
        assert {name: driver.find_element(By.NAME, name).get_attribute("value") for name in custom} == {
            "engine": "vllm",
            "scenario": "burst",
            "maxTokens": "8",
        }
        assert driver.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 10_000
        print(f"web UI screenshot: {screenshot}")
        driver.find_element(By.XPATH, "//button[normalize-space()='START' or normalize-space()='Start']").click()
        stats = wait_for_chat_requests(base, 3)
        rows = {(s["method"], s["name"]): s["num_requests"] for s in stats["stats"]}
        assert rows[("chat", "vllm burst")] == 3
        # The page itself shows the counted requests.
        wait.until(lambda d: "vllm burst" in d.find_element(By.TAG_NAME, "body").text)
    finally:
        driver.quit()
    folder = finished_run(results)
    assert len(list(folder.requests())) == 3 and folder.manifest()["flags"]["driver"] == "locust-web-ui"
    assert [p.concurrency for p in folder.phases()] == [3]


def run_distributed(server, results: Path, *master_args: str) -> RunFolder:
    """`locust -f` headless: a master and two workers; the master alone writes the run folder."""
    master_port = free_port()
    common = ["locust", "-f", str(LOCUSTFILE), "--engine", "vllm", "--host", server.url]
    common += ["--metrics-port", "0", "--results", str(results), "--max-tokens", "4"]
    master = spawn_cli(
        *[*common, "--headless", "--master", "--expect-workers", "2", "--master-bind-host", "127.0.0.1"],
        *["--master-bind-port", str(master_port), *master_args],
        stderr=subprocess.STDOUT,
    )
    workers = [
        spawn_cli(
            *[*common, "--worker", "--master-host", "127.0.0.1", "--master-port", str(master_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    try:
        out, _ = master.communicate(timeout=60)
    finally:
        for proc in (master, *workers):
            stop_process(proc, 10)
    assert master.returncode == 0, out[-3000:]
    folder = finished_run(results)
    assert folder.manifest()["status"] == "complete"
    return folder


@pytest.mark.slow
def test_distributed_sweep_steps_on_the_masters_clock(server, tmp_path):
    folder = run_distributed(server, tmp_path, "--scenario", "sweep", "--concurrencies", "2,4", "--duration", "3")
    phases = {p.phase: p for p in folder.phases()}
    assert set(phases) == {"sweep-c2", "sweep-c4"}
    records = list(folder.requests())
    # Every record was measured on a worker and shipped to the master, which alone writes the folder.
    assert len(records) > 10 and all(r.ok and r.phase in phases for r in records)
    assert phases["sweep-c4"].requests > 0 and phases["sweep-c4"].concurrency == 4
    assert server.stats.requests >= len(records)


def test_distributed_burst_splits_its_users_across_workers_and_ends(server, tmp_path):
    # Compose's web UI: a master, two workers, the burst scenario. Each worker's barrier once waited for all
    # 3 users while it ran 1 or 2 of them, and the master never saw the phase end: nothing was ever sent.
    folder = run_distributed(server, tmp_path, "--scenario", "burst", "--users", "3", "--bursts", "2")
    assert [(p.phase, p.requests, p.concurrency) for p in folder.phases()] == [("burst-1", 3, 3), ("burst-2", 3, 3)]
    records = list(folder.requests())
    assert len(records) == 6 and all(r.ok for r in records) and server.stats.requests == 6


def _listening(port: int) -> set[str]:
    """The local addresses something listens on at `port`, from the kernel's socket tables (IPv4 and IPv6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def test_locust_f_as_the_readme_shows_it_binds_loopback_only(tmp_path):
    """`locust -f loadgen/locustfile.py --master` once bound its web UI and its workers' port on every interface."""
    web, master = free_port(), free_port()
    log = open(tmp_path / "locust.log", "w")
    with start_cli(
        *["locust", "-f", str(LOCUSTFILE), "--master", "--web-port", str(web)],
        *["--master-bind-port", str(master), "--metrics-port", "0", "--results", str(tmp_path / "results")],
        stdout=log,
        stderr=subprocess.STDOUT,
        grace=15,
    ) as proc:
        log.close()
        wait_http(f"http://127.0.0.1:{web}/", timeout=60, proc=proc)
        assert _listening(web) == {"0100007F"}, (tmp_path / "locust.log").read_text()[-2000:]
        assert _listening(master) == {"0100007F"}, (tmp_path / "locust.log").read_text()[-2000:]


# --- the START form under attack: every refusal one line in the UI, nothing started ---


def _state(base: str) -> str:
    return requests.get(f"{base}/stats/requests", timeout=5).json()["state"]


def test_every_field_of_the_start_form_is_checked_by_the_option_table(webui, server, tmp_path):
    base, results = webui
    good = {"user_count": "2", "spawn_rate": "2", "host": server.url, "scenario": "burst", "max_tokens": "4"}
    secret = tmp_path / "secret.txt"
    secret.write_text("the content of a local file\n")
    with SyntheticServer(ttft=0.01, itl=0.001, tokens=2) as elsewhere:
        bad = {
            "host=javascript:alert(1)": {"host": "javascript:alert(1)"},
            "host=ftp://": {"host": "ftp://127.0.0.1:21"},
            "host empty": {"host": ""},
            "http_client=bogus": {"http_client": "bogus"},
            "metrics_port=70000": {"metrics_port": "70000"},
            "results anywhere": {"results": str(tmp_path / "elsewhere")},
            "an unknown key": {"no_such_option": "1"},
            "Locust's own html_file": {"html_file": str(tmp_path / "written.html")},
            "max_tokens=0": {"max_tokens": "0"},
            "a bad choice": {"scenario": "everything"},
            "an empty number": {"max_tokens": ""},
            # A page that could post this read the file: its content went to the host the form named.
            "prompts = a local file, host = another server": {"prompts": str(secret), "host": elsewhere.url},
            "prompts = a dataset of a local file": {"prompts": f"dataset:{secret}", "host": elsewhere.url},
        }
        answers = {name: start(base, {**good, **fields}) for name, fields in bad.items()}
        assert elsewhere.stats.requests == 0  # no local file left the machine
    for name, answer in answers.items():
        body = answer.json()
        assert answer.status_code == 200 and body["success"] is False, (name, body)
        assert body["message"] and "\n" not in body["message"], (name, body)
    assert (
        "the web UI reads prompt files only from"
        in answers["prompts = a local file, host = another server"].json()["message"]
    )
    assert server.stats.requests == 0 and _state(base) in ("ready", "stopped")
    assert not (results.exists() and any(results.iterdir())) and not (tmp_path / "elsewhere").exists()
    assert not (tmp_path / "written.html").exists()
    log = (tmp_path / "webui.log").read_text()
    assert log.count("loadgen: web UI START refused:") == len(bad) and "Traceback" not in log
    # Refused values are forgotten: the next START without them runs with the values the UI started with.
    assert start(base, {"user_count": "2", "spawn_rate": "2", "host": server.url}).json()["success"]
    wait_for_chat_requests(base, 2)
    folder = finished_run(results)
    assert {r.max_tokens for r in folder.requests()} == {8}  # --max-tokens 8, as started: not the refused 0


def test_a_host_no_client_can_connect_to_is_refused_at_the_form_in_one_short_line(webui, server, tmp_path):
    """Issue 42: a 1 MB host in the form was taken, and every user then failed with an idna traceback in the log. The
    form refuses a host that is not a DNS name or an IP address, in one line that does not echo it whole."""
    base, results = webui
    good = {"user_count": "2", "spawn_rate": "2", "scenario": "burst"}
    for host, said in (
        ("http://" + "a" * 1_000_000 + ":8000", "the host name is 1,000,000 characters: a DNS name has at most 253"),
        ("http://" + "b" * 64 + ".example:8000", "the host is not a DNS name or an IP address"),
        ("http://a..b:8000", "the host is not a DNS name or an IP address"),
    ):
        body = start(base, {**good, "host": host}).json()
        assert body["success"] is False and said in body["message"], body["message"][:300]
        assert len(body["message"]) < 400 and "\n" not in body["message"]
    assert server.stats.requests == 0 and not (results.exists() and any(results.iterdir()))
    log = (tmp_path / "webui.log").read_text()
    assert "Traceback" not in log and "idna" not in log and len(log) < 100_000
    assert start(base, {**good, "host": server.url}).json()["success"]  # a good host runs
    wait_for_chat_requests(base, 2)


def test_a_start_from_another_origin_or_without_one_is_refused(webui, server):
    base, results = webui
    form = {"user_count": "2", "spawn_rate": "2", "host": server.url, "scenario": "burst"}
    refused = {
        "another origin": requests.post(
            f"{base}/swarm", data=form, headers={"Origin": "http://evil.example"}, timeout=10
        ),
        "a sandboxed page (Origin: null)": requests.post(
            f"{base}/swarm", data=form, headers={"Origin": "null"}, timeout=10
        ),
        "no Origin, no Referer": requests.post(f"{base}/swarm", data=form, timeout=10),
        "a foreign Referer": requests.post(
            f"{base}/swarm", data=form, headers={"Referer": "http://evil.example/page"}, timeout=10
        ),
        "another site's fetch": start(base, form, **{"Sec-Fetch-Site": "cross-site"}),
        "a name rebound to 127.0.0.1": start(base, form, Host="evil.example:8089"),
        "STOP from another origin": requests.post(
            f"{base}/stop", headers={"Origin": "http://evil.example"}, timeout=10
        ),
    }
    for name, answer in refused.items():
        assert answer.status_code == 403 and answer.json()["success"] is False, (name, answer.status_code)
    assert server.stats.requests == 0 and _state(base) in ("ready", "stopped")
    assert not (results.exists() and any(results.iterdir()))
    # The web UI's own page: the same form with its Origin, or its Referer, starts.
    assert requests.post(f"{base}/swarm", data=form, headers={"Referer": f"{base}/"}, timeout=10).json()["success"]
    wait_for_chat_requests(base, 2)


def test_prompt_files_come_from_the_folder_the_operator_named(server, tmp_path):
    allowed = tmp_path / "prompts"
    allowed.mkdir()
    (allowed / "mine.txt").write_text("my own prompt\n")
    (tmp_path / "other.txt").write_text("not for the web UI\n")
    results = tmp_path / "results"
    proc, base = start_webui(
        tmp_path, "--results", str(results), "--engine-url", server.url, "--prompt-dir", str(allowed), "--users", "1"
    )
    try:
        form = {"user_count": "1", "spawn_rate": "1", "host": server.url, "scenario": "sequential"}
        escape = start(base, {**form, "prompts": str(allowed / ".." / "other.txt")}).json()
        assert not escape["success"] and "the web UI reads prompt files only from" in escape["message"], escape
        (allowed / "link.txt").symlink_to(tmp_path / "other.txt")  # a link out of the folder is out of it
        assert not start(base, {**form, "prompts": str(allowed / "link.txt")}).json()["success"]
        assert start(base, {**form, "prompts": str(allowed / "mine.txt")}).json()["success"]
        wait_for_chat_requests(base, 1)
        assert [r.prompt_set for r in finished_run(results).requests()] == ["mine"]
    finally:
        stop_process(proc, 15)


def test_a_second_web_ui_on_a_port_a_ui_holds_says_where_the_first_is(webui, server):
    """`make webui` right after `make up`: one line and exit 0, never a traceback from a second bind."""
    base, _results = webui
    port = base.rsplit(":", 1)[1]
    proc = run_cli("loadgen", "webui", "--port", port, "--engine-url", server.url, "--metrics-port", "0", timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"a Locust web UI already runs at http://127.0.0.1:{port}" in proc.stdout


def test_a_web_ui_on_a_port_another_service_holds_takes_a_free_one(server, tmp_path):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    log = open(tmp_path / "webui.log", "w")
    proc = spawn_cli(
        "loadgen", "webui", "--port", str(port), "--engine-url", server.url, "--metrics-port", "0",
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    log.close()
    try:
        deadline = time.monotonic() + 30
        while "the web UI takes port" not in (tmp_path / "webui.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        said = (tmp_path / "webui.log").read_text()
        free = int(said.split("the web UI takes port ")[1].split()[0])
        assert f"port {port} is in use" in said and free != port
        wait_http(f"http://127.0.0.1:{free}/", timeout=60, proc=proc)
    finally:
        stop_process(proc, 15)
        held.close()
