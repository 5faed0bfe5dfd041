"""Ollama's own durations of one request (its final object, nanoseconds) and the time it held the request outside the model.

Ollama reports no queue; its final object says how long the request took in all (`total_duration`) and in
each part spent in the model (`load_duration`, `prompt_eval_duration`, `eval_duration`). What the whole
holds beyond the parts is the time Ollama kept the request waiting: for one of OLLAMA_NUM_PARALLEL's slots,
as a rule. The exporter's proxy (servescope_proxy_queue_seconds), the binding rule and the report's TTFT
split (servescope/report/ttft_split.py, in SQL over the same keys) read it so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TOTAL = "total_duration"
PARTS = ("load_duration", "prompt_eval_duration", "eval_duration")
DURATIONS = (TOTAL, *PARTS)


def held_s(durations: Mapping[str, Any], suffix: str = "") -> float | None:
    """Seconds Ollama held the request outside the model, from its durations (keys as Ollama names them, or with
    `suffix`, e.g. "_ns" as the load generator's records keep them); None when one is missing or not a number."""
    values = [durations.get(key + suffix) for key in DURATIONS]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in values):
        return None
    total, *parts = values
    return max(0.0, total - sum(parts)) / 1e9
