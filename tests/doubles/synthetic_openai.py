"""Test tool, not an engine: a synthetic OpenAI-compatible streaming chat server (stands in for vLLM's /v1/chat/completions) with exact timing and fault knobs.

Used by the load generator's tests and by `bench/` to know the truth a client should measure:
every content chunk is written on an ABSOLUTE deadline measured from the moment the request reached
the server's socket (t0: the kernel's receive timestamp of its bytes, SO_TIMESTAMPNS, on Linux):
content chunk k (k = 0..n-1) goes out at t0 + ttft + k * itl, so a late write never shifts the ones
after it (no drift), and the time a busy server thread takes to get round to a request (64 of them
arriving at once wait for the GIL one by one) is inside the TTFT it serves, not added on top of it
where a client would be blamed for it. Where the kernel gives no stamp, t0 is when the request line
was read. The stream looks like vLLM's:

  data: {... "delta": {"role": "assistant", "content": ""} ...}      sent at t0 (empty role chunk)
  data: {... "delta": {"content": "tok0 "} ...}                      t0 + ttft
  ...                                                                t0 + ttft + k * itl
  data: {... "delta": {}, "finish_reason": "length"}                 right after the last token
  data: {... "choices": [], "usage": {...}}                          only with stream_options.include_usage
  data: [DONE]

CLI (stable; other tests rely on it):
  python -m tests.doubles.synthetic_openai --port N [--host 127.0.0.1] [--ttft 0.2] [--itl 0.02]
      [--tokens 64] [--model NAME] [--no-usage] [--timings] [--fault SPEC] [--version-string S]
      [--max-running N] [--kv-blocks N] [--slowdown F] [--burn] [--cpus LIST] [--flavour vllm|sglang]
  --port 0 picks a free port. The first stdout line is always `listening on http://HOST:PORT`.
  tokens per request = min(--tokens, the request's max_tokens); --itl 0 sends as fast as it can.

Endpoints: POST /v1/chat/completions (stream or not), GET /v1/models, GET /version (vLLM-style),
GET /metrics (vLLM 0.32's scheduler gauges and token counters, the lines the exporter reads; with
--flavour sglang the same state in SGLang's names, and /get_model_info, /get_server_info instead of /version),
GET /health, GET /stats (request counts and how late the server's own writes were, in ms), GET
/stats/counters (requests, streams_completed, tokens_sent only: cheap enough to poll while a test runs),
GET /stats/streams (per stream: prompt, t_arrival (kernel receive stamp; t0), t_request_line (when a
thread read it), t_body (body read) and every content write (writes: stamped as the write starts; write_ends: as it
returned), all on time.monotonic()),
POST /control (JSON body with any of ttft, itl, tokens, usage, timings, fault, max_running,
serial_prefill, metrics_fault, prefix_cache, prefix_block, prompt_tokens_details, prefill_per_token,
kv_blocks, slowdown: changes them live).

Scheduling of streamed requests, like the engines it stands in for: `max_running` N > 0 admits at most N streams at
once (vLLM's --max-num-seqs, llama.cpp's --parallel); the rest wait in arrival order and show in
vllm:num_requests_waiting, and a waiting request's clock (ttft, then itl per token) starts when it
is admitted. `serial_prefill` makes admitted requests' prefills run one after another (vLLM's
chunked prefill under a token budget): each first token comes `ttft` after the previous prefill
ended, while every request counts as running. KV usage is the tokens of the running requests
(prompt + generated so far) over a pool of 1456 blocks x 16 tokens (the reference page's).
`kv_blocks` N > 0 makes the KV pool N blocks of 16 tokens, and admission waits (in arrival order) until the pool
has the blocks of a request's whole length free (vLLM waits for KV blocks the same way once its pool is the
limit); KV usage is then the reserved blocks over N. `slowdown` F > 0 is a compute-bound engine: every step
(prefill, each token) takes (1 + F x (running - 1)) times its time, so latency grows with the load while
nothing ever waits (set no `max_running` with it). `burn` keeps a core busy while any request runs (a
thread hashing, outside the GIL), as an engine's compute does; `--cpus` pins the process to those cores.
`metrics_fault` (`status=503` or `stall=S`) makes GET /metrics fail or hang: an engine whose
metrics page stops answering while it still serves.

Prefix cache, like vLLM's automatic prefix caching and llama.cpp's per-slot prompt cache
(`prefix_cache`): a streamed request's prompt (its messages' words, one token each, in order) is
matched against the sequences earlier requests left behind (their prompts, and prompt + answer once
they finished: both engines keep the generated tokens' KV too); the longest common prefix, less the
last prompt token (which both engines always compute: it gives the first logits), rounded down to
`prefix_block` tokens (vLLM's block size; 1 is llama.cpp's token granularity), is the cached part.
With it off nothing is ever cached. The cached tokens show where each engine shows them: llama.cpp's
`timings` (`cache_n`, and `prompt_n` = the tokens it computed), `usage.prompt_tokens_details.
cached_tokens` (llama.cpp always, vLLM with --enable-prompt-tokens-details: `prompt_tokens_details`),
and vLLM's counters `vllm:prefix_cache_queries_total` (prompt tokens looked up: none while caching is
off, as vLLM counts) and `vllm:prefix_cache_hits_total`. `prefill_per_token` adds that many seconds
to a request's TTFT per prompt token it computes, so TTFT falls with reuse as on a real engine.

Faults (SPEC, comma-separated): `status=503` answer that HTTP status with a JSON error;
`cut=N` close the connection after N content chunks (no [DONE]); `malformed=N` content chunk N
is not JSON; `stall=S` sleep S seconds after the role chunk (a client timeout fires);
`error=N` send an OpenAI error object as an SSE event after N content chunks. A fault applies to
every request when given by --fault or /control, or to one request when its messages contain the
marker `[[fault:SPEC]]` or it carries the header `X-Synthetic-Fault: SPEC`.

Start it from a test with `SyntheticServer(ttft=..., itl=...).start()` (a thread in-process, port
chosen for you, `.url`, `.stop()`), or in its own process (its own GIL: a client under test can
block without stopping it) with `SyntheticProcess("--ttft", "0.2", ...)`, which runs the CLI above.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

from servescope.host.kernel_stamps import CMSG_SIZE, SO_TIMESTAMPNS, receive_stamp
from tests.doubles.serving import ServedInThread
from tests.paths import REPO

FAULT_MARKER = re.compile(r"\[\[fault:([^\]]+)\]\]")


@dataclass
class Behaviour:
    ttft: float = 0.2
    itl: float = 0.02
    tokens: int = 64
    model: str = "synthetic/model"
    usage: bool = True
    timings: bool = False  # llama.cpp's `timings` object in the final chunk
    fault: str = ""
    version: str = "0.0.0-synthetic"
    max_running: int = 0  # 0: no cap (every stream at once)
    serial_prefill: bool = False
    metrics_fault: str = ""
    prefix_cache: bool = False
    prefix_block: int = 16  # tokens per cached block (vLLM's block size; 1: llama.cpp's token granularity)
    prompt_tokens_details: bool = False  # usage.prompt_tokens_details even without timings (vLLM's opt-in)
    prefill_per_token: float = 0.0  # seconds of TTFT per computed (uncached) prompt token
    kv_blocks: int = 0  # > 0: a KV pool of this many 16-token blocks admission waits on (0: the reference page's pool)
    slowdown: float = 0.0  # > 0: every step takes (1 + slowdown x (running - 1)) times longer; nothing ever queues
    burn: bool = False  # a core kept busy while any request runs: the server's CPU does the work, as an engine's does
    # "sglang": /metrics in SGLang's names (tests/fixtures/sglang-0.5-metrics-from-docs.txt), its /get_model_info and
    # /get_server_info, no /version (SGLang's version is in /get_server_info); "vllm": vLLM 0.32's, as above.
    flavour: str = "vllm"


@dataclass
class Fault:
    status: int | None = None
    cut: int | None = None
    malformed: int | None = None
    stall: float | None = None
    error: int | None = None

    @classmethod
    def parse(cls, spec: str) -> Fault:
        fault = cls()
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, _, value = part.partition("=")
            if key not in ("status", "cut", "malformed", "stall", "error") or not value:
                raise ValueError(f"bad fault {part!r}: expected status=CODE, cut=N, malformed=N, stall=S or error=N")
            setattr(fault, key, float(value) if key == "stall" else int(value))
        return fault


@dataclass
class Stats:
    requests: int = 0
    streams_completed: int = 0
    tokens_sent: int = 0  # content chunks written, all streams
    faults: int = 0
    lateness_s: collections.deque = field(default_factory=lambda: collections.deque(maxlen=200_000))
    # Per stream: the last user message, when its request line arrived and when each content chunk was
    # written (time.monotonic(): CLOCK_MONOTONIC, comparable across processes on Linux).
    streams: collections.deque = field(default_factory=lambda: collections.deque(maxlen=10_000))
    # The Authorization header of each chat request, as sent (None: none), counted.
    authorizations: collections.Counter = field(default_factory=collections.Counter)

    def counters(self) -> dict:
        return {"requests": self.requests, "streams_completed": self.streams_completed, "tokens_sent": self.tokens_sent}

    def summary(self) -> dict:
        late = sorted(self.lateness_s)

        def pct(q: float) -> float | None:
            return round(late[min(len(late) - 1, int(q * len(late)))] * 1000, 4) if late else None

        return {
            **self.counters(),
            "faults": self.faults,
            "chunks_timed": len(late),
            "late_ms_p50": pct(0.5),
            "late_ms_p99": pct(0.99),
            "late_ms_max": round(late[-1] * 1000, 4) if late else None,
        }


KV_BLOCK_SIZE = 16
KV_BLOCKS = 1456  # the reference page's pool: 23,296 tokens


class PrefixCache:
    """The token sequences earlier requests left behind, most recent last; a bounded LRU like an engine's free blocks."""

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self.sequences: collections.OrderedDict[tuple[str, ...], None] = collections.OrderedDict()

    def lookup(self, tokens: list[str], block: int) -> int:
        """Cached tokens of this prompt: the longest prefix it shares, less its last token, in whole blocks."""
        best = 0
        for seq in self.sequences:
            n = 0
            for a, b in zip(seq, tokens, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        hits = min(best, len(tokens) - 1)
        return max(0, hits - hits % max(1, block))

    def store(self, tokens: list[str]) -> None:
        key = tuple(tokens)
        self.sequences.pop(key, None)
        self.sequences[key] = None
        while len(self.sequences) > self.capacity:
            self.sequences.popitem(last=False)


class Scheduler:
    """Admission (a FIFO queue behind `max_running` slots and, in KV-pool mode, free KV blocks), serial prefill,
    the compute slowdown, and the counts GET /metrics shows."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.turns = threading.Condition(self.lock)
        self.running = 0
        self.queue: collections.deque[object] = collections.deque()
        self.reserved_blocks = 0  # KV-pool mode: blocks held by the running requests
        self.kv_blocks = 0  # KV-pool mode: the pool's size (0: the reference page's pool, never a limit)
        self.prefill_free_at = 0.0  # time.monotonic() when the prefill in progress ends
        self.held_tokens = 0  # prompt + generated tokens of the running requests
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.prefix_cache = PrefixCache()
        self.prefix_queries_total = 0
        self.prefix_hits_total = 0

    def cached(self, tokens: list[str], enabled: bool, block: int) -> int:
        """Look the prompt up (when caching is on) and count it as vLLM does; the prompt joins the cache."""
        with self.lock:
            if not enabled:
                return 0
            hits = self.prefix_cache.lookup(tokens, block)
            self.prefix_queries_total += len(tokens)
            self.prefix_hits_total += hits
            self.prefix_cache.store(tokens)
            return hits

    def remember(self, tokens: list[str]) -> None:
        with self.lock:
            self.prefix_cache.store(tokens)

    def admit(self, limit: int, blocks: int = 0) -> bool:
        """Block until this request may run (its turn in arrival order, a free slot, its KV blocks free); True when
        it had to wait. In KV-pool mode a request reserves the blocks of its whole length (prompt + output) at
        admission: vLLM allocates them as it decodes and preempts when it runs out; either way a pool that is the
        limit reads near full while requests wait."""
        ticket = object()
        with self.turns:
            self.queue.append(ticket)
            waited = False
            while not (self.queue[0] is ticket and self._fits(limit, blocks)):
                waited = True
                self.turns.wait()
            self.queue.popleft()
            self.running += 1
            self.reserved_blocks += blocks
            self.turns.notify_all()  # the next in line may fit too
        return waited

    def _fits(self, limit: int, blocks: int) -> bool:
        slot = limit <= 0 or self.running < limit
        kv = self.kv_blocks <= 0 or self.reserved_blocks + blocks <= self.kv_blocks or self.running == 0
        return slot and kv

    def release(self, blocks: int = 0) -> None:
        with self.turns:
            self.running -= 1
            self.reserved_blocks -= blocks
            self.turns.notify_all()

    def slowdown(self, factor: float) -> float:
        """How much longer a step takes with this many requests running (compute shared by the batch)."""
        with self.lock:
            return 1.0 + factor * max(0, self.running - 1)

    def first_token_at(self, admitted: float, ttft: float, serial: bool) -> float:
        """When the first token is due: `ttft` after admission, or after the prefill before this one ended."""
        with self.lock:
            if not serial:
                return admitted + ttft
            start = max(admitted, self.prefill_free_at)
            self.prefill_free_at = start + ttft
            return self.prefill_free_at

    def tokens(self, prompt: int = 0, generated: int = 0, held: int = 0) -> None:
        with self.lock:
            self.prompt_tokens_total += prompt
            self.generation_tokens_total += generated
            self.held_tokens += held

    def metrics(self, model: str, flavour: str = "vllm") -> str:
        """The scheduler lines of vLLM 0.32's /metrics (same names, labels and types), or SGLang's."""
        if flavour == "sglang":
            return self.sglang_metrics(model)
        labels = f'engine="0",model_name="{model}"'
        with self.lock:
            if self.kv_blocks > 0:
                usage = self.reserved_blocks / self.kv_blocks
            else:
                usage = self.held_tokens / (KV_BLOCK_SIZE * KV_BLOCKS)
            blocks = self.kv_blocks or KV_BLOCKS
            gauges = (
                ("vllm:num_requests_running", "gauge", self.running),
                ("vllm:num_requests_waiting", "gauge", len(self.queue)),
                ("vllm:kv_cache_usage_perc", "gauge", usage),
                ("vllm:prompt_tokens_total", "counter", self.prompt_tokens_total),
                ("vllm:generation_tokens_total", "counter", self.generation_tokens_total),
                ("vllm:prefix_cache_queries_total", "counter", self.prefix_queries_total),
                ("vllm:prefix_cache_hits_total", "counter", self.prefix_hits_total),
            )
        lines = []
        for name, kind, value in gauges:
            lines += [f"# TYPE {name} {kind}", f"{name}{{{labels}}} {float(value)!r}"]
        lines += [
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{KV_BLOCK_SIZE}",engine="0",num_gpu_blocks="{blocks}"}} 1.0',
        ]
        return "\n".join(lines) + "\n"

    def sglang_metrics(self, model: str) -> str:
        """SGLang's names for the same state (its documented page): running, queue, token usage, token counters."""
        labels = f'model_name="{model}"'
        with self.lock:
            blocks = self.kv_blocks or KV_BLOCKS
            usage = self.reserved_blocks / blocks if self.kv_blocks > 0 else self.held_tokens / (KV_BLOCK_SIZE * blocks)
            gauges = (
                ("sglang:num_running_reqs", "gauge", self.running),
                ("sglang:num_queue_reqs", "gauge", len(self.queue)),
                ("sglang:token_usage", "gauge", usage),
                ("sglang:num_used_tokens", "gauge", self.held_tokens),
                ("sglang:prompt_tokens_total", "counter", self.prompt_tokens_total),
                ("sglang:generation_tokens_total", "counter", self.generation_tokens_total),
            )
        lines = []
        for name, kind, value in gauges:
            lines += [f"# TYPE {name} {kind}", f"{name}{{{labels}}} {float(value)!r}"]
        return "\n".join(lines) + "\n"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # A burst of 64+ connects must not overflow the accept backlog (a SYN retry costs a full second).
    request_queue_size = 1024
    allow_reuse_address = True

    def __init__(self, address, behaviour: Behaviour):
        super().__init__(address, _Handler)
        self.behaviour = behaviour
        self.stats = Stats()
        self.lock = threading.Lock()
        self.scheduler = Scheduler()
        self.scheduler.kv_blocks = behaviour.kv_blocks
        if behaviour.burn:
            threading.Thread(target=self._burn, name="burn", daemon=True).start()

    def _burn(self) -> None:
        """While any request runs, keep a core busy, as an engine computing its batch does. The work is hashing a
        block of 8 MB (hashlib lets go of the GIL for it), so the stream threads keep their timing."""
        block = b"\0" * (1 << 23)  # 8 MB: ~20 ms a hash, so taking the GIL back between two is a small share
        turns = self.scheduler.turns
        while True:
            with turns:
                while self.scheduler.running == 0:
                    turns.wait()
            hashlib.sha256(block).digest()

    def handle_error(self, request, client_address) -> None:
        # A client that hung up on an idle keep-alive connection is normal in a load test: no traceback.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _StampedReader(io.RawIOBase):
    """The connection's reads through recvmsg: `stamp` is when the bytes of the last read reached the socket (monotonic)."""

    def __init__(self, sock: socket.socket):
        super().__init__()
        self.sock = sock
        self.stamp: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n, ancillary, _flags, _addr = self.sock.recvmsg_into([buffer], CMSG_SIZE)
        # On time.monotonic(), the clock every other stamp here (and the client's) is on.
        stamp = receive_stamp(ancillary, time.monotonic)
        if stamp is not None:
            self.stamp = stamp
        return n


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        # One SSE event per write must leave at once: Nagle + delayed ACK would hold it ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader: _StampedReader | None = None
        if SO_TIMESTAMPNS is not None:
            try:
                self.connection.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            except OSError:
                return
            self.reader = _StampedReader(self.connection)
            self.rfile = io.BufferedReader(self.reader)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        pass

    def handle_one_request(self) -> None:
        if self.reader is not None:
            self.reader.stamp = None  # a stamp from the last request's body read is not this request's arrival
        super().handle_one_request()

    def parse_request(self) -> bool:
        # The request line has just been read: the earliest moment a thread of this server knows of the
        # request. Its bytes got here earlier (a burst's requests queue for the GIL): the kernel says when.
        self.t_request_line = time.monotonic()
        stamp = self.reader.stamp if self.reader is not None else None
        self.t_arrival = stamp if stamp is not None and stamp <= self.t_request_line else self.t_request_line
        return super().parse_request()

    # --- plumbing ---
    def _json(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _chunk(self, data: bytes) -> None:
        # HTTP/1.1 chunked framing, one HTTP chunk per SSE event, like uvicorn under vLLM.
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    # --- GET ---
    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        b = self.server.behaviour
        if self.path == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [{"id": b.model, "object": "model", "owned_by": "synthetic", "max_model_len": 1024}],
                },
            )
        elif self.path == "/version" and b.flavour != "sglang":
            self._json(200, {"version": b.version})
        elif self.path == "/get_model_info" and b.flavour == "sglang":
            self._json(200, {"model_path": b.model, "tokenizer_path": b.model, "is_generation": True})
        elif self.path == "/get_server_info" and b.flavour == "sglang":
            self._json(
                200, {"version": b.version, "max_running_requests": b.max_running or None, "context_length": 1024}
            )
        elif self.path.split("?", 1)[0] == "/metrics":
            fault = Fault.parse(b.metrics_fault)
            if fault.stall:
                time.sleep(fault.stall)
            if fault.status:
                self._json(fault.status, {"error": {"message": "synthetic metrics fault", "code": fault.status}})
                return
            body = self.server.scheduler.metrics(b.model, b.flavour).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/stats":
            with self.server.lock:
                self._json(200, self.server.stats.summary())
        elif self.path == "/stats/counters":
            with self.server.lock:
                self._json(200, self.server.stats.counters())
        elif self.path == "/stats/streams":
            with self.server.lock:
                self._json(200, {"streams": list(self.server.stats.streams)})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "NotFound", "code": 404}})

    # --- POST ---
    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        body = self._read_body()
        self.t_body = time.monotonic()
        if self.path == "/control":
            self._control(body)
        elif self.path == "/v1/chat/completions":
            self.server.stats.authorizations[self.headers.get("Authorization")] += 1
            self._chat(body, self.t_arrival)
        else:
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "NotFound", "code": 404}})

    def _control(self, body: bytes) -> None:
        try:
            changes = json.loads(body or b"{}")
            b = self.server.behaviour
            for key, value in changes.items():
                if key not in Behaviour.__dataclass_fields__:
                    raise ValueError(f"unknown knob {key}")
                if key in ("fault", "metrics_fault"):
                    Fault.parse(value)
                setattr(b, key, type(getattr(b, key))(value))
        except (ValueError, TypeError, AttributeError) as exc:
            self._json(400, {"error": {"message": str(exc), "type": "BadRequest", "code": 400}})
            return
        self._json(200, asdict(self.server.behaviour))

    def _chat(self, body: bytes, t0: float) -> None:
        b = self.server.behaviour
        try:
            request = json.loads(body)
            messages = request["messages"]
        except (ValueError, KeyError, TypeError):
            self._json(
                400, {"error": {"message": "body must be JSON with messages", "type": "BadRequest", "code": 400}}
            )
            return
        spec = b.fault
        header_spec = self.headers.get("X-Synthetic-Fault")
        if header_spec:
            spec = header_spec
        for message in messages:
            found = FAULT_MARKER.search(str(message.get("content", "")))
            if found:
                spec = found.group(1)
        try:
            fault = Fault.parse(spec)
        except ValueError as exc:
            self._json(400, {"error": {"message": str(exc), "type": "BadRequest", "code": 400}})
            return
        with self.server.lock:
            self.server.stats.requests += 1
            self.server.stats.faults += bool(spec)
        if fault.status:
            self._json(
                fault.status,
                {
                    "error": {
                        "message": f"synthetic fault: HTTP {fault.status}",
                        "type": "ServiceUnavailable",
                        "code": fault.status,
                    }
                },
            )
            return
        max_tokens = request.get("max_tokens") or request.get("max_completion_tokens") or b.tokens
        n = max(1, min(b.tokens, int(max_tokens)))
        if request.get("stream"):
            self._stream(request, n, fault, t0)
        else:
            self._wait_until(t0 + b.ttft + (n - 1) * b.itl)
            self._json(
                200,
                {
                    "id": "chatcmpl-synthetic",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": b.model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "".join(f"tok{i} " for i in range(n))},
                            "finish_reason": "length",
                        }
                    ],
                    "usage": {
                        "prompt_tokens": _prompt_tokens(messages),
                        "completion_tokens": n,
                        "total_tokens": _prompt_tokens(messages) + n,
                    },
                },
            )

    @staticmethod
    def _wait_until(deadline: float) -> float:
        """Sleep to an absolute monotonic deadline; returns how late we woke (s)."""
        delay = deadline - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        return time.monotonic() - deadline

    def _stream(self, request: dict, n: int, fault: Fault, t0: float) -> None:
        b = self.server.behaviour
        ttft, itl, model = b.ttft, b.itl, b.model
        created = int(time.time())
        head = (
            '{"id":"chatcmpl-synthetic","object":"chat.completion.chunk",'
            f'"created":{created},"model":{json.dumps(model)},"choices":[{{"index":0,"delta":'
        ).encode()

        def event(delta: str, finish: str = "null") -> bytes:
            return (
                b"data: " + head + delta.encode() + b',"logprobs":null,"finish_reason":' + finish.encode() + b"}]}\n\n"
            )

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk(event('{"role":"assistant","content":""}'))
        if fault.stall:
            time.sleep(fault.stall)
        scheduler, limit = self.server.scheduler, b.max_running
        words = _prompt_words(request["messages"])
        prompt_tokens = len(words)
        scheduler.kv_blocks = b.kv_blocks
        blocks = -(-(prompt_tokens + n) // KV_BLOCK_SIZE) if b.kv_blocks > 0 else 0
        waited = scheduler.admit(limit, blocks)
        slow = b.slowdown
        if slow > 0:
            ttft *= scheduler.slowdown(slow)
        cached = scheduler.cached(words, b.prefix_cache, b.prefix_block)
        prefill = ttft + b.prefill_per_token * (prompt_tokens - cached)
        first = scheduler.first_token_at(time.monotonic() if waited else t0, prefill, b.serial_prefill)
        scheduler.tokens(prompt=prompt_tokens, held=prompt_tokens)
        late: list[float] = []
        writes: list[float] = []
        write_ends: list[float] = []  # as each write returned: a thread preempted inside one shows between the two
        generated = 0
        due = first
        try:
            for k in range(n):
                if fault.cut is not None and k == fault.cut:
                    self._cut()
                    return
                if fault.error is not None and k == fault.error:
                    self._chunk(
                        b'data: {"error":{"message":"synthetic fault: engine error mid-stream","type":"InternalServerError","code":500}}\n\n'
                    )
                    self._chunk(b"data: [DONE]\n\n")
                    self._chunk(b"")
                    return
                if slow > 0:
                    # Each step's length depends on the batch running now: deadlines follow one another.
                    if k:
                        due += itl * scheduler.slowdown(slow)
                    late.append(self._wait_until(due))
                elif itl > 0 or k == 0:
                    late.append(self._wait_until(first + k * itl))
                # Stamped as the write starts: on loopback the bytes reach the client inside this syscall.
                writes.append(time.monotonic())
                if fault.malformed is not None and k == fault.malformed:
                    self._chunk(b'data: {"id":"chatcmpl-synthetic","choices":[{"delta":{"content":"broken\n\n')
                else:
                    self._chunk(event(f'{{"content":"tok{k} "}}'))
                write_ends.append(time.monotonic())
                scheduler.tokens(generated=1, held=1)
                generated += 1
            final = event("{}", '"length"')
            if b.timings:
                # llama.cpp puts its `timings` object on the final chunk.
                # Like llama.cpp: prompt_ms is the prefill, predicted_ms the generation after it; time
                # spent waiting for a slot is in neither.
                generation_s = time.monotonic() - first
                timings = {
                    "cache_n": cached,
                    "prompt_n": prompt_tokens - cached,  # llama.cpp: the prompt tokens it computed
                    "prompt_ms": round(prefill * 1000, 3),
                    "predicted_n": n,
                    "predicted_ms": round(generation_s * 1000, 3),
                    "predicted_per_second": round(n / max(1e-9, generation_s), 3),
                }
                final = final[:-3] + b',"timings":' + json.dumps(timings, separators=(",", ":")).encode() + b"}\n\n"
            self._chunk(final)
            include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
            if b.usage and include_usage:
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
                if b.timings or b.prompt_tokens_details:
                    usage["prompt_tokens_details"] = {"cached_tokens": cached}
                self._chunk(
                    (
                        "data: "
                        + json.dumps(
                            {
                                "id": "chatcmpl-synthetic",
                                "object": "chat.completion.chunk",
                                "created": created,
                                "model": model,
                                "choices": [],
                                "usage": usage,
                            }
                        )
                        + "\n\n"
                    ).encode()
                )
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
            if b.prefix_cache:
                scheduler.remember(words + [f"tok{k}" for k in range(n)])
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            return
        finally:
            scheduler.tokens(held=-(prompt_tokens + generated))
            scheduler.release(blocks)
            with self.server.lock:
                self.server.stats.tokens_sent += len(writes)
                self.server.stats.lateness_s.extend(late)
                self.server.stats.streams.append(
                    {
                        "prompt": str(request["messages"][-1].get("content", "")),
                        "prompt_tokens": prompt_tokens,
                        "cached_tokens": cached,
                        "t_arrival": self.t_arrival,
                        "t_request_line": self.t_request_line,
                        "t_body": self.t_body,
                        "t0": t0,
                        "writes": writes,
                        "write_ends": write_ends,
                    }
                )
        with self.server.lock:
            self.server.stats.streams_completed += 1

    def _cut(self) -> None:
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _prompt_tokens(messages: list) -> int:
    return len(_prompt_words(messages))


def _prompt_words(messages: list) -> list[str]:
    # A stand-in tokenizer: one token per whitespace-separated word, the messages in order.
    return [word for m in messages for word in str(m.get("content", "")).split()]


class SyntheticServer(ServedInThread):
    """The server in a background thread of the test process: `with SyntheticServer(ttft=0.05) as s: s.url`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **behaviour):
        self.behaviour = Behaviour(**behaviour)
        Fault.parse(self.behaviour.fault)
        self.httpd = _Server((host, port), self.behaviour)
        self.host, self.port = self.httpd.server_address[:2]
        self.url = f"http://{self.host}:{self.port}"

    @property
    def stats(self) -> Stats:
        return self.httpd.stats


class SyntheticProcess:
    """The CLI above in its own process, port chosen by the kernel: `with SyntheticProcess("--ttft", "0") as s: s.url`."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.doubles.synthetic_openai", "--port", "0", *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"synthetic server did not start: {line!r}")
        self.url = line.split()[-1]
        self.session = requests.Session()  # polled every few ms while a client runs: one kept-alive connection

    def stats(self) -> dict:
        return requests.get(f"{self.url}/stats", timeout=10).json()

    def streams(self, at_least: int = 0) -> list[dict]:
        """The streams filed so far, waiting (up to 30 s) for `at_least` of them: a stream is filed after its last
        write, so its client may be done first."""
        deadline = time.monotonic() + 30
        while True:
            streams = requests.get(f"{self.url}/stats/streams", timeout=30).json()["streams"]
            if len(streams) >= at_least or time.monotonic() > deadline:
                return streams
            time.sleep(0.02)

    def counters(self) -> dict:
        return self.session.get(f"{self.url}/stats/counters", timeout=10).json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> SyntheticProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.doubles.synthetic_openai", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on the first line)")
    parser.add_argument("--ttft", type=float, default=0.2, help="seconds from request to first content chunk")
    parser.add_argument(
        "--itl", type=float, default=0.02, help="seconds between content chunks (0: as fast as possible)"
    )
    parser.add_argument("--tokens", type=int, default=64, help="content chunks per request (capped by max_tokens)")
    parser.add_argument("--model", default="synthetic/model")
    parser.add_argument("--no-usage", action="store_true", help="never send the usage chunk")
    parser.add_argument("--timings", action="store_true", help="add llama.cpp's timings object to the final chunk")
    parser.add_argument("--fault", default="", help="fault for every request, e.g. status=503 or cut=5")
    parser.add_argument("--version-string", default="0.0.0-synthetic", help="what GET /version answers")
    parser.add_argument("--max-running", type=int, default=0, help="batch slots (0: no cap)")
    parser.add_argument("--kv-blocks", type=int, default=0, help="a KV pool of this many 16-token blocks (0: none)")
    parser.add_argument("--slowdown", type=float, default=0.0, help="each step x (1 + F x (running - 1))")
    parser.add_argument("--burn", action="store_true", help="keep a core busy while any request runs (an engine's CPU)")
    parser.add_argument("--cpus", default="", help="run on these cores only, e.g. 0 (its CPU affinity)")
    parser.add_argument("--flavour", choices=("vllm", "sglang"), default="vllm", help="whose metric names to serve")
    args = parser.parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    try:
        Fault.parse(args.fault)
        server = SyntheticServer(
            args.host,
            args.port,
            ttft=args.ttft,
            itl=args.itl,
            tokens=args.tokens,
            model=args.model,
            usage=not args.no_usage,
            timings=args.timings,
            fault=args.fault,
            version=args.version_string,
            max_running=args.max_running,
            kv_blocks=args.kv_blocks,
            slowdown=args.slowdown,
            burn=args.burn,
            flavour=args.flavour,
        )
    except (ValueError, OSError) as exc:
        print(f"synthetic_openai: {exc}", file=sys.stderr)
        return 2
    # Many stream threads wake on the same deadlines: hand the GIL over sooner than the 5 ms default.
    sys.setswitchinterval(0.0005)
    print(f"listening on {server.url}", flush=True)
    try:
        server.httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
