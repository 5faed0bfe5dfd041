"""Whether a server is up: one GET answered 200 within the timeout (not answering, or any other status, is "no")."""

from __future__ import annotations

import requests


def is_up(url: str, timeout: float = 2.0) -> bool:
    try:
        return requests.get(url, timeout=timeout).status_code == 200
    except requests.RequestException:
        return False
