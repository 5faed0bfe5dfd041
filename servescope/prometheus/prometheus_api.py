"""Prometheus' HTTP API as servescope reads it (instant and range queries, the running configuration): bounded, shape-checked.

Every call goes through servescope/host/bounded_http.py (one deadline, a body cap, same-origin redirects only, credentials
masked), and every answer is checked against the shape Prometheus documents before anyone reads it: a vector is a
list of {"metric": {label: text}, "value": [time, "number"]}, a matrix the same with "values": [[time, "number"],
...]. What is not so (`{"result": 5}`, a metric that is a list, a label that is a dict, a value `null`) is one
PrometheusError naming the Prometheus asked, never a TypeError in a reader. The readers: the report's gauges and
cross-check, the plan's traffic (servescope/report/traffic.py), the run's sampler in fleet mode (servescope/prometheus/sampler.py).
Results keep Prometheus' own layout, with times and values as floats ("NaN" and "+Inf" included: a reader decides).
"""

from __future__ import annotations

import math
import time
from typing import Any
from urllib.parse import urlencode

from servescope.contracts.urls import redact
from servescope.host import bounded_http
from servescope.text import printable

TIMEOUT_S = 5.0
# A running configuration is a few KB; a fleet's with thousands of targets under a MB.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
# The `global:` block of a configuration: a few lines; past this, it is not one.
MAX_GLOBAL_BYTES = 64 * 1024


class PrometheusError(Exception):
    """Prometheus could not answer, or answered what is not Prometheus' API: one printable line saying why."""

    def __init__(self, message: str):
        super().__init__(printable.line(message, limit=400))


class Prometheus:
    """The API calls servescope makes, each with one-line errors."""

    def __init__(self, url: str, timeout: float = TIMEOUT_S):
        self.url = url.strip().rstrip("/")
        self.shown = printable.line(redact(self.url))
        self.timeout = timeout

    def _get(self, path: str, params: dict[str, Any], max_bytes: int = bounded_http.MAX_BODY_BYTES) -> dict:
        """The `data` of a success answer to GET path?params."""
        try:
            origin = bounded_http.Origin(self.url, accept="application/json", user_agent="servescope-report")
        except bounded_http.ServiceError:
            raise PrometheusError(f"Prometheus at {self.shown}: not a URL (http://host:port)") from None
        try:
            with origin:
                answer = origin.get(
                    f"{path}?{urlencode(params)}" if params else path,
                    time.monotonic() + self.timeout,
                    max_bytes=max_bytes,
                    redirects=bounded_http.MAX_REDIRECTS,
                )
        except bounded_http.ServiceError as exc:
            if exc.timed_out:
                raise PrometheusError(f"Prometheus at {self.shown} did not answer within {self.timeout:g}s") from None
            if exc.unreachable:
                raise PrometheusError(
                    f"Prometheus at {self.shown} is unreachable (connection refused or no route)"
                ) from None
            raise PrometheusError(f"Prometheus at {self.shown}: {exc.reason}") from None
        try:
            return data_of(answer.body, answer.status)
        except ValueError as exc:
            raise PrometheusError(f"Prometheus at {self.shown}{exc}") from None

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """An instant query's vector (a scalar answer as a vector of one, without labels)."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        data = self._get("/api/v1/query", params)
        try:
            return vector(data)
        except ValueError as exc:
            raise PrometheusError(f"Prometheus at {self.shown}{exc}") from None

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        """A range query's matrix."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        data = self._get("/api/v1/query_range", params)
        try:
            return matrix(data)
        except ValueError as exc:
            raise PrometheusError(f"Prometheus at {self.shown}{exc}") from None

    def global_config(self) -> dict[str, Any]:
        """The `global:` block of the configuration Prometheus runs with ({} when it has none)."""
        data = self._get("/api/v1/status/config", {}, max_bytes=MAX_CONFIG_BYTES)
        text = data.get("yaml")
        if not isinstance(text, str):
            raise PrometheusError(f"Prometheus at {self.shown} answered its configuration without its YAML")
        try:
            return global_block(text)
        except ValueError as exc:
            raise PrometheusError(f"Prometheus at {self.shown}: its configuration: {exc}") from None


# --- the shapes, read from a body (ValueError with the words after "Prometheus at URL") ----------------------------
def data_of(body: bytes | str, status: int) -> dict:
    """The `data` object of a success answer; ValueError (its text starts with " " or ": ") for anything else."""
    try:
        answer = bounded_http.parse_json(body, "", error=ValueError)
    except ValueError as exc:
        why = str(exc).removeprefix(": ")
        raise ValueError(
            f" answered HTTP {status} without JSON" if why.startswith("not JSON") else f": {why}"
        ) from None
    if status != 200 or not isinstance(answer, dict) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, dict) else None
        said = printable.line(error, limit=200) if isinstance(error, str) and error.strip() else f"HTTP {status}"
        raise ValueError(f": {said}")
    if not isinstance(answer.get("data"), dict):
        raise ValueError(" answered success without its data")
    return answer["data"]


def vector(data: dict) -> list[dict]:
    """[{"metric": labels, "value": [t, v]}] from an instant query's data (a scalar as one series without labels)."""
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        return [{"metric": {}, "value": _sample(result, "the scalar")}]
    if kind not in ("vector", None) or not isinstance(result, list):
        raise ValueError(f" answered a {_kind(kind, result)} where a vector was asked")
    out = []
    for n, item in enumerate(result):
        where = f"series {n + 1} of the vector"
        if not isinstance(item, dict):
            raise ValueError(f" answered a vector whose {where} is not an object")
        out.append({"metric": _labels(item.get("metric"), where), "value": _sample(item.get("value"), where)})
    return out


def matrix(data: dict) -> list[dict]:
    """[{"metric": labels, "values": [[t, v], ...]}] from a range query's data."""
    kind, result = data.get("resultType"), data.get("result")
    if kind not in ("matrix", None) or not isinstance(result, list):
        raise ValueError(f" answered a {_kind(kind, result)} where a matrix was asked")
    out = []
    for n, item in enumerate(result):
        where = f"series {n + 1} of the matrix"
        if not isinstance(item, dict) or not isinstance(item.get("values"), list):
            raise ValueError(f" answered a matrix whose {where} has no list of values")
        out.append(
            {"metric": _labels(item.get("metric"), where), "values": [_sample(p, where) for p in item["values"]]}
        )
    return out


def global_block(text: str) -> dict[str, Any]:
    """The top-level `global:` mapping of a Prometheus configuration, read alone: the rest of a configuration (any
    size, any nesting) is never parsed. ValueError (one line) when it is not YAML of a mapping."""
    import yaml

    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.rstrip() == "global:" or line.startswith("global: ")), None)
    if start is None:
        return {}
    end = next((j for j in range(start + 1, len(lines)) if lines[j][:1] not in ("", " ", "\t", "#")), len(lines))
    block = "\n".join(lines[start:end])
    if len(block) > MAX_GLOBAL_BYTES:
        raise ValueError(f"a global block larger than {MAX_GLOBAL_BYTES} bytes")
    try:
        parsed = yaml.safe_load(block)
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        raise ValueError(f"not YAML ({printable.line(exc, limit=80)})") from None
    top = parsed.get("global") if isinstance(parsed, dict) else None
    if top is None:
        return {}
    if not isinstance(top, dict):
        raise ValueError("its global block is not a mapping")
    return top


def _labels(metric: object, where: str) -> dict[str, str]:
    if not isinstance(metric, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
        raise ValueError(f" answered a {where} whose labels are not text")
    return metric


def _sample(pair: object, where: str) -> list[float]:
    """[time, value] with both as floats; Prometheus sends the value as text ("1.5", "NaN", "+Inf")."""
    if not isinstance(pair, list) or len(pair) != 2:
        raise ValueError(f" answered a {where} whose sample is not [time, value]")
    t, value = pair
    try:
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(float(t)):
            raise ValueError
    except (ValueError, OverflowError):  # an integer too large for a float: JSON allows it
        raise ValueError(f" answered a {where} whose sample time is not a number") from None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f" answered a {where} whose sample value is not a number")
    try:
        return [float(t), float(value)]
    except (ValueError, OverflowError):
        raise ValueError(f" answered a {where} whose sample value is not a number") from None


def _kind(kind: object, result: object) -> str:
    if isinstance(kind, str) and kind in ("matrix", "vector", "scalar", "string"):
        return kind
    return f"result of {type(result).__name__}"
