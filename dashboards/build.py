"""Grafana dashboards and provisioning as code: `python -m dashboards.build` writes them, `--check` fails when stale.

Every panel query is built by the small PromQL helpers below so that every rate is taken over
`$__rate_interval` and every selector honours the dashboard variables (datasource, engine,
instance, model). Metric names are the exporter's (servescope.contracts.series) and the engines' own.

Why plain dicts and not Grafana's typed builders (grafana-foundation-sdk, alpha): the panel, variable
and shell helpers below rewritten on its 11.2 builders produced dashboards that passed --check and the
live every-query test, but saved few of their lines. Against: its
versions carry a build-time epoch ("1769699630!11.2.0"), so the newest build is the 10.1 schema and no
`>=` range is safe, only an exact pin; builds with the same Grafana label differ (an 11.2 build of
2024-10 lacks Dataquery.range(), the 10.1 one AnnotationQuery.built_in(), the 11.6 one rewrites every
file); it would tie the JSON to one Grafana schema while GRAFANA_IMAGE is a knob (Grafana migrates our
schemaVersion 39 forward on load); and it cannot write a variable's `definition`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

import yaml

from servescope import engines
from servescope.contracts import series
from servescope.engines.base import EngineKind
from servescope.prometheus.prometheus_config import COMPOSE_PORTS, DEFAULT_SCRAPE_INTERVAL
from servescope.text import command_name

HERE = Path(__file__).resolve().parent
JSON_DIR = HERE / "json"
PROVISIONING_DIR = HERE / "provisioning"
DATASOURCE_FILE = PROVISIONING_DIR / "datasources" / "prometheus.yml"
PROVIDER_FILE = PROVISIONING_DIR / "dashboards" / "servescope.yml"

# The provisioned Prometheus datasource: a fixed uid so dashboards never depend on Grafana's
# generated ids, and timeInterval = the scrape interval so $__rate_interval is >= 4 scrapes.
DATASOURCE_UID = "servescope-prometheus"
DATASOURCE_NAME = "Prometheus"
SCRAPE_INTERVAL = DEFAULT_SCRAPE_INTERVAL
# Where Grafana (in Compose) finds the JSON: docker-compose.yml mounts dashboards/json here.
GRAFANA_DASHBOARDS_PATH = "/var/lib/grafana/dashboards/servescope"
GRAFANA_PROVISIONING_PATH = "/etc/grafana/provisioning"
# Load phases posted by dashboards.annotations carry these tags; dashboards show annotations with all of them.
PHASE_TAGS = ("servescope", "phase")

DS = {"type": "prometheus", "uid": "${datasource}"}

# ---------------------------------------------------------------------------------------------
# PromQL helpers
# ---------------------------------------------------------------------------------------------

# Variable matchers per family of series. Engine-neutral series carry engine/instance/model;
# raw vLLM series carry instance (set by the scrape config) and model_name; client series
# carry engine/scenario.
NEUTRAL = {"engine": "=~$engine", "instance": "=~$instance", "model": "=~$model"}
ENGINE_ONLY = {"engine": "=~$engine", "instance": "=~$instance"}


def raw(kind: EngineKind) -> dict[str, str]:
    """An engine's own series: `instance` from the scrape config, the model under the label its page uses."""
    label = kind.metrics.model_label
    return {"instance": "=~$instance", **({label: "=~$model"} if label else {})}


VLLM_RAW = raw(engines.VLLM)
CLIENT = {"engine": "=~$engine"}
CLIENT_SCENARIO = {"engine": "=~$engine", "scenario": "=~$scenario"}


def sel(metric: str, matchers: dict[str, str] | None = None, **extra: str) -> str:
    """metric{label=~"$var",...}: matchers map label -> operator+value ("=~$engine", "=vllm", "!=ok")."""
    merged = {**(matchers or {}), **extra}
    parts = []
    for label, spec in merged.items():
        for op in ("=~", "!~", "!=", "="):
            if spec.startswith(op):
                parts.append(f'{label}{op}"{spec[len(op) :]}"')
                break
        else:
            raise ValueError(f"matcher for {label!r} must start with an operator: {spec!r}")
    return f"{metric}{{{','.join(parts)}}}" if parts else metric


def rate(selector: str) -> str:
    return f"rate({selector}[$__rate_interval])"


def sum_by(labels: Iterable[str], expr: str) -> str:
    return f"sum by ({', '.join(labels)}) ({expr})"


def quantile(q: float, bucket_selectors: Iterable[str], by: Iterable[str]) -> str:
    """histogram_quantile over one or more bucket selectors joined with `or` (vLLM's renamed histograms)."""
    rates = " or ".join(rate(s) for s in bucket_selectors)
    return f"histogram_quantile({q}, {sum_by([*by, 'le'], rates)})"


def mean(metric: str, matchers: dict[str, str], by: Iterable[str]) -> str:
    """Average of a histogram over the window: rate(_sum) / rate(_count)."""
    by = list(by)
    return f"{sum_by(by, rate(sel(metric + '_sum', matchers)))} / {sum_by(by, rate(sel(metric + '_count', matchers)))}"


def or_zero(expr: str, zero_like: str, on: Iterable[str]) -> str:
    """`expr`, plus a 0 for every `zero_like` series (matched `on` labels) that expr lacks: 0 failures, not 'No data'."""
    return f"({expr}) or ({zero_like} * 0 unless on ({', '.join(on)}) ({expr}))"


# ---------------------------------------------------------------------------------------------
# Panels
# ---------------------------------------------------------------------------------------------


def target(expr: str, legend: str) -> dict:
    """One query of a panel; the panel letters its queries A, B, ... in order."""
    return {"refId": "A", "expr": expr, "legendFormat": legend, "datasource": DS, "range": True, "instant": False}


def _panel(
    kind: str, title: str, description: str, defaults: dict, options: dict, targets: list[dict], size: tuple[int, int]
) -> dict:
    """What every data panel has: the datasource variable, field defaults, its queries lettered A, B, ..., a size."""
    for index, tgt in enumerate(targets):
        tgt["refId"] = chr(ord("A") + index)
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": targets,
        "_size": size,
    }


def timeseries(
    title: str,
    description: str,
    unit: str,
    targets: list[dict],
    *,
    width: int = 8,
    height: int = 8,
    min_zero: bool = True,
    stack: bool = False,
) -> dict:
    custom = {"drawStyle": "line", "lineWidth": 2, "fillOpacity": 10, "showPoints": "never", "spanNulls": True}
    if stack:
        custom["stacking"] = {"mode": "normal", "group": "A"}
    defaults: dict = {"unit": unit, "custom": custom}
    if min_zero:
        defaults["min"] = 0
    options = {
        "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return _panel("timeseries", title, description, defaults, options, targets, (width, height))


def stat(
    title: str,
    description: str,
    unit: str,
    targets: list[dict],
    *,
    width: int = 4,
    height: int = 5,
    mappings: list | None = None,
    thresholds: list | None = None,
) -> dict:
    defaults: dict = {"unit": unit, "mappings": mappings or []}
    defaults["thresholds"] = {"mode": "absolute", "steps": thresholds or [{"color": "blue", "value": None}]}
    options = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "background" if thresholds else "value",
        "graphMode": "area",
        "textMode": "value_and_name",
        "justifyMode": "auto",
        "orientation": "auto",
    }
    return _panel("stat", title, description, defaults, options, targets, (width, height))


def heatmap(title: str, description: str, unit: str, targets: list[dict], *, width: int = 12, height: int = 8) -> dict:
    """The spread of one gauge across many series at each instant: Grafana buckets the instances' values itself."""
    options = {
        "calculate": True,
        "calculation": {"yBuckets": {"mode": "count", "value": "10"}},
        "color": {"mode": "scheme", "scheme": "Oranges", "fill": "dark-orange", "exponent": 0.5, "steps": 64},
        "yAxis": {"unit": unit, "axisPlacement": "left"},
        "cellGap": 1,
        "tooltip": {"mode": "single", "yHistogram": True},
        "legend": {"show": True},
    }
    return _panel("heatmap", title, description, {"unit": unit}, options, targets, (width, height))


def row(title: str) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_size": (24, 1)}


UP_MAPPINGS = [
    {
        "type": "value",
        "options": {
            "0": {"text": "down", "color": "red", "index": 0},
            "1": {"text": "up", "color": "green", "index": 1},
        },
    }
]
UP_THRESHOLDS = [{"color": "red", "value": None}, {"color": "green", "value": 1}]
TOKENS_PER_S = "suffix: tok/s"


def layout(panels: list[dict]) -> list[dict]:
    """Place panels left to right in a 24-column grid, wrapping lines; ids in order from 1."""
    x = y = line_height = 0
    placed = []
    for panel_id, panel in enumerate(panels, start=1):
        width, height = panel.pop("_size")
        if x + width > 24:
            x, y, line_height = 0, y + line_height, 0
        panel = {"id": panel_id, "gridPos": {"x": x, "y": y, "w": width, "h": height}, **panel}
        placed.append(panel)
        x += width
        line_height = max(line_height, height)
        if panel["type"] == "row":
            x, y, line_height = 0, y + height, 0
    return placed


# ---------------------------------------------------------------------------------------------
# Variables and dashboard shell
# ---------------------------------------------------------------------------------------------


def datasource_variable() -> dict:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {"text": DATASOURCE_NAME, "value": DATASOURCE_UID},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "options": [],
    }


def query_variable(name: str, label: str, query: str) -> dict:
    # allValue ".*" so "All" also matches series without the label (llama.cpp reports no model).
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"text": ["All"], "value": ["$__all"]},
        "hide": 0,
        "regex": "",
        "options": [],
    }


def constant_variable(name: str, value: str) -> dict:
    return {
        "name": name,
        "type": "constant",
        "query": value,
        "hide": 2,
        "current": {"text": value, "value": value},
        "options": [],
    }


def engine_variables(engine: str | None = None) -> list[dict]:
    """datasource, engine (a hidden constant on a one-engine dashboard), instance, model."""
    engine_var = (
        constant_variable("engine", engine)
        if engine
        else query_variable("engine", "Engine", f"label_values({series.ENGINE_UP}, engine)")
    )
    return [
        datasource_variable(),
        engine_var,
        query_variable("instance", "Instance", f'label_values({series.ENGINE_UP}{{engine=~"$engine"}}, instance)'),
        query_variable(
            "model",
            "Model",
            f'label_values({series.REQUESTS_RUNNING}{{engine=~"$engine",instance=~"$instance"}}, model)',
        ),
    ]


def phase_annotations() -> dict:
    return {
        "list": [
            {
                "builtIn": 1,
                "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                "enable": True,
                "hide": True,
                "iconColor": "rgba(0, 211, 255, 1)",
                "name": "Annotations & Alerts",
                "type": "dashboard",
            },
            {
                "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                "enable": True,
                "hide": False,
                "iconColor": "purple",
                "name": "Load phases",
                "target": {"type": "tags", "tags": list(PHASE_TAGS), "matchAny": False, "limit": 200},
            },
        ]
    }


def dashboard(uid: str, title: str, description: str, variables: list[dict], panels: list[dict]) -> dict:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["servescope"],
        "editable": False,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "5s",
        "time": {"from": "now-30m", "to": "now"},
        "timezone": "browser",
        "annotations": phase_annotations(),
        "templating": {"list": variables},
        "links": [{"type": "dashboards", "tags": ["servescope"], "asDropdown": True, "title": "servescope"}],
        "panels": layout(panels),
    }


# ---------------------------------------------------------------------------------------------
# The four dashboards
# ---------------------------------------------------------------------------------------------


def _client_requests_ok(matchers: dict[str, str]) -> str:
    return sel(series.CLIENT_REQUESTS, matchers, outcome="=ok")


def _client_failures(by: list[str], matchers: dict[str, str]) -> str:
    """Failed requests/s by `by` (which may include the outcome); 0 per engine/scenario that had none."""
    failed = sum_by(by, rate(sel(series.CLIENT_REQUESTS, matchers, outcome="!=ok")))
    keys = [label for label in by if label != "outcome"]
    every = sum_by(keys, rate(sel(series.CLIENT_REQUESTS, matchers)))
    return or_zero(failed, every, keys)


def _quantile_targets(bucket_selectors: list[str], by: list[str], legend: str) -> list[dict]:
    """p50 and p95 of one histogram (or of its names across engine versions, joined with `or`)."""
    return [target(quantile(q, bucket_selectors, by), f"{legend} p{int(q * 100)}") for q in (0.5, 0.95)]


def _latency_targets(metric: str, matchers: dict[str, str], by: list[str], legend: str) -> list[dict]:
    return _quantile_targets([sel(f"{metric}_bucket", matchers)], by, legend)


def _raw_buckets(kind: EngineKind, which: str) -> list[str]:
    """One of an engine's latency histograms as bucket selectors, each of its names (a rename) joined with `or`."""
    return [sel(f"{name}_bucket", raw(kind)) for name in kind.metrics.latency.get(which, ())]


def _with_latency(which: str) -> list[EngineKind]:
    """The engines whose own page has this latency histogram (ttft, itl, e2e)."""
    return [k for k in engines.ENGINES.values() if k.metrics is not None and k.metrics.latency.get(which)]


def _server_latency(which: str) -> list[dict]:
    return [
        t
        for kind in _with_latency(which)
        for t in _quantile_targets(_raw_buckets(kind, which), ["instance"], "{{instance}}")
    ]


def _named(kinds: list[EngineKind], which: str, how: str) -> str:
    """'vLLM time_to_first_token histogram' for each engine: the short names of its histograms, as the panels say."""
    parts = []
    for kind in kinds:
        first, *older = (n.split(":", 1)[-1].removesuffix("_seconds") for n in kind.metrics.latency[which])
        before = f" (older: {' / '.join(older)})" if older else ""
        parts.append(f"{kind.said} {first} {how}{before}")
    return "; ".join(parts)


def _prompt_rate(name: str) -> str:
    return sum_by(["engine", "instance"], rate(sel(name, NEUTRAL)))


def _reuse_ratio(matchers: dict[str, str]) -> str:
    """Cached prompt tokens / prompt tokens over the window; no point while no prompt came (not a 0/0)."""
    cached = sum_by(["engine", "instance"], rate(sel(series.PROMPT_CACHED_TOKENS, matchers)))
    prompt = sum_by(["engine", "instance"], rate(sel(series.PROMPT_TOKENS, matchers)))
    return f"{cached} / ({prompt} > 0)"


def _none_say(which: str) -> str:
    """The engines with a page but no such histogram, as the panel says it."""
    none = [k.said for k in engines.ENGINES.values() if k.metrics is not None and not k.metrics.latency.get(which)]
    return (
        f"{' and '.join(none)} {'keeps' if len(none) == 1 else 'keep'} no histogram" if none else "every engine has one"
    )


def engine_comparison() -> dict:
    panels = [
        row("Which lever? running, waiting and KV usage per engine (the reference page's section 4)"),
        stat(
            "Engine up",
            "servescope_engine_up: 1 when the exporter read the engine in its last scrape.",
            "none",
            [target(sel(series.ENGINE_UP, ENGINE_ONLY), "{{instance}}")],
            width=24,
            height=4,
            mappings=UP_MAPPINGS,
            thresholds=UP_THRESHOLDS,
        ),
        timeseries(
            "Running requests",
            "Sequences in the running batch (vLLM running, llama.cpp busy slots; Ollama, source=proxy: requests "
            "the exporter's proxy relayed whose answer is streaming, none when nothing went through it). Flat at "
            "max-num-seqs under load = the batch cap.",
            "short",
            [target(sel(series.REQUESTS_RUNNING, NEUTRAL), "{{instance}}")],
        ),
        timeseries(
            "Waiting requests",
            "Queued, not yet scheduled. A queue that never drains: with KV usage low raise "
            "max-num-seqs; with KV usage near 100% raise VLLM_CPU_KVCACHE_SPACE or lower --max-model-len. "
            "Ollama (source=proxy): relayed requests without a byte of their answer yet, queued, loading or "
            "evaluating the prompt alike: its queue is on the Ollama dashboard, from its own durations.",
            "short",
            [target(sel(series.REQUESTS_WAITING, NEUTRAL), "{{instance}}")],
        ),
        timeseries(
            "KV cache usage",
            "Fraction of the paged KV pool in use. Near 100% under load is healthy; "
            "near 0% under real traffic means the budget is oversized. Ollama exposes none.",
            "percentunit",
            [target(sel(series.KV_CACHE_USAGE, NEUTRAL), "{{instance}}")],
        ),
        row("Throughput"),
        timeseries(
            "Output tokens/s (server)",
            "Generated tokens per second as the engines count them.",
            TOKENS_PER_S,
            [target(sum_by(["engine", "instance"], rate(sel(series.GENERATED_TOKENS, NEUTRAL))), "{{instance}}")],
        ),
        timeseries(
            "Requests/s (client)",
            "Successful requests per second as the load generator saw them.",
            "reqps",
            [target(sum_by(["engine"], rate(_client_requests_ok(CLIENT))), "{{engine}}")],
        ),
        timeseries(
            "Errors/s (client)",
            "Failed requests per second by engine (0 when none failed).",
            "reqps",
            [target(_client_failures(["engine"], CLIENT), "{{engine}}")],
        ),
        row("Prefix-cache reuse (conversations, shared prefixes: what the engine did not compute again)"),
        timeseries(
            "Prefix-cache reuse",
            "Share of prompt tokens the engine took from its prefix / prompt cache: rate of "
            f"{series.PROMPT_CACHED_TOKENS} / rate of {series.PROMPT_TOKENS} (vLLM prefix_cache_hits; llama.cpp "
            "prompt_tokens_cached). Near 0 with caching off; Ollama reports no cached tokens (no line).",
            "percentunit",
            [target(_reuse_ratio(NEUTRAL), "{{instance}}")],
            width=12,
        ),
        timeseries(
            "Prompt tokens/s: computed vs cached",
            "Prompt tokens per second the engine computed, and those it took from its cache instead.",
            TOKENS_PER_S,
            [
                target(
                    f"{_prompt_rate(series.PROMPT_TOKENS)} - {_prompt_rate(series.PROMPT_CACHED_TOKENS)}",
                    "{{instance}} computed",
                ),
                target(_prompt_rate(series.PROMPT_CACHED_TOKENS), "{{instance}} cached"),
            ],
            width=12,
        ),
        row("Latency: server view (engine histograms; Ollama via the exporter's proxy)"),
        timeseries(
            "TTFT (server)",
            f"{_named(_with_latency('ttft'), 'ttft', 'histogram')}; Ollama: first chunk through the proxy. "
            f"{_none_say('ttft')}: see the client view.",
            "s",
            [
                *_server_latency("ttft"),
                *_latency_targets(
                    series.PROXY_FIRST_CHUNK_SECONDS, ENGINE_ONLY, ["engine", "instance"], "{{instance}}"
                ),
            ],
            width=12,
        ),
        timeseries(
            "ITL (server)",
            f"{_named(_with_latency('itl'), 'itl', 'histogram')}.",
            "s",
            _server_latency("itl"),
            width=12,
        ),
        row("Latency: client view (the load generator: send -> first content chunk; gaps between content chunks)"),
        timeseries(
            "TTFT (client)",
            "servescope_client_ttft_seconds by engine.",
            "s",
            _latency_targets(series.CLIENT_TTFT, CLIENT, ["engine"], "{{engine}}"),
            width=12,
        ),
        timeseries(
            "ITL (client)",
            "servescope_client_itl_seconds by engine.",
            "s",
            _latency_targets(series.CLIENT_ITL, CLIENT, ["engine"], "{{engine}}"),
            width=12,
        ),
        row("Resource budget (the reference page's docker stats: use against limit)"),
        timeseries(
            "CPU cores in use vs limit",
            "Engine process (native) or container (Compose) CPU; "
            "dashed: the limit (its cgroup limit, else the machine's cores).",
            "short",
            [
                target(
                    sum_by(["engine", "instance"], rate(sel(f"{series.ENGINE_CPU_SECONDS}", ENGINE_ONLY))),
                    "{{instance}} used",
                ),
                target(sel(series.ENGINE_CPU_LIMIT, ENGINE_ONLY), "{{instance}} limit"),
            ],
            width=12,
        ),
        timeseries(
            "Memory vs limit",
            "Memory in use by the engine (native: the PSS of its process tree, shared pages once; Compose: as "
            "docker stats shows it) against its memory limit (its cgroup limit, else the machine's memory).",
            "bytes",
            [
                target(sel(series.ENGINE_RESIDENT_BYTES, ENGINE_ONLY), "{{instance}} used"),
                target(sel(series.ENGINE_MEMORY_LIMIT, ENGINE_ONLY), "{{instance}} limit"),
            ],
            width=12,
        ),
    ]
    return dashboard(
        "servescope-comparison",
        "servescope · engine comparison",
        "vLLM-CPU, llama.cpp and Ollama side by side: the reference page's section-4 gauges, throughput, "
        "TTFT/ITL from the server and the client, resource use against limits.",
        engine_variables(),
        panels,
    )


def _either(names: tuple[str, ...], by: list[str]) -> str:
    """The rate of a renamed vLLM counter under whichever of its names the page has (never both: `or`)."""
    return sum_by(by, " or ".join(rate(sel(name, VLLM_RAW)) for name in names))


def vllm_dashboard() -> dict:
    kind, page = engines.VLLM, engines.VLLM.metrics
    names = {src.series: src.names for src in page.sources}
    running, waiting = names[series.REQUESTS_RUNNING][0], names[series.REQUESTS_WAITING][0]
    kv_names = names[series.KV_CACHE_USAGE]
    hits, queries = names[series.PROMPT_CACHED_TOKENS], page.charted["prefix-cache queries"]
    (finished,) = page.charted["finish reasons"]
    kv_usage = [sel(name, VLLM_RAW) for name in kv_names]
    vllm = {"engine": f"={kind.name}", "instance": "=~$instance", "model": "=~$model"}
    by_instance = ["instance"]
    phases = [(part, kind.timings.histograms[part]) for part in ("queue", "prefill", "decode")]
    ttft, itl, e2e = (page.latency[which] for which in ("ttft", "itl", "e2e"))
    panels = [
        row("KV capacity: VLLM_CPU_KVCACHE_SPACE / (block size x dtype) -> blocks -> tokens -> max concurrency"),
        *(
            stat(title, description, unit, [target(sel(metric, vllm), "{{instance}}")], width=6)
            for title, description, unit, metric in (
                (
                    "KV blocks",
                    "num_gpu_blocks from vllm:cache_config_info (on CPU all from VLLM_CPU_KVCACHE_SPACE; "
                    "--swap-space adds none).",
                    "none",
                    series.KV_BLOCKS,
                ),
                (
                    "Block size",
                    "Tokens per KV block (block_size label of vllm:cache_config_info).",
                    "none",
                    series.KV_BLOCK_SIZE,
                ),
                (
                    "KV capacity",
                    "Tokens the KV cache holds: blocks x block size.",
                    "suffix: tokens",
                    series.KV_CAPACITY_TOKENS,
                ),
                (
                    "Max concurrency",
                    "Requests of the served max-model-len that fit at once (the startup log's 'Maximum concurrency ... x').",
                    "suffix: x",
                    series.KV_MAX_CONCURRENCY,
                ),
            )
        ),
        row("Scheduler"),
        timeseries(
            "Running and waiting",
            f"{running} / _waiting.",
            "short",
            [
                target(sum_by(by_instance, sel(running, VLLM_RAW)), "running {{instance}}"),
                target(sum_by(by_instance, sel(waiting, VLLM_RAW)), "waiting {{instance}}"),
            ],
        ),
        timeseries(
            "KV cache usage",
            f"{kv_names[0]} (0..1; {kv_names[1].split(':', 1)[1]} before 0.10).",
            "percentunit",
            [target(f"max by (instance) ({' or '.join(kv_usage)})", "{{instance}}")],
        ),
        timeseries(
            "Preemptions/s",
            f"{names[series.PREEMPTIONS][0]}: sequences evicted for lack of KV blocks and "
            "recomputed later. Above 0 under load = the KV cache is the bottleneck.",
            "short",
            [target(sum_by(by_instance, rate(sel(names[series.PREEMPTIONS][0], VLLM_RAW))), "{{instance}}")],
        ),
        timeseries(
            "Prefix-cache hit rate",
            f"{hits[0]} / {queries[0].split(':', 1)[1]} (tokens; {' / '.join(n.split(':', 1)[1] for n in hits[1:])} "
            "in 0.9.2-0.10).",
            "percentunit",
            [target(f"{_either(hits, by_instance)} / {_either(queries, by_instance)}", "{{instance}}")],
        ),
        timeseries(
            "Finish reasons",
            f"{finished} by finished_reason (stop, length, abort...).",
            "reqps",
            [
                target(
                    sum_by(["instance", "finished_reason"], rate(sel(finished, VLLM_RAW))),
                    "{{finished_reason}} {{instance}}",
                )
            ],
            stack=True,
        ),
        timeseries(
            "Tokens/s",
            "Prompt and generated tokens per second.",
            TOKENS_PER_S,
            [
                target(sum_by(by_instance, rate(sel(names[series.PROMPT_TOKENS][0], VLLM_RAW))), "prompt {{instance}}"),
                target(
                    sum_by(by_instance, rate(sel(names[series.GENERATED_TOKENS][0], VLLM_RAW))),
                    "generated {{instance}}",
                ),
            ],
        ),
        row("Where a request's time goes"),
        timeseries(
            "Queue / prefill / decode time (mean)",
            "Mean seconds per request in each phase over the window.",
            "s",
            [target(mean(metric, VLLM_RAW, by_instance), f"{name} {{{{instance}}}}") for name, metric in phases],
            width=12,
        ),
        timeseries(
            "Queue / prefill / decode time (p95)",
            "95th percentile per phase.",
            "s",
            [
                target(quantile(0.95, [sel(f"{metric}_bucket", VLLM_RAW)], by_instance), f"{name} {{{{instance}}}}")
                for name, metric in phases
            ],
            width=12,
        ),
        timeseries(
            "TTFT",
            f"{ttft[0]}.",
            "s",
            _latency_targets(ttft[0], VLLM_RAW, by_instance, "{{instance}}"),
        ),
        timeseries(
            "ITL",
            f"{itl[0]} ({itl[1].split(':', 1)[1].removesuffix('_seconds')} before 0.11).",
            "s",
            _quantile_targets(_raw_buckets(kind, "itl"), by_instance, "{{instance}}"),
        ),
        timeseries(
            "End-to-end latency",
            f"{e2e[0]}.",
            "s",
            _latency_targets(e2e[0], VLLM_RAW, by_instance, "{{instance}}"),
        ),
    ]
    return dashboard(
        "servescope-vllm",
        "servescope · vLLM",
        "vLLM-CPU internals: KV capacity arithmetic, scheduler pressure, preemptions, prefix cache, "
        "and where each request's time goes.",
        engine_variables(kind.name),
        panels,
    )


def ollama_dashboard() -> dict:
    ollama = {"engine": f"={engines.OLLAMA.name}", "instance": "=~$instance"}
    ollama_model = {**ollama, "model": "=~$model"}
    ollama_proxy = {**ollama_model, series.SOURCE: f"={series.PROXY_SOURCE}"}
    panels = [
        row("Models"),
        stat(
            "Loaded models",
            "Models in memory now (GET /api/ps).",
            "none",
            [target(f"count by (instance) ({sel(series.OLLAMA_MODEL_SIZE, ollama_model)})", "{{instance}}")],
            width=6,
        ),
        stat(
            "Installed models",
            "Models on disk (GET /api/tags).",
            "none",
            [target(f"count by (instance) ({sel(series.OLLAMA_MODEL_INFO, ollama)})", "{{instance}}")],
            width=6,
        ),
        stat(
            "Ollama up",
            "1 when the exporter read /api/ps and /api/tags.",
            "none",
            [target(sel(series.ENGINE_UP, ollama), "{{instance}}")],
            width=6,
            mappings=UP_MAPPINGS,
            thresholds=UP_THRESHOLDS,
        ),
        stat(
            "OLLAMA_NUM_PARALLEL (configured)",
            "Requests per loaded model Ollama is said to run at once, as given to the exporter: configured, not "
            "observed (Ollama reports no such value).",
            "none",
            [target(sel(series.PROXY_NUM_PARALLEL, ollama), "{{instance}}")],
            width=6,
        ),
        timeseries(
            "Memory and VRAM size",
            "size and size_vram of each loaded model (GET /api/ps).",
            "bytes",
            [
                target(sel(series.OLLAMA_MODEL_SIZE, ollama_model), "size {{model}}"),
                target(sel(series.OLLAMA_MODEL_VRAM, ollama_model), "vram {{model}}"),
            ],
        ),
        timeseries(
            "Time until unload",
            "expires_at - now per loaded model: after it Ollama unloads the model "
            "and the next request pays a cold load.",
            "s",
            [target(sel(series.OLLAMA_MODEL_EXPIRES, ollama_model), "{{model}}")],
        ),
        timeseries(
            "Context length",
            "context_length of each loaded model.",
            "suffix: tokens",
            [target(sel(series.OLLAMA_MODEL_CONTEXT, ollama_model), "{{model}}")],
        ),
        row("Concurrency: what the exporter's proxy observed of the requests it relayed (none sent around it)"),
        timeseries(
            "Streaming and awaiting a first chunk (proxy)",
            "Relayed requests whose answer is streaming (servescope_requests_running, source=proxy) and those "
            "without a byte of it yet (servescope_requests_waiting: queued for a slot, loading the model or "
            "evaluating the prompt; the proxy cannot tell which). No data: nothing went through the proxy. "
            "Streaming flat at the configured OLLAMA_NUM_PARALLEL while others await theirs: the slots are full.",
            "short",
            [
                target(sum_by(["instance"], sel(series.REQUESTS_RUNNING, ollama_proxy)), "streaming {{instance}}"),
                target(
                    sum_by(["instance"], sel(series.REQUESTS_WAITING, ollama_proxy)),
                    "awaiting first chunk {{instance}}",
                ),
                target(sel(series.PROXY_NUM_PARALLEL, ollama), "OLLAMA_NUM_PARALLEL (configured) {{instance}}"),
            ],
            width=8,
        ),
        timeseries(
            "Queue inside Ollama (its own durations)",
            "Mean per request of total_duration - load_duration - prompt_eval_duration - eval_duration from Ollama's "
            "final object (servescope_proxy_queue_seconds, /api/chat and /api/generate): the time Ollama held it "
            "outside the model, waiting for one of its OLLAMA_NUM_PARALLEL slots. 50 ms or more for 2 minutes "
            "fires OllamaRequestsQueued.",
            "s",
            [target(mean(series.PROXY_QUEUE_SECONDS, ollama, ["instance"]), "{{instance}}")],
            width=8,
        ),
        timeseries(
            "Requests/s through the proxy",
            "servescope_proxy_requests_total by outcome.",
            "reqps",
            [
                target(
                    sum_by(["instance", "outcome"], rate(sel(series.PROXY_REQUESTS, ollama))),
                    "{{outcome}} {{instance}}",
                )
            ],
            width=8,
        ),
        row("Speed (from each response's final object: eval_count / eval_duration, load_duration)"),
        timeseries(
            "Generation tokens/s",
            "Per-request eval_count / eval_duration (p50, p95), and the sum of output tokens per second.",
            TOKENS_PER_S,
            [
                *_latency_targets(series.PROXY_GEN_TOKENS_PER_SECOND, ollama, ["instance"], "per request {{instance}}"),
                target(sum_by(["instance"], rate(sel(series.GENERATED_TOKENS, ollama_model))), "total {{instance}}"),
            ],
        ),
        timeseries(
            "Load (cold-start) duration",
            "load_duration of responses: large when the model was not "
            "loaded (first request, or after keep-alive expired).",
            "s",
            _latency_targets(series.PROXY_LOAD_SECONDS, ollama, ["instance"], "{{instance}}"),
        ),
        timeseries(
            "First chunk and prompt eval",
            "Proxy-observed time to the first chunk, and prompt_eval_duration.",
            "s",
            [
                *_latency_targets(series.PROXY_FIRST_CHUNK_SECONDS, ollama, ["instance"], "first chunk"),
                *_latency_targets(series.PROXY_PROMPT_EVAL_SECONDS, ollama, ["instance"], "prompt eval"),
            ],
        ),
    ]
    return dashboard(
        "servescope-ollama",
        "servescope · Ollama",
        "Ollama through the exporter: loaded models and their memory, time until unload, "
        "generation speed, cold loads, what the proxy observed in flight and Ollama's own queue time.",
        engine_variables(engines.OLLAMA.name),
        panels,
    )


def load_test_dashboard() -> dict:
    by = ["engine", "scenario"]
    variables = [
        datasource_variable(),
        query_variable("engine", "Engine", f"label_values({series.CLIENT_REQUESTS}, engine)"),
        query_variable(
            "scenario", "Scenario", f'label_values({series.CLIENT_REQUESTS}{{engine=~"$engine"}}, scenario)'
        ),
    ]
    panels = [
        row("Load (the load generator's own view; phases are annotations)"),
        timeseries(
            "Users",
            "Locust users running.",
            "short",
            [target(sum_by(["engine"], sel(series.CLIENT_USERS, CLIENT)), "{{engine}}")],
        ),
        timeseries(
            "Requests/s",
            "Successful requests per second by engine and scenario.",
            "reqps",
            [target(sum_by(by, rate(_client_requests_ok(CLIENT_SCENARIO))), "{{engine}} {{scenario}}")],
        ),
        timeseries(
            "Failures/s",
            "Failed requests per second by engine, scenario and reason (0 when none).",
            "reqps",
            [target(_client_failures([*by, "outcome"], CLIENT_SCENARIO), "{{engine}} {{scenario}} {{outcome}}")],
        ),
        row("Latency by scenario"),
        timeseries(
            "TTFT (client)",
            "Send -> first chunk with content.",
            "s",
            _latency_targets(series.CLIENT_TTFT, CLIENT_SCENARIO, by, "{{engine}} {{scenario}}"),
        ),
        timeseries(
            "ITL (client)",
            "Every gap between consecutive content chunks, pooled.",
            "s",
            _latency_targets(series.CLIENT_ITL, CLIENT_SCENARIO, by, "{{engine}} {{scenario}}"),
        ),
        timeseries(
            "End-to-end (client)",
            "Send -> last content chunk.",
            "s",
            _latency_targets(series.CLIENT_E2E, CLIENT_SCENARIO, by, "{{engine}} {{scenario}}"),
        ),
        timeseries(
            "Output tokens/s (client)",
            "Output tokens per second as counted from usage / eval_count.",
            TOKENS_PER_S,
            [target(sum_by(by, rate(sel(series.CLIENT_OUTPUT_TOKENS, CLIENT_SCENARIO))), "{{engine}} {{scenario}}")],
            width=24,
        ),
    ]
    return dashboard(
        "servescope-loadtest",
        "servescope · load test",
        "Locust users, requests and failures, client TTFT/ITL/E2E by scenario, with load phases "
        "(sequential, burst k, ramp step) marked as annotations.",
        variables,
        panels,
    )


# How many instances the fleet dashboard's top-N panels name.
TOP_N = 10
FLEET = {"engine": "=~$engine", "model": "=~$model"}


def fleet_dashboard() -> dict:
    """Many replicas at once, from the neutral series alone: the same panels whether the exporter or Prometheus' fleet
    rules (METRICS_MODE, docs/fleet.md) make them."""
    by_engine = ["engine"]
    running, waiting = sel(series.REQUESTS_RUNNING, FLEET), sel(series.REQUESTS_WAITING, FLEET)
    kv = sel(series.KV_CACHE_USAGE, FLEET)
    queueing = or_zero(f"count by (engine) ({waiting} > 0)", f"count by (engine) ({waiting})", by_engine)
    variables = [
        datasource_variable(),
        query_variable("engine", "Engine", f"label_values({series.REQUESTS_RUNNING}, engine)"),
        query_variable("model", "Model", f'label_values({series.REQUESTS_RUNNING}{{engine=~"$engine"}}, model)'),
    ]
    panels = [
        row("Fleet totals (every instance of the engine kind)"),
        stat(
            "Instances reporting",
            f"Instances with a {series.REQUESTS_RUNNING} series now, per engine kind.",
            "none",
            [target(f"count by (engine) ({running})", "{{engine}}")],
        ),
        stat(
            "Running, all instances",
            "Requests in the running batches of every instance, summed.",
            "short",
            [target(sum_by(by_engine, running), "{{engine}}")],
        ),
        stat(
            "Waiting, all instances",
            "Requests queued on every instance, summed. A fleet queue with instances idle is the router's.",
            "short",
            [target(sum_by(by_engine, waiting), "{{engine}}")],
        ),
        stat(
            "Instances with a queue",
            "Instances with at least one request waiting now (0 when none).",
            "none",
            [target(queueing, "{{engine}}")],
        ),
        stat(
            "KV usage, fleet mean",
            "The mean over instances of the fraction of each KV pool in use (Ollama reports none).",
            "percentunit",
            [target(f"avg by (engine) ({kv})", "{{engine}}")],
        ),
        stat(
            "Output tokens/s, fleet",
            "Generated tokens per second of every instance, summed.",
            TOKENS_PER_S,
            [target(sum_by(by_engine, rate(sel(series.GENERATED_TOKENS, FLEET))), "{{engine}}")],
        ),
        timeseries(
            "Running and waiting, fleet totals",
            "Summed over the instances of each engine kind: batch occupancy beside the queue.",
            "short",
            [
                target(sum_by(by_engine, running), "{{engine}} running"),
                target(sum_by(by_engine, waiting), "{{engine}} waiting"),
            ],
            width=12,
        ),
        timeseries(
            "KV usage spread across instances",
            "Max, 90th percentile, median and min over the instances at each instant: a wide spread is uneven routing.",
            "percentunit",
            [
                target(f"max by (engine) ({kv})", "{{engine}} max"),
                target(f"quantile by (engine) (0.9, {kv})", "{{engine}} p90"),
                target(f"quantile by (engine) (0.5, {kv})", "{{engine}} median"),
                target(f"min by (engine) ({kv})", "{{engine}} min"),
            ],
            width=12,
        ),
        row("Per instance, at fleet scale"),
        heatmap(
            "KV usage per instance (heat map)",
            "How many instances sit at each KV usage, over time: one column per instant, darker = more instances.",
            "percentunit",
            [target(kv, "{{instance}}")],
        ),
        heatmap(
            "Waiting per instance (heat map)",
            "How many instances have each queue length, over time: a band off zero is a fleet short of slots.",
            "short",
            [target(waiting, "{{instance}}")],
        ),
        timeseries(
            f"Top {TOP_N} instances by waiting",
            f"The {TOP_N} instances with the longest queue at each instant.",
            "short",
            [target(f"topk({TOP_N}, {sum_by(['engine', 'instance'], waiting)})", "{{engine}} {{instance}}")],
            width=12,
        ),
        timeseries(
            "Lever alerts firing, per instance",
            'The "which lever" alerts (prometheus/rules/*_levers.yml, llamacpp.yml, sglang.yml) firing on each '
            "instance; the line at 0 when none fires.",
            "none",
            [
                target(
                    'sum by (alertname, instance) (ALERTS{alertstate="firing",lever=~".+",engine=~"$engine"}) '
                    "or on () vector(0)",
                    "{{alertname}} {{instance}}",
                )
            ],
            width=12,
        ),
    ]
    return dashboard(
        "servescope-fleet",
        "servescope · fleet",
        "Many replicas at once: fleet totals, the spread across instances, heat maps, the top instances by queue and "
        "the lever alerts, from the engine-neutral series (the same in exporter and fleet mode).",
        variables,
        panels,
    )


DASHBOARDS = {
    "engine-comparison": engine_comparison,
    engines.VLLM.name: vllm_dashboard,
    engines.OLLAMA.name: ollama_dashboard,
    "load-test": load_test_dashboard,
    "fleet": fleet_dashboard,
}


def build_all() -> dict[str, dict]:
    return {name: make() for name, make in DASHBOARDS.items()}


# ---------------------------------------------------------------------------------------------
# Provisioning
# ---------------------------------------------------------------------------------------------


def datasource_provisioning(prometheus_url: str = f"http://prometheus:{COMPOSE_PORTS['prometheus']}") -> dict:
    return {
        "apiVersion": 1,
        "datasources": [
            {
                "name": DATASOURCE_NAME,
                "uid": DATASOURCE_UID,
                "type": "prometheus",
                "access": "proxy",
                "url": prometheus_url,
                "isDefault": True,
                "editable": False,
                "jsonData": {"timeInterval": SCRAPE_INTERVAL, "httpMethod": "POST"},
            }
        ],
    }


def dashboard_provisioning() -> dict:
    return {
        "apiVersion": 1,
        "providers": [
            {
                "name": "servescope",
                "folder": "servescope",
                "type": "file",
                "disableDeletion": True,
                "allowUiUpdates": False,
                "updateIntervalSeconds": 30,
                "options": {"path": GRAFANA_DASHBOARDS_PATH, "foldersFromFilesStructure": False},
            }
        ],
    }


def rendered_files() -> dict[Path, str]:
    """Every generated file and its exact content."""
    header = "# GENERATED by `python -m dashboards.build`: edit dashboards/build.py, not this file.\n"
    files = {
        JSON_DIR / f"{name}.json": json.dumps(board, indent=2, sort_keys=False) + "\n"
        for name, board in build_all().items()
    }
    files[DATASOURCE_FILE] = header + yaml.safe_dump(datasource_provisioning(), sort_keys=False)
    files[PROVIDER_FILE] = header + yaml.safe_dump(dashboard_provisioning(), sort_keys=False)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=command_name.prog("python -m dashboards.build"), description=__doc__.splitlines()[0]
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a committed file differs from the generator")
    args = parser.parse_args(argv)
    files = rendered_files()
    root = HERE.parent
    if args.check:
        stale = [path for path, text in files.items() if not path.exists() or path.read_text() != text]
        expected = {p.name for p in files if p.parent == JSON_DIR}
        extra = sorted(p for p in JSON_DIR.glob("*.json") if p.name not in expected) if JSON_DIR.is_dir() else []
        for path in stale:
            print(f"stale: {path.relative_to(root)}", file=sys.stderr)
        for path in extra:
            print(f"not generated (remove it): {path.relative_to(root)}", file=sys.stderr)
        if stale or extra:
            print("dashboards are stale: run `make dashboards`", file=sys.stderr)
            return 1
        print(f"dashboards up to date ({len(files)} files)")
        return 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
