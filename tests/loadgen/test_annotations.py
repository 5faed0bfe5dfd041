"""Phases posted as Grafana annotations by `python -m loadgen` when GRAFANA_URL is set; nothing when not; one line on failure."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from dashboards.build import PHASE_TAGS
from loadgen.annotations import PhaseAnnotator
from servescope.contracts.runfolder import RunFolder
from tests.conftest import JsonReplyHandler, free_port, serve_in_thread
from tests.doubles.synthetic_openai import SyntheticServer
from tests.harness import run_cli


class GrafanaAnnotationsAPI:
    """Stands in for Grafana's HTTP API POST /api/annotations (bearer token), which cannot run here; records each POST."""

    def __init__(self, token: str = "glsa_test_token"):
        self.token = token
        self.posts: list[dict] = []
        self.other: list[str] = []
        api = self

        class Handler(JsonReplyHandler):
            def do_POST(self):  # noqa: N802 -- http.server's naming
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.headers.get("Authorization") != f"Bearer {api.token}":
                    return self.reply_json(401, {"message": "Unauthorized"})
                if self.path != "/api/annotations":
                    api.other.append(self.path)
                    return self.reply_json(404, {"message": "Not found"})
                api.posts.append(body)
                self.reply_json(200, {"id": len(api.posts), "message": "Annotation added"})

            def do_GET(self):  # noqa: N802
                api.other.append(self.path)
                self.reply_json(404, {"message": "Not found"})

        self.server = serve_in_thread(Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine():
    with SyntheticServer(ttft=0.01, itl=0.002, tokens=8) as server:
        yield server


def loadgen(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GRAFANA_")}
    return run_cli("loadgen", *args, timeout=60, env={**clean, **env})


def test_each_phase_is_posted_as_a_region_annotation(engine, tmp_path):
    grafana = GrafanaAnnotationsAPI()
    try:
        proc = loadgen(
            "compare",
            "--engine",
            f"vllm={engine.url}",
            "--no-sequential-four",
            "--repetitions",
            "1",
            "--burst-pause",
            "0.05",
            "--results",
            str(tmp_path),
            "--run-id",
            "ann",
            "--metrics-port",
            "0",
            "--max-tokens",
            "4",
            "--warmup",
            "0",
            "--quiet",
            env={"GRAFANA_URL": grafana.url, "GRAFANA_TOKEN": grafana.token},
        )
    finally:
        grafana.close()
    assert proc.returncode == 0, proc.stderr
    assert "grafana" not in proc.stderr.lower(), proc.stderr
    folder = RunFolder(tmp_path / "ann")
    phases = {p.phase: p for p in folder.phases()}
    assert set(phases) == {"sequential", "burst-1"}
    assert len(grafana.posts) == 2 and not grafana.other
    by_phase = {post["tags"][-1]: post for post in grafana.posts}
    assert set(by_phase) == {"sequential", "burst"}
    for name, record in (("sequential", phases["sequential"]), ("burst", phases["burst-1"])):
        post = by_phase[name]
        assert set(PHASE_TAGS) <= set(post["tags"]) and "vllm" in post["tags"]
        # The region is the phase's own window (epoch milliseconds), as recorded in phases.jsonl.
        assert abs(post["time"] - record.started_at * 1000) <= 1 and abs(post["timeEnd"] - record.ended_at * 1000) <= 1
        assert post["timeEnd"] > post["time"]
        assert f"{name}: 3 requests" in post["text"]


def test_no_grafana_url_means_no_call_at_all(engine, tmp_path):
    grafana = GrafanaAnnotationsAPI()
    try:
        # Credentials are set but no URL: the default (localhost:GRAFANA_PORT) must not be tried either.
        proc = loadgen(
            "sequential",
            "--engine",
            f"vllm={engine.url}",
            "--results",
            str(tmp_path),
            "--metrics-port",
            "0",
            "--max-tokens",
            "4",
            "--warmup",
            "0",
            "--quiet",
            env={"GRAFANA_TOKEN": grafana.token, "GRAFANA_PORT": str(grafana.server.server_address[1])},
        )
    finally:
        grafana.close()
    assert proc.returncode == 0, proc.stderr
    assert grafana.posts == [] and grafana.other == []


def test_unreachable_grafana_is_one_line_and_the_run_goes_on(engine, tmp_path):
    proc = loadgen(
        "compare",
        "--engine",
        f"vllm={engine.url}",
        "--no-sequential-four",
        "--repetitions",
        "1",
        "--burst-pause",
        "0.05",
        "--results",
        str(tmp_path),
        "--run-id",
        "down",
        "--metrics-port",
        "0",
        "--max-tokens",
        "4",
        "--warmup",
        "0",
        "--quiet",
        env={"GRAFANA_URL": f"http://127.0.0.1:{free_port()}", "GRAFANA_TOKEN": "x"},
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "grafana" in line.lower()]
    assert len(lines) == 1, proc.stderr
    assert "unreachable or refused" in lines[0] and "later phases are not annotated" in lines[0]
    assert "Traceback" not in proc.stderr
    folder = RunFolder(tmp_path / "down")
    assert folder.manifest()["status"] == "complete"
    assert {p.phase for p in folder.phases()} == {"sequential", "burst-1"}


def test_refused_credentials_are_reported_once(engine, tmp_path):
    grafana = GrafanaAnnotationsAPI(token="right")
    try:
        proc = loadgen(
            "compare",
            "--engine",
            f"vllm={engine.url}",
            "--no-sequential-four",
            "--repetitions",
            "1",
            "--burst-pause",
            "0.05",
            "--results",
            str(tmp_path),
            "--metrics-port",
            "0",
            "--max-tokens",
            "4",
            "--warmup",
            "0",
            "--quiet",
            "--grafana-url",
            grafana.url,
            env={"GRAFANA_TOKEN": "wrong"},
        )
    finally:
        grafana.close()
    assert proc.returncode == 0, proc.stderr
    assert grafana.posts == []
    assert len([line for line in proc.stderr.splitlines() if "grafana" in line.lower()]) == 1, proc.stderr


def test_annotator_without_url_never_calls_post():
    calls = []
    annotator = PhaseAnnotator(None, post=lambda *a, **k: calls.append((a, k)) or True)
    assert annotator.phase_done(object()) is False  # not even the phase is looked at
    assert calls == []
