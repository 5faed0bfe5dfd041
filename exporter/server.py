"""The exporter process: builds the collectors from the config, serves / and /metrics, and runs the Ollama proxies."""

from __future__ import annotations

import asyncio
import errno
import html
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import choose_encoder

from exporter.collector import EngineCollector
from exporter.config import Config, Instance
from exporter.fanout import FanoutCollector
from exporter.llamacpp import LlamacppCollector
from exporter.observations import ProxyObservations
from exporter.ollama import OllamaCollector
from exporter.page import PageCollector
from exporter.proxy import OllamaProxy, ProxyMetrics
from exporter.resources import ResourceCollector
from exporter.upstream import Upstream
from exporter.vllm import VllmCollector
from servescope import engines
from servescope.contracts.urls import redact
from servescope.engines.base import OLLAMA_API, POOL_CACHE_CONFIG, POOL_SLOTS

# The collector that reads an engine's KV pool beyond its page's gauges (its adapter's metrics.pool), by how.
POOL_READERS: dict[str | None, type[PageCollector]] = {
    POOL_CACHE_CONFIG: VllmCollector,
    POOL_SLOTS: LlamacppCollector,
    None: PageCollector,
}

log = logging.getLogger("exporter")


class Collected:
    """The families of one collection, for prometheus_client's encoders (they only call collect())."""

    def __init__(self, families: list):
        self.families = families

    def collect(self) -> list:
        return self.families


class PortInUse(Exception):
    """A listener could not bind; str() is the one line shown to the user."""


@dataclass
class Exporter:
    """Everything one exporter process serves; built without touching the network."""

    config: Config
    registry: CollectorRegistry
    fanout: FanoutCollector
    resources: ResourceCollector
    proxies: list[tuple[Instance, OllamaProxy]] = field(default_factory=list)

    def close(self) -> None:
        self.fanout.close()
        self.resources.close()


def build(config: Config) -> Exporter:
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)  # the exporter's own CPU and memory, for the budget
    proxy_metrics = ProxyMetrics(registry)
    collectors: list[EngineCollector] = []
    proxies: list[tuple[Instance, OllamaProxy]] = []
    for instance in config.instances:
        upstream = Upstream(instance.url, api_key=instance.api_key)
        adapter = engines.kind(instance.kind)
        if adapter.metrics is not None:
            reader = POOL_READERS[adapter.metrics.pool]
            collectors.append(
                reader(instance.name, upstream, adapter=adapter, timeout=instance.timeout, fleet=config.fleet)
            )
        elif adapter.api == OLLAMA_API:
            # No page: the bridge reads Ollama's API on scrape, and its proxy (when configured) what it relays.
            observations = None
            if instance.proxy_port is not None:
                observations = ProxyObservations(instance.num_parallel)
                proxies.append((instance, OllamaProxy(instance.name, instance.url, observations, proxy_metrics)))
            collectors.append(
                OllamaCollector(instance.name, upstream, timeout=instance.timeout, observations=observations)
            )
        else:
            raise ValueError(f"{instance.kind}: no metrics page and no API servescope can bridge")
    fanout = FanoutCollector(collectors)
    registry.register(fanout)
    # The resource budget of watched processes/containers; describe() keeps registration offline.
    resources = ResourceCollector(config.processes, config.containers, timeout=config.timeout)
    registry.register(resources)
    for watched in config.processes:
        log.info("watching %s %s through pid file %s", watched.kind, watched.name, watched.pidfile)
    for watched in config.containers:
        log.info("watching %s %s in container %s", watched.kind, watched.name, watched.container)
    return Exporter(config=config, registry=registry, fanout=fanout, resources=resources, proxies=proxies)


def metrics_app(exporter: Exporter) -> web.Application:
    rows = (
        "".join(
            f"<li>{html.escape(i.kind)} <b>{html.escape(i.name)}</b>: {html.escape(redact(i.url))}"
            + (f" (proxy on port {i.proxy_port})" if i.proxy_port else "")
            + "</li>"
            for i in exporter.config.instances
        )
        or f"<li>none configured: set {', '.join(k.url_env for k in engines.ENGINES.values())} or --config FILE</li>"
    )
    rows += "".join(
        f"<li>resource budget of {html.escape(w.kind)} <b>{html.escape(w.name)}</b>: pid file {html.escape(str(w.pidfile))}</li>"
        for w in exporter.config.processes
    ) + "".join(
        f"<li>resource budget of {html.escape(w.kind)} <b>{html.escape(w.name)}</b>: container {html.escape(w.container)}</li>"
        for w in exporter.config.containers
    )
    landing = (
        "<!doctype html><html><head><title>servescope exporter</title></head><body>"
        '<h1>servescope exporter</h1><p><a href="/metrics">Metrics</a></p>'
        f"<p>Engines:</p><ul>{rows}</ul></body></html>"
    )

    async def index(_request: web.Request) -> web.Response:
        return web.Response(text=landing, content_type="text/html")

    # One collection at a time per question: scrapes that arrive while one runs (a second Prometheus,
    # a retry after a scrape timeout, another exposition format) share its families instead of queueing
    # engine reads behind it, so a slow engine never builds a backlog of scrapes and threads. (The
    # fan-out shares its engine reads between questions too: no engine collector runs twice at once.)
    running: dict[tuple[str, ...], asyncio.Future] = {}

    async def metrics(request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        # `?name[]=...` (prometheus_client's own filter) reads only the collectors that produce those
        # series: the run's sampler asks for the engine gauges 10x a second, not for the resource budget.
        names = tuple(sorted(set(request.query.getall("name[]", []))))
        loop = asyncio.get_running_loop()
        collection = running.get(names)
        if collection is None:
            registry = exporter.registry.restricted_registry(names) if names else exporter.registry
            # Collectors block on engine HTTP calls: keep them off the event loop the proxies share.
            collection = loop.run_in_executor(None, lambda: Collected(list(registry.collect())))
            running[names] = collection
            collection.add_done_callback(lambda _done: running.pop(names, None))
        collected = await asyncio.shield(collection)  # a scraper that gives up does not cancel it for the others
        body = await loop.run_in_executor(None, encoder, collected)
        return web.Response(body=body, headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/metrics", metrics)
    return app


async def run(
    exporter: Exporter, *, on_ready: Callable[[], None] | None = None, stop: asyncio.Event | None = None
) -> None:
    """Serve until `stop` is set (or SIGINT/SIGTERM); raises PortInUse with the knob that moves the port."""
    config = exporter.config
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):  # uvloop says ValueError off the main thread
            pass  # not the main thread (tests): the caller sets `stop`
    runner = web.AppRunner(metrics_app(exporter), access_log=None)
    await runner.setup()
    started_proxies: list[OllamaProxy] = []
    try:
        await _bind(
            web.TCPSite(runner, config.listen_address, config.port),
            config.listen_address,
            config.port,
            "EXPORTER_PORT or --port",
        )
        log.info("exporter listening on http://%s:%d/metrics", config.listen_address, config.port)
        for instance, proxy in exporter.proxies:
            try:
                await proxy.start(config.listen_address, instance.proxy_port)
            except OSError as exc:
                raise _port_error(
                    exc,
                    config.listen_address,
                    instance.proxy_port,
                    "OLLAMA_PROXY_PORT or --proxy-port (proxy_port in a config file)",
                ) from None
            started_proxies.append(proxy)
            log.info(
                "ollama proxy %s listening on http://%s:%d -> %s",
                instance.name,
                config.listen_address,
                instance.proxy_port,
                redact(instance.url),
            )
        if not config.instances:
            log.warning("no engines configured: set VLLM_URL, LLAMACPP_URL, OLLAMA_URL or use --config FILE")
        if on_ready:
            on_ready()
        await stop.wait()
    finally:
        for proxy in started_proxies:
            await proxy.stop()
        await runner.cleanup()
        exporter.close()


async def _bind(site: web.TCPSite, host: str, port: int, knob: str) -> None:
    try:
        await site.start()
    except OSError as exc:
        raise _port_error(exc, host, port, knob) from None


def _port_error(exc: OSError, host: str, port: int, knob: str) -> PortInUse:
    if exc.errno == errno.EADDRINUSE:
        return PortInUse(f"port {port} on {host} is already in use: set {knob} to another port")
    return PortInUse(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
