"""Workloads end to end on the doubles: `python -m loadgen` with each workload kind, the exporter and the run's samples, the report.

The synthetic engine keeps a prefix cache as vLLM (16-token blocks, vllm:prefix_cache_* counters)
and llama.cpp (token granularity, timings.cache_n) do, and its prefill takes `prefill_per_token` per
prompt token it computes: what the live checks look for on the real engines (reuse above 0.5 from
turn 2 with caching on, about 0 with it off, TTFT by turn) is checked here on the stand-in.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from servescope.contracts.runfolder import RunFolder
from servescope.report import cli as report_cli
from servescope.report import table
from tests.conftest import free_port
from tests.doubles.ollama_simulator import OllamaSimulator
from tests.doubles.synthetic_openai import SyntheticServer
from tests.harness import run_cli
from tests.paths import REPO
from tests.servescope.prometheus.test_sampler import EngineExporter

OPENER = " ".join(f"note{k}" for k in range(80))  # turn 1: 80 words, five 16-token blocks
CHATS = [
    {"id": f"chat{c}", "turns": [f"c{c} {OPENER}", "What matters most?", "Why is that?", "What next?"]}
    for c in range(2)
]


def loadgen(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_cli("loadgen", *args, env={**os.environ, **(env or {})}, timeout=timeout)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_with_samples(tmp_path: Path, engine_url: str, exporter_url: str, *args: str, kind: str = "vllm") -> Path:
    env = {"SAMPLE_EXPORTER_URL": exporter_url, "SAMPLE_INTERVAL_MS": "50"}
    common = ["--results", str(tmp_path), "--run-id", "run", "--metrics-port", "0", "--quiet", "--warmup", "1"]
    proc = loadgen(*args, "--engine", f"{kind}={engine_url}", *common, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp_path / "run"


def report_numbers(run_dir: Path) -> dict:
    assert report_cli.main(["--run", str(run_dir), "--prometheus", f"http://127.0.0.1:{free_port()}"]) == 0
    return json.loads((run_dir / "report.json").read_text())


def conversation_run(tmp_path: Path, *, cache: bool, **server) -> Path:
    tmp_path.mkdir()
    chats = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    with (
        SyntheticServer(ttft=0.01, itl=0.01, tokens=64, prefix_cache=cache, prefill_per_token=0.002, **server) as s,
        EngineExporter({"vllm": s.url}) as exporter,
    ):
        return run_with_samples(tmp_path, s.url, exporter.url, "sequential", "--prompts", f"conversation:{chats}")


def turns(numbers: dict) -> dict[int, dict]:
    return {t["turn"]: t for t in numbers["workloads"]["turns"] if t["scenario"] == "sequential"}


@pytest.mark.slow
def test_a_four_turn_conversation_reuses_its_history_with_caching_on_and_nothing_with_it_off(tmp_path):
    on_dir = conversation_run(tmp_path / "on", cache=True, prompt_tokens_details=True)
    off_dir = conversation_run(tmp_path / "off", cache=False)
    records = list(RunFolder(on_dir).requests())
    assert [(r.conversation, r.turn) for r in records] == [(f"chat{c}", k) for c in range(2) for k in (1, 2, 3, 4)]
    assert [r.history_messages for r in records[:4]] == [0, 2, 4, 6]
    # Each turn carried the engine's own answers: turn 2's prompt = turn 1's 81 words + the 48-token answer + 3.
    assert [r.prompt_tokens for r in records[:2]] == [81, 81 + 48 + 3]
    assert records[1].history_tokens == records[0].prompt_tokens + records[0].output_tokens
    assert records[1].cached_tokens == 128  # whole 16-token blocks of the 129 it had seen
    assert all(r.max_tokens == 48 and r.output_tokens == 48 for r in records)  # MAX_TOKENS, honoured (ignore_eos)

    on_turns, off_turns = turns(report_numbers(on_dir)), turns(report_numbers(off_dir))
    assert sorted(on_turns) == sorted(off_turns) == [1, 2, 3, 4]
    assert on_turns[1]["reuse_server"] == pytest.approx(0.0)  # nothing shared before the first turn
    for k in (2, 3, 4):
        assert on_turns[k]["reuse_server"] > 0.5 and on_turns[k]["reuse_per_request"] > 0.5
        assert off_turns[k]["reuse_server"] == 0.0
        assert off_turns[k]["reuse_per_request"] is None  # vLLM without --enable-prompt-tokens-details: not said
        # The history is computed again without the cache: the prefill (2 ms a token here) shows in TTFT.
        assert on_turns[k]["ttft"]["p50"] < off_turns[k]["ttft"]["p50"]
    assert off_turns[4]["ttft"]["p50"] > off_turns[1]["ttft"]["p50"]
    assert (on_dir / "turns.png").stat().st_size > 10_000
    report = (on_dir / "report.md").read_text()
    # Numbered by its place among the sections with something to say here (servescope/report/outline.py), not a fixed number.
    assert re.search(r"^## \d+\. Workloads", report, re.M) and "Conversations by turn" in report


def test_llamacpp_reports_cached_tokens_per_request(tmp_path):
    chats = write_jsonl(tmp_path / "chats.jsonl", CHATS[:1])
    with SyntheticServer(ttft=0.01, itl=0.002, tokens=64, timings=True, prefix_cache=True, prefix_block=1) as s:
        proc = loadgen(
            "sequential",
            "--engine",
            f"llamacpp={s.url}",
            "--prompts",
            f"conversation:{chats}",
            "--max-tokens",
            "8",
            "--results",
            str(tmp_path),
            "--run-id",
            "run",
            "--metrics-port",
            "0",
            "--quiet",
            env={"SAMPLE_INTERVAL_MS": "0"},
        )
    assert proc.returncode == 0, proc.stderr
    records = list(RunFolder(tmp_path / "run").requests())
    # llama.cpp: timings.cache_n and usage.prompt_tokens_details.cached_tokens; everything but the new message.
    assert [r.cached_tokens for r in records] == [0] + [r.history_tokens for r in records[1:]]
    assert all(r.engine_stats["timings"]["cache_n"] == r.cached_tokens for r in records)


def test_a_burst_plays_one_turn_per_round(tmp_path):
    chats = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    with SyntheticServer(ttft=0.01, itl=0.002, tokens=64) as s:
        proc = loadgen(
            "burst",
            "--engine",
            f"vllm={s.url}",
            "--prompts",
            f"conversation:{chats}",
            "--burst-size",
            "2",
            "--bursts",
            "3",
            "--burst-pause",
            "0",
            "--max-tokens",
            "4",
            "--results",
            str(tmp_path),
            "--run-id",
            "run",
            "--metrics-port",
            "0",
            "--quiet",
            env={"SAMPLE_INTERVAL_MS": "0"},
        )
    assert proc.returncode == 0, proc.stderr
    records = list(RunFolder(tmp_path / "run").requests())
    by_round = {
        p: sorted((r.conversation, r.turn) for r in records if r.phase == p) for p in ("burst-1", "burst-2", "burst-3")
    }
    assert by_round == {f"burst-{k}": [("chat0", k), ("chat1", k)] for k in (1, 2, 3)}


def test_shared_prefix_reuse_reaches_the_sets_ceiling(tmp_path):
    with (
        SyntheticServer(ttft=0.01, itl=0.002, tokens=64, prefix_cache=True, prefix_block=16) as s,
        EngineExporter({"vllm": s.url}) as exporter,
    ):
        run_dir = run_with_samples(tmp_path, s.url, exporter.url, "sequential", "--prompts", "shared-prefix:2,64,4,8")
    (phase,) = report_numbers(run_dir)["workloads"]["reuse"]
    # The 64-word prefixes are whole 16-token blocks: every request after each prefix's first reuses all of it.
    assert phase["ceiling"] == pytest.approx(3 / 4 * 64 / 72)
    assert phase["reuse_server"] == pytest.approx(phase["ceiling"], abs=1e-9)
    manifest = RunFolder(run_dir).manifest()
    assert manifest["prompt_sets"]["shared-prefix-2x64-4x8"]["kind"] == "shared-prefix"


def test_a_dataset_asks_for_each_prompts_own_output_length(tmp_path):
    rows = [{"prompt": f"question {k}", "output_tokens": n} for k, n in enumerate((3, 9, 5))]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    with SyntheticServer(ttft=0.01, itl=0.001, tokens=64) as s:
        proc = loadgen(
            "sequential",
            "--engine",
            f"vllm={s.url}",
            "--prompts",
            f"dataset:{data}",
            "--results",
            str(tmp_path),
            "--run-id",
            "run",
            "--metrics-port",
            "0",
            "--quiet",
            env={"SAMPLE_INTERVAL_MS": "0"},
        )
    assert proc.returncode == 0, proc.stderr
    records = list(RunFolder(tmp_path / "run").requests())
    assert [(r.max_tokens, r.output_tokens) for r in records] == [(3, 3), (9, 9), (5, 5)]


def test_replay_sends_at_the_traces_times_and_a_turn_after_its_previous_answer(tmp_path):
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        [
            {"offset_s": 0.0, "input_tokens": 8, "output_tokens": 20, "conversation_id": "c"},
            {"offset_s": 0.2, "input_tokens": 8, "output_tokens": 4},
            {"offset_s": 0.4, "input_tokens": 8, "output_tokens": 4, "conversation_id": "c"},
            {"offset_s": 1.0, "input_tokens": 8, "output_tokens": 4},
        ],
    )
    # The first answer takes about 0.5 s (20 tokens at 25 ms): the conversation's second turn, due at 0.4 s, waits.
    with SyntheticServer(ttft=0.01, itl=0.025, tokens=64) as s:
        proc = loadgen(
            "replay",
            "--engine",
            f"vllm={s.url}",
            "--prompts",
            f"trace:{trace}",
            "--speed",
            "2",
            "--results",
            str(tmp_path),
            "--run-id",
            "run",
            "--metrics-port",
            "0",
            "--quiet",
            env={"SAMPLE_INTERVAL_MS": "0"},
        )
    assert proc.returncode == 0, proc.stderr
    records = sorted(RunFolder(tmp_path / "run").requests(), key=lambda r: r.scheduled_at)
    assert [r.phase for r in records] == ["replay-2x"] * 4
    due = [r.scheduled_at - records[0].scheduled_at for r in records]
    assert due == pytest.approx([0.0, 0.1, 0.2, 0.5])  # the trace's offsets at twice the speed
    assert all(r.started_at >= r.scheduled_at - 0.001 for r in records)
    first, _, second, _ = records
    assert (first.conversation, first.turn, second.conversation, second.turn) == ("c", 1, "c", 2)
    assert second.started_at >= first.started_at + first.e2e_s  # it waited for the answer it carries
    assert second.history_messages == 2 and [r.max_tokens for r in records] == [20, 4, 4, 4]
    lag = report_numbers(tmp_path / "run")["workloads"]["replay_lag"]
    assert lag[0]["requests"] == 4 and lag[0]["late"] >= 1 and lag[0]["scheduled_span_s"] == pytest.approx(0.5)


def test_ollama_conversations_and_answers_that_end_before_max_tokens_are_flagged(tmp_path):
    chats = write_jsonl(tmp_path / "chats.jsonl", CHATS[:1])
    with OllamaSimulator(token_delay=0.001, eos_after=5) as sim:
        proc = loadgen(
            "sequential",
            "--engine",
            f"ollama={sim.url}",
            "--model",
            sim.models[0],
            "--prompts",
            f"conversation:{chats}",
            "--max-tokens",
            "8",
            "--results",
            str(tmp_path),
            "--run-id",
            "run",
            "--metrics-port",
            "0",
            "--quiet",
            env={"SAMPLE_INTERVAL_MS": "0"},
        )
    assert proc.returncode == 0, proc.stderr
    records = list(RunFolder(tmp_path / "run").requests())
    assert [r.turn for r in records] == [1, 2, 3, 4] and all(r.cached_tokens is None for r in records)
    # The simulator counts words + 4 a message: turn 2 = the opener, the 5-word answer, 3 words, three messages.
    assert [r.prompt_tokens for r in records[:2]] == [81 + 4, 81 + 5 + 3 + 3 * 4]
    work = report_numbers(tmp_path / "run")["workloads"]
    (length,) = work["output_lengths"]
    assert (length["asked"], length["produced"], length["short"], length["ignore_eos"]) == (32, 20, 4, "unavailable")
    assert "no ignore_eos" in length["note"]
    (note,) = [n for n in work["notes"] if "Ollama reports no cached-token count" in n]
    assert "it covered the whole history on every turn" in note  # the simulator counts the whole prompt, as 0.12 does


def write_text(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


@pytest.mark.parametrize(
    ("make", "command", "message"),
    [
        (lambda d: ["--prompts", "dataset:" + write_text(d, "d.json", '[{"prompt": "x"},')], "burst", "not valid JSON"),
        (lambda d: ["--prompts", "dataset:" + write_text(d, "d.jsonl", "")], "burst", "an empty dataset"),
        (
            lambda d: [
                "--prompts",
                "trace:" + write_text(d, "t.jsonl", '{"offset_s": -2, "input_tokens": 4, "output_tokens": 4}\n'),
            ],
            "replay",
            "negative offset -2",
        ),
        (
            lambda d: [
                "--prompts",
                "trace:"
                + write_text(
                    d,
                    "t.jsonl",
                    '{"offset_s": 3, "input_tokens": 4, "output_tokens": 4}\n'
                    '{"offset_s": 1, "input_tokens": 4, "output_tokens": 4}\n',
                ),
            ],
            "replay",
            "a trace is sorted by time",
        ),
        (
            lambda d: [
                "--prompts",
                "conversation:" + write_text(d, "c.jsonl", '{"messages": [{"role": "robot", "content": "x"}]}\n'),
            ],
            "sequential",
            "unknown role 'robot'",
        ),
        (lambda d: ["--prompts", "seed3"], "replay", "the replay scenario sends each request at a trace's own time"),
        (lambda d: ["--prompts", "conversation", "--bursts", "2"], "compare", "--bursts must be 1"),
        (lambda d: ["--prompts", "shared-prefix:1,2"], "burst", "expected shared-prefix:PREFIXES"),
        (lambda d: ["--prompts", "dataset:sharegpt-like,limit=3"], "burst", "expected FILE then comma-separated"),
        (
            lambda d: ["--prompts", "trace", "--speed", "0"],
            "replay",
            "argument --speed: expected a speed-up factor > 0",
        ),
    ],
)
def test_bad_workload_input_is_one_line_and_exit_2(tmp_path, make, command, message):
    results = tmp_path / "results"
    proc = loadgen(
        command, *make(tmp_path), "--engine", "vllm=http://127.0.0.1:9", "--results", str(results), timeout=30
    )
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-1000:]
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and not results.exists()


def locust_headless(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    """`locust -f loadgen/locustfile.py --headless`: the path the web UI's custom parameters take."""
    return run_cli(
        *["locust", "-f", str(REPO / "loadgen" / "locustfile.py"), "--headless", "--host", url],
        *["--engine", "vllm", "--results", str(tmp_path), "--metrics-port", "0", "--max-tokens", "4", *args],
        env={**os.environ, "SAMPLE_INTERVAL_MS": "0"},
        timeout=120,
    )


def test_locust_and_the_web_ui_take_the_workloads_too(tmp_path):
    trace = write_jsonl(
        tmp_path / "t.jsonl",
        [{"offset_s": 0.1 * k, "input_tokens": 6, "output_tokens": 3, "conversation_id": "c"} for k in range(3)],
    )
    chats = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    # Requests of about 0.14 s: a reading needs the repetitions' CI on one side of 1.5x, which 15-ms walls' jitter moves.
    with SyntheticServer(ttft=0.1, itl=0.01, tokens=64) as s:
        replay = locust_headless(
            tmp_path / "r", s.url, "--scenario", "replay", "--prompts", f"trace:{trace}", "--speed", "4"
        )
        chat = locust_headless(
            tmp_path / "c",
            s.url,
            "--scenario",
            "burst",
            "--users",
            "2",
            "--bursts",
            "2",
            "--prompts",
            f"conversation:{chats}",
        )
        refused = locust_headless(tmp_path / "x", s.url, "--scenario", "replay", "--prompts", "seed3")
    assert replay.returncode == 0, replay.stdout[-2000:] + replay.stderr[-2000:]
    (folder,) = (tmp_path / "r").iterdir()
    records = sorted(RunFolder(folder).requests(), key=lambda r: r.scheduled_at)
    assert [(r.conversation, r.turn, r.max_tokens) for r in records] == [("c", 1, 3), ("c", 2, 3), ("c", 3, 3)]
    assert chat.returncode == 0, chat.stdout[-2000:] + chat.stderr[-2000:]
    (folder,) = (tmp_path / "c").iterdir()
    assert sorted((r.phase, r.turn) for r in RunFolder(folder).requests()) == [
        ("burst-1", 1),
        ("burst-1", 1),
        ("burst-2", 2),
        ("burst-2", 2),
    ]
    assert refused.returncode == 2 and "the replay scenario sends each request at a trace's own time" in refused.stderr


def test_compare_with_conversations_matches_the_bursts_first_turns(tmp_path):
    chats = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    # Requests of about 0.14 s: a reading needs the repetitions' CI on one side of 1.5x, which 15-ms walls' jitter moves.
    with SyntheticServer(ttft=0.1, itl=0.01, tokens=64) as s:
        proc = loadgen(
            "compare",
            "--engine",
            f"vllm={s.url}",
            "--prompts",
            f"conversation:{chats}",
            "--burst-size",
            "2",
            "--no-sequential-four",
            "--max-tokens",
            "4",
            "--results",
            str(tmp_path),
            "--run-id",
            "run",
            "--metrics-port",
            "0",
            "--quiet",
            env={"SAMPLE_INTERVAL_MS": "0"},
        )
    assert proc.returncode == 0, proc.stderr
    records = list(RunFolder(tmp_path / "run").requests())
    sequential = sorted((r.conversation, r.turn) for r in records if r.phase == "sequential")
    burst = sorted((r.conversation, r.turn) for r in records if r.phase == "burst-1")
    assert sequential == burst == [("chat0", 1), ("chat1", 1)]  # the matched set: the same requests
    # The run's table pairs each burst with its matched sequential pass: a factor, not a refusal.
    # Which reading depends on how loaded the test host is (a parallel pass moves 0.14-s walls), so any
    # of the table's readings will do; what must not happen is a refusal.
    assert "the sequential-vs-burst table" in proc.stdout
    assert any(reading in proc.stdout for reading in (table.STRONG, table.PARTIAL, table.NEAR_LINEAR, "undecided"))
    assert "refused" not in proc.stdout
