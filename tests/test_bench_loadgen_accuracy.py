"""The load generator benchmarks' own arithmetic: vLLM bench's stamps under our definitions, the client's traffic window."""

from __future__ import annotations

import sys

import pytest

from bench.loadgen_accuracy import content_aligned, loadgen_burst, run_measured
from tests.doubles.synthetic_openai import SyntheticProcess


def test_vllm_bench_stamps_are_read_under_our_definitions():
    # vLLM bench: TTFT at the empty role chunk, a gap to the first content chunk, the content gaps, a gap to the finish chunk.
    result = {
        "ttfts": [0.001, 0.002, 0.0],
        "output_lens": [3, 3, 0],
        "itls": [[0.2, 0.02, 0.021, 0.0001], [0.199, 0.019, 0.02, 0.0002], []],
    }
    ttfts, itls = content_aligned(result)
    assert ttfts == pytest.approx([0.201, 0.201])
    assert itls == pytest.approx([0.02, 0.021, 0.019, 0.02])
    assert content_aligned({"ttfts": [0.001], "output_lens": [3], "itls": [[0.2, 0.02]]}) == (
        [],
        [],
    )  # other shape: left out


def test_capacity_window_counts_what_the_server_streamed_to_the_client_and_the_clients_cpu():
    client = (
        "import sys, requests\n"
        "for i in range(3):\n"
        "    r = requests.post(sys.argv[1] + '/v1/chat/completions', json={'model': 'm', 'stream': True, 'max_tokens': 500,"
        " 'messages': [{'role': 'user', 'content': 'x'}]})\n"
        "    assert b'[DONE]' in r.content\n"
        "print('client done')\n"
    )
    with SyntheticProcess("--ttft", "0", "--itl", "0", "--tokens", "500") as server:
        proc, window = run_measured([sys.executable, "-c", client, server.url], server, timeout=60)
        counters = server.counters()
    assert proc.returncode == 0 and "client done" in proc.stdout
    assert counters == {"requests": 3, "streams_completed": 3, "tokens_sent": 1500}
    # The window starts before the first request (all three streams in it) and ends at the last one.
    assert window.tokens == 1500
    assert window.cpu_s > 0 and window.wall_s > 0


@pytest.mark.parametrize("client", ["geventhttpclient", "requests"])
def test_each_client_runs_a_burst_through_the_load_generators_cli(client):
    # requests is not the load generator's: bench/requests_transport.py registers it for this run only.
    with SyntheticProcess("--ttft", "0.01", "--itl", "0.001", "--tokens", "4") as server:
        records, phases, _window = loadgen_burst(server, size=2, bursts=1, max_tokens=4, http_client=client)
    assert len(records) == 2 and all(r["ok"] and r["output_tokens"] == 4 for r in records)
    assert [p["phase"] for p in phases["phases"]] == ["burst-1"]
