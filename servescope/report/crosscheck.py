"""Engine-side timings against the client's: how much of each request's wait was queue, compute or transport."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from servescope import engines
from servescope.engines.base import DURATIONS, HISTOGRAMS, TIMINGS, RequestTimings
from servescope.judgements.numpy_on_use import numpy as np
from servescope.report import query
from servescope.report.gauges import PAD_S, Prometheus, PrometheusError
from servescope.report.load import Run
from servescope.text import words

T = TypeVar("T")
COLD_LOAD_S = 1.0  # an Ollama load_duration above this means the model was (re)loaded for the request
COMPONENTS = ("load", "queue", "compute", "queue+transport", "transport")
COMPONENT_HELP = {
    "load": "model load inside the request (Ollama load_duration)",
    "queue": "waiting inside the engine before compute",
    "compute": "prompt processing + generation as the engine timed it",
    "queue+transport": "client E2E minus engine compute (llama.cpp reports no queue time, so the two are one)",
    "transport": "client E2E minus the engine's own total (HTTP, streaming, client)",
}


@dataclass
class CrossCheck:
    """One engine instance's engine-side timings beside the client's: its requests' queue, compute and transport."""

    instance: str
    engine: str
    available: bool
    source: str  # where the engine-side numbers came from, or why there are none
    requests: int = 0
    components_mean_s: dict[str, float] = field(default_factory=dict)
    client_e2e_mean_s: float | None = None
    client_ttft_mean_s: float | None = None
    engine_first_token_mean_s: float | None = None  # what the engine says it spent before the first token
    histogram_means_s: dict[str, float] = field(default_factory=dict)  # histograms: queue, prefill, decode, server_e2e
    cold_loads: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


MAX_COLD_LOADS = 100  # cold loads listed per engine; a run reloading the model every request says so once


# The numbers the cross-check reads from an engine's own stats, parsed once per request (each kept as JSON so that
# its type is checked: a string or true there is not a duration).
_OLLAMA_KEYS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")
_LLAMACPP_KEYS = ("prompt_ms", "predicted_ms", "cache_n", "predicted_n")
_STATS = json.dumps(
    {
        **{k: "JSON" for key in _OLLAMA_KEYS for k in (f"{key}_ns", key)},
        **{k: "JSON" for k in _LLAMACPP_KEYS},
        "eval_count": "JSON",
        "timings": {k: "JSON" for k in _LLAMACPP_KEYS},
    }
)


def _number(value: str, integer: bool = False) -> str:
    """SQL: a parsed stats value as a DOUBLE when it is a JSON number (an integer one, if asked), else NULL."""
    types = "('BIGINT', 'UBIGINT')" if integer else "('BIGINT', 'UBIGINT', 'DOUBLE')"
    return f"CASE WHEN json_type({value}) IN {types} THEN ({value})::DOUBLE END"


def _ns(key: str) -> str:
    """SQL: an Ollama duration in seconds, from key_ns or key (nanoseconds either way)."""
    return f"coalesce({_number(f's.{key}_ns')}, {_number(f's.{key}')}) / 1e9"


def timing(key: str, integer: bool = False) -> str:
    """SQL: a llama.cpp timing, from its `timings` object, or from the top level when there is none."""
    return f"CASE WHEN s.timings IS NOT NULL THEN {_number(f's.timings.{key}', integer)} ELSE {_number(f's.{key}', integer)} END"


# An engine's own numbers for one request, in seconds, as SQL over the parsed stats `s` (one rule each, used by the
# cross-check, the TTFT split and the noise check alike). NULL where the record does not hold them.
OLLAMA_TOTAL = _ns("total_duration")
OLLAMA = {
    "total": OLLAMA_TOTAL,
    "load": f"coalesce({_ns('load_duration')}, 0.0)",
    "prompt": f"coalesce({_ns('prompt_eval_duration')}, 0.0)",
    "generation": f"coalesce({_ns('eval_duration')}, 0.0)",
}
LLAMACPP_PROMPT, LLAMACPP_GENERATION = f"{timing('prompt_ms')} / 1000.0", f"{timing('predicted_ms')} / 1000.0"
HAS_LLAMACPP = f"{timing('prompt_ms')} IS NOT NULL AND {timing('predicted_ms')} IS NOT NULL"
# What a request cost the engine: its own timing when it reports one (llama.cpp: prompt + generation; Ollama:
# total_duration), else the client's E2E.
REQUEST_TIME = (
    f"CASE WHEN {HAS_LLAMACPP} THEN {LLAMACPP_PROMPT} + {LLAMACPP_GENERATION} ELSE coalesce({OLLAMA_TOTAL}, e2e_s) END"
)


def fmean(values: np.ndarray) -> float:
    return math.fsum(values.tolist()) / len(values)  # statistics.fmean: the exact sum over n


def _mean(values: np.ndarray) -> float | None:
    values = values[np.isfinite(values)]
    return fmean(values) if len(values) else None


# The requests with their engine stats parsed once (as `s`), for the expressions above.
PARSED = f"(SELECT *, from_json(engine_stats, '{_STATS}') AS s FROM requests)"


def columns(run: Run, where: str, params: list, **exprs: str) -> dict[str, np.ndarray]:
    """Per-request expressions over the requests meeting where (s: their parsed stats), in the report's order;
    NULL numbers read as NaN."""
    sql = f"SELECT {', '.join(f'{e} AS {k}' for k, e in exprs.items())} FROM {PARSED} WHERE {where} ORDER BY {query.ORDER}"
    data = run.con.execute(sql, params).fetchnumpy()
    return {k: query.plain(v) for k, v in data.items()}


def _answered(run: Run, instance: str, having: str | None = None, **exprs: str) -> dict[str, np.ndarray]:
    """The client's e2e and ttft, and exprs, of the instance's successful requests with an E2E (and having)."""
    where = f"ok AND instance = ? AND {having + ' AND ' if having else ''}e2e_s IS NOT NULL"
    return columns(run, where, [instance], e2e="e2e_s", ttft="ttft_s", **exprs)


def _client_side(instance: str, engine: str, c: dict[str, np.ndarray], source: str, missing: str = "") -> CrossCheck:
    """The cross-check of the requests in c (_answered's): their client means beside the engine's, from source;
    not available, missing said as its source, when there are none."""
    n = len(c["e2e"])
    if not n:
        return CrossCheck(instance, engine, False, missing)
    cc = CrossCheck(instance, engine, True, source, requests=n)
    cc.client_e2e_mean_s = fmean(c["e2e"])
    cc.client_ttft_mean_s = _mean(c["ttft"])
    return cc


def ollama(run: Run, instance: str, engine: str = engines.OLLAMA.name) -> CrossCheck:
    """An engine whose final objects carry Ollama's durations (engine: its kind, for the record)."""
    c = _answered(
        run,
        instance,
        f"{OLLAMA_TOTAL} IS NOT NULL",
        total=OLLAMA["total"],
        load=OLLAMA["load"],
        pe=OLLAMA["prompt"],
        ev=OLLAMA["generation"],
        prompt_id="prompt_id",
        phase="phase",
    )
    cc = _client_side(
        instance,
        engine,
        c,
        "Ollama's final object: *_duration (ns)",
        "no Ollama durations in the records (engine_stats empty)",
    )
    if not cc.available:
        return cc
    cc.components_mean_s = {
        "load": fmean(c["load"]),
        "queue": fmean(np.maximum(0.0, c["total"] - c["load"] - c["pe"] - c["ev"])),
        "compute": fmean(c["pe"] + c["ev"]),
        "transport": fmean(np.maximum(0.0, c["e2e"] - c["total"])),
    }
    cc.engine_first_token_mean_s = fmean(c["load"] + c["pe"])
    cold = np.flatnonzero(c["load"] > COLD_LOAD_S)
    cc.cold_loads = [
        {"prompt_id": c["prompt_id"][i], "phase": c["phase"][i], "load_s": float(c["load"][i])}
        for i in cold[:MAX_COLD_LOADS]
    ]
    if len(cold) > MAX_COLD_LOADS:
        cc.notes.append(f"{len(cold)} cold loads, the first {MAX_COLD_LOADS} listed")
    cc.notes.append(
        "queue = total - load - prompt eval - eval (time in Ollama outside the model); "
        "transport = client E2E - total_duration, floored at 0"
    )
    return cc


def llamacpp(run: Run, instance: str, engine: str = engines.LLAMACPP.name) -> CrossCheck:
    """An engine whose final chunks carry llama.cpp's `timings` (engine: its kind, for the record)."""
    c = _answered(
        run,
        instance,
        HAS_LLAMACPP,
        prompt=LLAMACPP_PROMPT,
        predicted=LLAMACPP_GENERATION,
        cache_n=timing("cache_n"),
        predicted_n=timing("predicted_n", integer=True),
        tokens="output_tokens",
    )
    cc = _client_side(
        instance,
        engine,
        c,
        "llama.cpp's `timings` (prompt_ms, predicted_ms)",
        "no llama.cpp timings in the records (engine_stats empty)",
    )
    if not cc.available:
        return cc
    cc.components_mean_s = {
        "compute": fmean(c["prompt"] + c["predicted"]),
        "queue+transport": fmean(np.maximum(0.0, c["e2e"] - c["prompt"] - c["predicted"])),
    }
    cc.engine_first_token_mean_s = fmean(c["prompt"])
    cached = c["cache_n"][np.isfinite(c["cache_n"])]
    if len(cached):
        cc.notes.append(f"prompt tokens reused from the cache (cache_n): mean {fmean(cached):.1f}")
    counted = np.isfinite(c["predicted_n"]) & np.isfinite(c["tokens"])
    mismatched = int(np.count_nonzero(c["predicted_n"][counted] != c["tokens"][counted]))
    if mismatched:
        cc.notes.append(
            f"{words.count(mismatched, 'request')} where predicted_n differs from the client's output token count"
        )
    return cc


def histograms(run: Run, instance: str, client: Prometheus | None, engine: str = engines.VLLM.name) -> CrossCheck:
    """An engine whose responses carry no timings: the means of its own histograms (its adapter's RequestTimings)
    over the run's window, from Prometheus."""
    adapter = engines.kind(engine)
    names, who = adapter.timings.histograms, adapter.said
    c = _answered(run, instance)
    if client is None:
        return CrossCheck(
            instance,
            engine,
            False,
            f"{who}'s queue/prefill histograms come from Prometheus, which did not answer (see the section Gauges over the run)",
        )
    phases = run.phases_of(instance)
    if not phases or not len(c["e2e"]):
        return CrossCheck(instance, engine, False, "no phases or successful requests for this engine")
    start, end = min(p.started_at for p in phases), max(p.ended_at for p in phases)
    window = f"{int(end - start + 2 * PAD_S) + 1}s"
    means: dict[str, float] = {}
    try:
        for name, metric in names.items():
            expr = f"sum(increase({metric}_sum[{window}])) / sum(increase({metric}_count[{window}]))"
            result = client.query(expr, end + PAD_S)
            if result:
                value = float(result[0]["value"][1])
                if value == value:  # NaN when no request finished in the window
                    means[name] = value
    except PrometheusError as exc:
        return CrossCheck(instance, engine, False, f"no {who} histograms: {exc}")
    if "queue" not in means:
        queue = names.get("queue", "queue-time histogram")
        return CrossCheck(
            instance,
            engine,
            False,
            f"no {queue} samples in the run window (is raw {who} /metrics scraped?)",
        )
    cc = _client_side(instance, engine, c, f"Prometheus: {who} histograms, mean over the run window ({window})")
    cc.histogram_means_s = means
    cc.components_mean_s["queue"] = means["queue"]
    if "prefill" in means or "decode" in means:
        cc.components_mean_s["compute"] = means.get("prefill", 0.0) + means.get("decode", 0.0)
    if "server_e2e" in means:
        cc.components_mean_s["transport"] = max(0.0, cc.client_e2e_mean_s - means["server_e2e"])
    cc.engine_first_token_mean_s = means["queue"] + means.get("prefill", 0.0)
    cc.notes.append(
        f"histogram means over every request {who} finished in the window (warm-up included if it fell inside)"
    )
    return cc


def timings_of(kind: str) -> RequestTimings | None:
    """The engine's own request timings as its adapter declares them; None for a kind servescope does not know."""
    adapter = engines.ENGINES.get(kind)
    return adapter.timings if adapter is not None else None


def per_engine(run: Run, readers: Mapping[str, Callable[[str, str], T]], unknown: Callable[[str, str], T]) -> list[T]:
    """readers[form](instance, kind) for each engine instance of the run, the form of its own timings (DURATIONS,
    TIMINGS, HISTOGRAMS) chosen by its adapter; unknown(instance, kind) where it declares none."""
    out = []
    for instance, info in run.engines.items():
        timings = timings_of(info.kind)
        reader = readers.get(timings.form) if timings is not None else None
        out.append((reader or unknown)(instance, info.kind))
    return out


def build(run: Run, client: Prometheus | None) -> list[CrossCheck]:
    readers = {
        DURATIONS: lambda instance, kind: ollama(run, instance, kind),
        TIMINGS: lambda instance, kind: llamacpp(run, instance, kind),
        HISTOGRAMS: lambda instance, kind: histograms(run, instance, client, kind),
    }
    return per_engine(
        run,
        readers,
        lambda instance, kind: CrossCheck(instance, kind, False, f"no engine-side timings known for {kind!r}"),
    )


def to_json(checks: list[CrossCheck]) -> list[dict]:
    return [asdict(c) for c in checks]
