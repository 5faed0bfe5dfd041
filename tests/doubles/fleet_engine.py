"""Stands in for a fleet of vLLM instances: one port, N paths /i/<n>/ serving the recorded vLLM 0.32 page, values moving.

Each instance answers GET /i/<n>/metrics with tests/fixtures/vllm-0.32.0-cpu-metrics-burst.txt, its queue, batch, KV
usage and token counters changed on every scrape (counters only grow), and /i/<n>/v1/models and /i/<n>/version as
vLLM does, so the exporter can read it too. bench/fleet_scale.py scrapes 1,000 of them.

python -m tests.doubles.fleet_engine --port 8700 --instances 1000
"""

from __future__ import annotations

import argparse
import json
import re

from aiohttp import web

from tests.doubles.recorded_engine import fixture

PAGE = "vllm-0.32.0-cpu-metrics-burst.txt"
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
# The samples whose values move: sample name -> how the value of instance i at its n-th scrape is made.
MOVING = {
    "vllm:num_requests_running": lambda i, n: float((i + n) % 9),
    "vllm:num_requests_waiting": lambda i, n: float((i * 7 + n) % 6),
    "vllm:kv_cache_usage_perc": lambda i, n: ((i + 3 * n) % 100) / 100,
    "vllm:generation_tokens_total": lambda i, n: float(69 + 48 * n + i),
    "vllm:prompt_tokens_total": lambda i, n: float(338 + 120 * n + i),
    "vllm:prefix_cache_hits_total": lambda i, n: float(16 * n),
}


def template(page: str) -> tuple[str, list[str]]:
    """The page with each moving sample's value a %-format slot (in page order), and the names in that order."""
    text = page.replace("%", "%%")
    order: list[str] = []

    def slot(match: re.Match) -> str:
        order.append(match.group(1))
        return f"{match.group(1)}{match.group(2)} %s"

    names = "|".join(re.escape(name) for name in MOVING)
    text = re.sub(rf"^({names})(\{{[^}}]*\}}) \S+$", slot, text, flags=re.MULTILINE)
    return text, order


def app(instances: int) -> web.Application:
    page, order = template(fixture(PAGE))
    scrapes = [0] * instances
    models = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 1024}]})

    def instance(request: web.Request) -> int:
        number = int(request.match_info["n"])
        if not 0 <= number < instances:
            raise web.HTTPNotFound()
        return number

    async def metrics(request: web.Request) -> web.Response:
        i = instance(request)
        scrapes[i] += 1
        values = tuple(repr(MOVING[name](i, scrapes[i])) for name in order)
        return web.Response(text=page % values, content_type="text/plain", charset="utf-8")

    async def v1_models(request: web.Request) -> web.Response:
        instance(request)
        return web.Response(text=models, content_type="application/json")

    async def version(request: web.Request) -> web.Response:
        instance(request)
        return web.json_response({"version": "0.32.0"})

    application = web.Application()
    application.router.add_get(r"/i/{n:\d+}/metrics", metrics)
    application.router.add_get(r"/i/{n:\d+}/v1/models", v1_models)
    application.router.add_get(r"/i/{n:\d+}/version", version)
    return application


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.doubles.fleet_engine", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--instances", type=int, default=1000)
    args = parser.parse_args(argv)
    web.run_app(app(args.instances), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
