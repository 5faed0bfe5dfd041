"""Load phases as Grafana annotations: posted when Grafana answers, a one-line log and no-op when it does not.

The dashboards show annotations carrying all of `dashboards.build.PHASE_TAGS`; a phase adds its
engine and scenario as further tags so a person can filter on them.
"""

from __future__ import annotations

import logging

from dashboards.build import PHASE_TAGS
from servescope.contracts import knobs

log = logging.getLogger("servescope.annotations")

# The load generator must never wait on Grafana: a short timeout, then carry on.
TIMEOUT_S = 2.0


def grafana_url() -> str:
    """GRAFANA_URL when set, else Grafana on this machine at GRAFANA_PORT."""
    url = knobs.get("GRAFANA_URL", "")
    if url:
        return url.rstrip("/")
    host = knobs.get("SERVESCOPE_BIND", "127.0.0.1")
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    return f"http://{host}:{knobs.get('GRAFANA_PORT', '3000')}"


def _credential() -> str | tuple[str, str] | None:
    """A service-account token (GRAFANA_TOKEN), else admin with GRAFANA_ADMIN_PASSWORD; None when neither is set."""
    token = knobs.get("GRAFANA_TOKEN", "")
    if token:
        return token
    password = knobs.get("GRAFANA_ADMIN_PASSWORD", "")
    if password:
        return (knobs.get("GRAFANA_ADMIN_USER", "admin") or "admin", password)
    return None


def post_phase(
    phase: str,
    started_at: float,
    ended_at: float,
    *,
    engine: str | None = None,
    scenario: str | None = None,
    text: str | None = None,
    url: str | None = None,
    credential: str | tuple[str, str] | None = None,
    timeout: float = TIMEOUT_S,
) -> bool:
    """Post one region annotation for a load phase (epoch seconds). True when Grafana accepted it."""
    url = (url or grafana_url()).rstrip("/")
    credential = credential if credential is not None else _credential()
    if credential is None:
        log.info("grafana annotation skipped for phase %s: set GRAFANA_ADMIN_PASSWORD or GRAFANA_TOKEN", phase)
        return False
    tags = [*PHASE_TAGS, *(tag for tag in (engine, scenario, phase) if tag)]
    body = text or " · ".join(part for part in (engine, scenario, phase) if part)
    # Grafana's HTTP API, POST /api/annotations (a region: time and timeEnd in epoch milliseconds). Plain requests:
    # the grafana-client package would bring niquests, whose urllib3-future replaces urllib3 in the environment
    # and made every run's start-up heavier (issue 44).
    auth = None if isinstance(credential, str) else credential
    headers = {"Authorization": f"Bearer {credential}"} if isinstance(credential, str) else {}
    payload = {"time": int(started_at * 1000), "timeEnd": int(ended_at * 1000), "tags": tags, "text": body}
    try:
        import requests

        response = requests.post(f"{url}/api/annotations", json=payload, headers=headers, auth=auth, timeout=timeout)
        if response.status_code >= 400:
            message = response.text.strip() or response.reason
            raise RuntimeError(f"HTTP {response.status_code}: {message}")
    except Exception as exc:  # noqa: BLE001 -- Grafana is optional: any failure is one log line, never a crash
        reason = " ".join(str(exc).split())[:160] or type(exc).__name__
        log.info("grafana annotation skipped for phase %s: %s unreachable or refused (%s)", phase, url, reason)
        return False
    return True
