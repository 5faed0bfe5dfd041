"""Load-phase annotations: posted to a stand-in for Grafana's HTTP API; a silent one-line no-op otherwise."""

from __future__ import annotations

import base64
import json
import logging

import pytest

from dashboards import annotations, build
from tests.conftest import JsonReplyHandler, free_port, serve_in_thread


class FakeGrafana(JsonReplyHandler):
    """Stands in for Grafana's HTTP API (POST /api/annotations, basic auth), which cannot run here."""

    received: list[dict] = []
    password = "s3cret"

    def do_POST(self):  # noqa: N802 -- http.server's naming
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        expected = "Basic " + base64.b64encode(f"admin:{self.password}".encode()).decode()
        if self.headers.get("Authorization") != expected:
            self.reply_json(401, {"message": "invalid username or password"})
            return
        if self.path != "/api/annotations":
            self.reply_json(404, {"message": "not found"})
            return
        type(self).received.append(body)
        self.reply_json(200, {"id": len(self.received), "message": "Annotation added"})


@pytest.fixture
def grafana():
    FakeGrafana.received = []
    server = serve_in_thread(FakeGrafana)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_phase_is_posted_as_a_region_with_the_dashboards_tags(grafana):
    ok = annotations.post_phase(
        "burst-1",
        1_700_000_000.25,
        1_700_000_004.5,
        engine="vllm",
        scenario="burst",
        url=grafana,
        credential=("admin", FakeGrafana.password),
    )
    assert ok is True
    (body,) = FakeGrafana.received
    assert body["time"] == 1_700_000_000_250 and body["timeEnd"] == 1_700_000_004_500  # Grafana wants ms
    assert body["tags"][:2] == list(build.PHASE_TAGS)
    assert {"vllm", "burst", "burst-1"} <= set(body["tags"])
    assert "burst-1" in body["text"]


def test_refused_credentials_are_one_log_line_not_an_exception(grafana, caplog):
    with caplog.at_level(logging.INFO, logger="servescope.annotations"):
        ok = annotations.post_phase("sequential", 1.0, 2.0, url=grafana, credential=("admin", "wrong"))
    assert ok is False
    assert FakeGrafana.received == []
    assert len(caplog.records) == 1 and "\n" not in caplog.records[0].getMessage()


def test_unreachable_grafana_is_a_quick_silent_no_op(caplog):
    url = f"http://127.0.0.1:{free_port()}"
    with caplog.at_level(logging.INFO, logger="servescope.annotations"):
        ok = annotations.post_phase("burst-2", 1.0, 2.0, url=url, credential=("admin", "x"), timeout=1)
    assert ok is False
    (record,) = caplog.records
    assert "burst-2" in record.getMessage() and "unreachable" in record.getMessage()


def test_no_password_configured_skips_without_calling(monkeypatch, caplog):
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    monkeypatch.setenv("GRAFANA_ADMIN_PASSWORD", "")
    with caplog.at_level(logging.INFO, logger="servescope.annotations"):
        assert annotations.post_phase("ramp-4users", 1.0, 2.0, url="http://127.0.0.1:9") is False
    assert "GRAFANA_ADMIN_PASSWORD" in caplog.records[0].getMessage()
