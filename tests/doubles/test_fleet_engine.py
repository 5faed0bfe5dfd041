"""The fleet benchmark's double (tests/doubles/fleet_engine.py): the real vLLM page, its values moving per scrape."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from tests.doubles import fleet_engine
from tests.doubles.recorded_engine import fixture


def values(text: str) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in fleet_engine.MOVING
    }


async def two_scrapes(path: str) -> tuple[int, list[str]]:
    async with TestClient(TestServer(fleet_engine.app(3))) as client:
        pages = []
        for _ in range(2):
            response = await client.get(path)
            if response.status != 200:
                return response.status, pages
            pages.append(await response.text())
        return 200, pages


def test_every_moving_sample_has_a_slot_and_the_rest_of_the_page_is_the_recording():
    page, order = fleet_engine.template(fixture(fleet_engine.PAGE))
    assert sorted(order) == sorted(fleet_engine.MOVING)  # each moving sample found once on the page
    filled = page % tuple("0.0" for _ in order)
    recorded = [line for line in fixture(fleet_engine.PAGE).splitlines() if not line.startswith(tuple(order))]
    assert recorded == [line for line in filled.splitlines() if not line.startswith(tuple(order))]


def test_gauges_move_and_counters_grow_between_scrapes():
    status, (first, second) = asyncio.run(two_scrapes("/i/2/metrics"))
    assert status == 200
    before, after = values(first), values(second)
    assert before["vllm:num_requests_running"] != after["vllm:num_requests_running"]
    for name in ("vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:prefix_cache_hits_total"):
        assert after[name] > before[name], name
    assert 0 <= after["vllm:kv_cache_usage_perc"] <= 1


def test_an_instance_past_the_fleet_is_not_found():
    status, _ = asyncio.run(two_scrapes("/i/3/metrics"))
    assert status == 404
