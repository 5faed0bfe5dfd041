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
import functools
import json
import sys
from collections.abc import Iterable
from pathlib import Path

import yaml

from servescope import engines
from servescope.contracts import series
from servescope.engines import panels as ui
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
# an engine's own series carry instance (set by the scrape config) and the model under its page's label; client
# series carry engine/scenario.
NEUTRAL = {"engine": "=~$engine", "instance": "=~$instance", "model": "=~$model"}
ENGINE_ONLY = {"engine": "=~$engine", "instance": "=~$instance"}


def raw(kind: EngineKind) -> dict[str, str]:
    """An engine's own series: `instance` from the scrape config, the model under the label its page uses."""
    label = kind.metrics.model_label
    return {"instance": "=~$instance", **({label: "=~$model"} if label else {})}


def of_engine(kind: EngineKind, of: str) -> dict[str, str]:
    """The matchers of a query on one engine's dashboard (servescope/engines/panels.py names the families)."""
    if of == ui.RAW:
        return raw(kind)
    engine = {"engine": f"={kind.name}", "instance": "=~$instance"}
    if of == ui.ENGINE:
        return engine
    model = {**engine, "model": "=~$model"}
    return {**model, series.SOURCE: f"={series.PROXY_SOURCE}"} if of == ui.PROXY else model


CLIENT = {"engine": "=~$engine"}
CLIENT_SCENARIO = {"engine": "=~$engine", "scenario": "=~$scenario"}


def sel(metric: str, matchers: dict[str, str] | None = None, **extra: str) -> str:
    """metric{label=~"$var",...}: matchers map label -> operator+value ("=~$engine", "=proxy", "!=ok")."""
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
    """histogram_quantile over one or more bucket selectors joined with `or` (an engine's renamed histograms)."""
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
TOKENS_PER_S = ui.TOKENS_PER_S


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
    # allValue ".*" so "All" also matches series without the label (an engine whose page names no model).
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
    """'<engine> time_to_first_token histogram' for each engine: the short names of its histograms, as the panels say."""
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


def _words(field: str) -> list[str]:
    """What each adapter gives the comparison dashboard to say of its engine (servescope/engines/panels.Dashboard), in
    the registry's order."""
    return [said for kind in engines.ENGINES.values() if (said := getattr(kind.dashboard, field))]


def _proxied() -> list[EngineKind]:
    """The engines whose requests the exporter's proxy relays: what it observed is all there is of their queue."""
    return [kind for kind in engines.ENGINES.values() if kind.proxy_port_env]


def _listed(names: list[str]) -> str:
    """'a, b and c'."""
    return f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else "".join(names)


def _lacking(series_name: str, one: str, many: str) -> str:
    """'<engines> <verb> ...' for the engines that report no value of a neutral series; "" when every engine does."""
    lacking = [kind.said for kind in engines.ENGINES.values() if kind.where(series_name) is None]
    return f"{' and '.join(lacking)} {one if len(lacking) == 1 else many}" if lacking else ""


def _running_said() -> str:
    """What the running requests are on each engine: those its own page counts listed together, then those the
    exporter's proxy observed; then what a flat line means."""
    own = [k.dashboard.running for k in engines.ENGINES.values() if k.dashboard.running and not k.proxy_port_env]
    observed = [k.dashboard.running for k in _proxied() if k.dashboard.running]
    listed = "; ".join(x for x in (", ".join(own), *observed) if x)
    return " ".join([f"Sequences in the running batch ({listed}).", *_words("running_note")])


def _kv_said() -> str:
    none = _lacking(series.KV_CACHE_USAGE, "exposes none.", "expose none.")
    head = "Fraction of the paged KV pool in use. Near 100% under load is healthy; near 0% under real traffic means the budget is oversized."
    return " ".join(x for x in (head, none) if x)


def _reuse_said() -> str:
    none = _lacking(
        series.PROMPT_CACHED_TOKENS, "reports no cached tokens (no line)", "report no cached tokens (no line)"
    )
    return (
        "Share of prompt tokens the engine took from its prefix / prompt cache: rate of "
        f"{series.PROMPT_CACHED_TOKENS} / rate of {series.PROMPT_TOKENS} ({'; '.join(_words('cached'))}). "
        f"Near 0 with caching off{f'; {none}' if none else ''}."
    )


def _through_proxy(how: str) -> str:
    """'; <engine><how>' for each engine the exporter's proxy relays."""
    return "".join(f"; {kind.said}{how}" for kind in _proxied())


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
            _running_said(),
            "short",
            [target(sel(series.REQUESTS_RUNNING, NEUTRAL), "{{instance}}")],
        ),
        timeseries(
            "Waiting requests",
            " ".join(["Queued, not yet scheduled.", *_words("waiting")]),
            "short",
            [target(sel(series.REQUESTS_WAITING, NEUTRAL), "{{instance}}")],
        ),
        timeseries(
            "KV cache usage",
            _kv_said(),
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
            _reuse_said(),
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
        row("Latency: server view (engine histograms" + _through_proxy(" via the exporter's proxy") + ")"),
        timeseries(
            "TTFT (server)",
            f"{_named(_with_latency('ttft'), 'ttft', 'histogram')}{_through_proxy(': first chunk through the proxy')}. "
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
        f"{_listed(_words('named'))} side by side: the reference page's section-4 gauges, throughput, "
        "TTFT/ITL from the server and the client, resource use against limits.",
        engine_variables(),
        panels,
    )


def _exprs(kind: EngineKind, q: ui.Query) -> list[tuple[str, str]]:
    """One query of an engine's own dashboard in PromQL, with its legend (two for QUANTILES)."""
    matchers, by = of_engine(kind, q.of), list(q.by)
    sels = [sel(name, matchers) for name in q.names]
    if q.how == ui.QUANTILES:
        buckets = [sel(f"{name}_bucket", matchers) for name in q.names]
        return [(quantile(p, buckets, by), f"{q.legend} p{int(p * 100)}") for p in (0.5, 0.95)]
    if q.how == ui.P95:
        return [(quantile(0.95, [sel(f"{name}_bucket", matchers) for name in q.names], by), q.legend)]
    if q.how in (ui.RATE, ui.RATIO):
        expr = sum_by(by, " or ".join(rate(s) for s in sels))
        if q.how == ui.RATIO:
            expr += " / " + sum_by(by, " or ".join(rate(sel(name, matchers)) for name in q.per))
        return [(expr, q.legend)]
    if q.how == ui.MEAN:
        (name,) = q.names
        return [(mean(name, matchers, by), q.legend)]
    either = " or ".join(sels)
    exprs = {
        ui.GAUGE: either,
        ui.SUM: sum_by(by, either),
        ui.MAX: f"max by ({', '.join(by)}) ({either})",
        ui.COUNT: f"count by ({', '.join(by)}) ({either})",
    }
    return [(exprs[q.how], q.legend)]


def _panel_of(kind: EngineKind, panel: ui.Panel) -> dict:
    if panel.kind == ui.ROW:
        return row(panel.title)
    targets = [target(expr, legend) for q in panel.queries for expr, legend in _exprs(kind, q)]
    size = {key: value for key, value in (("width", panel.width), ("height", panel.height)) if value}
    if panel.kind == ui.STAT:
        up = {"mappings": UP_MAPPINGS, "thresholds": UP_THRESHOLDS} if panel.up else {}
        return stat(panel.title, panel.description, panel.unit, targets, **size, **up)
    return timeseries(panel.title, panel.description, panel.unit, targets, **size, stack=panel.stack)


def engine_dashboard(kind: EngineKind) -> dict:
    """An engine's own dashboard, as its adapter draws it (servescope/engines/<name>.py: `dashboard`)."""
    return dashboard(
        f"servescope-{kind.name}",
        f"servescope · {kind.said}",
        kind.dashboard.about,
        engine_variables(kind.name),
        [_panel_of(kind, panel) for panel in kind.dashboard.panels],
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


def _fleet_rule_files() -> str:
    """The "which lever" rule files of the engines a fleet is read from (those with a page: fleet mode's recording
    rules make the neutral series from pages), the *_levers.yml ones by their pattern."""
    files = [k.alerts.file for k in engines.ENGINES.values() if k.metrics is not None and k.alerts is not None]
    named = ["*_levers.yml" if f.endswith("_levers.yml") else f for f in files]
    return ", ".join(dict.fromkeys(named))


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
            "The mean over instances of the fraction of each KV pool in use"
            + (f" ({none})." if (none := _lacking(series.KV_CACHE_USAGE, "reports none", "report none")) else "."),
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
            f'The "which lever" alerts (prometheus/rules/{_fleet_rule_files()}) firing on each '
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
    # One for each engine whose adapter draws one.
    **{
        name: functools.partial(engine_dashboard, kind)
        for name, kind in engines.ENGINES.items()
        if kind.dashboard.panels
    },
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
