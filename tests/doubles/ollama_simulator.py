"""Stands in for Ollama's server (`ollama serve`, which cannot be installed here), following its documented HTTP API.

What it serves (real HTTP, aiohttp), as Ollama documents it:
- POST /api/chat, POST /api/generate: NDJSON stream by default (`"stream": false` gives one
  JSON object). The final object has `done: true`, `done_reason` ("stop", or "length" when
  `options.num_predict` ran out) and the durations in NANOSECONDS: `total_duration`,
  `load_duration`, `prompt_eval_count`, `prompt_eval_duration`, `eval_count`, `eval_duration`.
- GET /api/ps (loaded models: name, model, size, size_vram, digest, details, expires_at,
  context_length), GET /api/tags (installed models with details{family, parameter_size,
  quantization_level, format}), GET /api/version, GET / ("Ollama is running").
- POST /v1/chat/completions (OpenAI compatible; SSE when `stream`, with a final
  `choices: []` + `usage` chunk when `stream_options.include_usage`), GET /v1/models.
- OLLAMA_NUM_PARALLEL semantics: per model, at most num_parallel requests generate at once
  (a semaphore); the others wait, unseen (nothing in any API shows them). When more than
  max_queue requests are waiting, new ones get HTTP 503 as with OLLAMA_MAX_QUEUE.
- The first request for a model that is not loaded pays `load_delay` (reported as
  load_duration); a loaded model stays in /api/ps for `keep_alive` seconds after its last use.
- A client that disconnects cancels its generation (its slot is freed).
Token text is a fixed word cycle; one token every `token_delay` seconds. `eos_after` N: the model's
answer ends (its end-of-sequence token) after N tokens, before `num_predict` runs out when that is
larger: Ollama has no ignore_eos, so `done_reason` is then "stop" and `eval_count` N.

Command line (stable; the load generator, dashboards and stack use it)::

    python -m tests.doubles.ollama_simulator --port N [--host 127.0.0.1] [--num-parallel N]
        [--max-queue N] [--token-delay S] [--tokens N] [--load-delay S] [--keep-alive S]
        [--model NAME ...] [--version X.Y.Z]

prints `ollama simulator listening on http://HOST:PORT` when ready; SIGTERM/SIGINT stop it.

From Python (tests)::

    with OllamaSimulator(num_parallel=1, token_delay=0.01) as sim:   # port 0 = a free port
        requests.post(f"{sim.url}/api/chat", json={...})
        sim.stats["max_running"], sim.stats["cancelled"], sim.last_request

`sim.break_after_tokens = N` makes the next streamed response cut its connection after N
tokens (an engine dying mid-stream).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from aiohttp import web

DEFAULT_MODEL = "smollm2-135m:latest"
WORDS = (
    "The",
    " cache",
    " holds",
    " keys",
    " and",
    " values",
    " for",
    " every",
    " token",
    " so",
    " decoding",
    " stays",
    " fast",
    ".",
    " Blocks",
    " are",
    " paged",
    " in",
    " and",
    " out",
    " on",
    " demand",
    ",",
    " like",
)


@dataclass
class SimulatedModel:
    name: str
    size: int = 103_000_000  # bytes on disk (the SmolLM2-135M Q4_1 GGUF)
    loaded_size: int = 180_000_000  # bytes when loaded (weights + KV + graph)
    family: str = "llama"
    parameter_size: str = "134.52M"
    quantization_level: str = "Q4_1"
    context_length: int = 4096
    digest: str = "9077e0ab2ee4ad0e4d5e6f73b5e6a4d1e1b9dcd4d4e0c5f6a7b8c9d0e1f2a3b4"
    loaded_until: float | None = None  # wall-clock expiry; None = not loaded
    semaphore: asyncio.Semaphore | None = None
    lock: asyncio.Lock | None = None

    def details(self) -> dict:
        return {
            "parent_model": "",
            "format": "gguf",
            "family": self.family,
            "families": [self.family],
            "parameter_size": self.parameter_size,
            "quantization_level": self.quantization_level,
        }


_SECOND = (0, "")  # (a whole second, its "YYYY-MM-DDTHH:MM:SS." text): strftime once a second, not per token


def _now_rfc3339(at: float | None = None) -> str:
    """Go's RFC 3339 with nanoseconds, as Ollama prints times."""
    global _SECOND
    now = time.time() if at is None else at
    second, text = _SECOND
    if int(now) != second:
        second = int(now)
        text = datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        _SECOND = (second, text)
    return f"{text}{int((now - second) * 1e6):06d}123Z"


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # json.dumps builds a new encoder per call for non-default options


def _dump(value: dict) -> bytes:
    """Compact JSON, as Go's encoding/json writes it."""
    return _ENCODER.encode(value).encode()


def _json(value, status: int = 200) -> web.Response:
    return web.Response(body=_dump(value), status=status, content_type="application/json", charset="utf-8")


def normalise(name: object) -> str:
    if not isinstance(name, str) or not name:
        return ""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


@dataclass
class OllamaSimulator:
    host: str = "127.0.0.1"
    port: int = 0
    num_parallel: int = 1
    max_queue: int = 512
    token_delay: float = 0.01
    tokens: int = 24  # generated tokens when the request sets no limit
    load_delay: float = 0.05
    keep_alive: float = 300.0
    eos_after: int | None = None  # the model's answers end after this many tokens (None: only num_predict ends them)
    version: str = "0.12.6"
    models: list[str] = field(default_factory=lambda: [DEFAULT_MODEL])

    def __post_init__(self):
        self._models = {normalise(name): SimulatedModel(normalise(name)) for name in self.models}
        self.stats = {
            "requests": 0,
            "running": 0,
            "max_running": 0,
            "waiting": 0,
            "max_waiting": 0,
            "completed": 0,
            "cancelled": 0,
            "rejected": 0,
        }
        self.last_request: dict | None = None
        self.break_after_tokens: int | None = None
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # --- serving ---
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("GET", "/", self._root)
        app.router.add_route("HEAD", "/", self._root)
        app.router.add_get("/api/version", self._version)
        app.router.add_get("/api/tags", self._tags)
        app.router.add_get("/api/ps", self._ps)
        app.router.add_post("/api/chat", self._native)
        app.router.add_post("/api/generate", self._native)
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_get("/v1/models", self._openai_models)
        return app

    async def start_async(self) -> None:
        for model in self._models.values():
            model.semaphore = asyncio.Semaphore(self.num_parallel)
            model.lock = asyncio.Lock()
        # handler_cancellation: Ollama stops generating when the client goes away.
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def stop_async(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def start(self) -> OllamaSimulator:
        """Serve from a background thread with its own event loop; returns once listening."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(self.start_async())
            except BaseException as exc:  # noqa: BLE001 -- handed to the starting thread
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self.stop_async())
            self._loop.close()

        self._thread = threading.Thread(target=serve, name="ollama-simulator", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise TimeoutError("ollama simulator did not start within 10 s")
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> OllamaSimulator:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- simple endpoints ---
    async def _root(self, _request: web.Request) -> web.Response:
        return web.Response(text="Ollama is running")

    async def _version(self, request: web.Request) -> web.Response:
        self.last_request = {
            "method": request.method,
            "path": request.path,
            "raw_path": request.raw_path,
            "query_string": request.raw_path.partition("?")[2],
            "headers": request.headers.copy(),
            "body": await request.read(),
        }
        return _json({"version": self.version})

    async def _tags(self, _request: web.Request) -> web.Response:
        return _json(
            {
                "models": [
                    {
                        "name": m.name,
                        "model": m.name,
                        "modified_at": "2025-10-01T09:30:00.123456789Z",
                        "size": m.size,
                        "digest": m.digest,
                        "details": m.details(),
                    }
                    for m in self._models.values()
                ]
            }
        )

    async def _ps(self, _request: web.Request) -> web.Response:
        now = time.time()
        loaded = [m for m in self._models.values() if m.loaded_until is not None and m.loaded_until > now]
        return _json(
            {
                "models": [
                    {
                        "name": m.name,
                        "model": m.name,
                        "size": m.loaded_size,
                        "digest": m.digest,
                        "details": m.details(),
                        "expires_at": _now_rfc3339(m.loaded_until),
                        "size_vram": 0,
                        "context_length": m.context_length,
                    }
                    for m in loaded
                ]
            }
        )

    async def _openai_models(self, _request: web.Request) -> web.Response:
        return _json(
            {
                "object": "list",
                "data": [
                    {"id": m.name, "object": "model", "created": 1759311000, "owned_by": "library"}
                    for m in self._models.values()
                ],
            }
        )

    # --- generation ---
    async def _read(self, request: web.Request) -> tuple[dict | None, web.Response | None]:
        body = await request.read()
        # raw_path: the request target exactly as received (percent-encoding untouched)
        self.last_request = {
            "method": request.method,
            "path": request.path,
            "raw_path": request.raw_path,
            "query_string": request.raw_path.partition("?")[2],
            "headers": request.headers.copy(),
            "body": body,
        }
        self.stats["requests"] += 1
        try:
            payload = json.loads(body)
        except ValueError:
            return None, _json({"error": "invalid character in request body"}, status=400)
        if not isinstance(payload, dict):
            return None, _json({"error": "request body must be a JSON object"}, status=400)
        name = normalise(payload.get("model"))
        if name not in self._models:
            return None, _json({"error": f"model '{payload.get('model')}' not found"}, status=404)
        return payload, None

    async def _admit(self, model: SimulatedModel):
        """Wait for a slot like Ollama's scheduler; None when the queue is full (-> 503)."""
        if self.stats["waiting"] >= self.max_queue:
            self.stats["rejected"] += 1
            return None
        self.stats["waiting"] += 1
        self.stats["max_waiting"] = max(self.stats["max_waiting"], self.stats["waiting"])
        try:
            await model.semaphore.acquire()
        finally:
            self.stats["waiting"] -= 1
        self.stats["running"] += 1
        self.stats["max_running"] = max(self.stats["max_running"], self.stats["running"])
        return model

    def _release(self, model: SimulatedModel) -> None:
        self.stats["running"] -= 1
        model.semaphore.release()
        model.loaded_until = time.time() + self.keep_alive

    async def _load(self, model: SimulatedModel) -> float:
        """Seconds spent loading: load_delay for a cold model, a few microseconds when it is resident."""
        started = time.perf_counter()
        async with model.lock:
            if model.loaded_until is None or model.loaded_until <= time.time():
                await asyncio.sleep(self.load_delay)
                model.loaded_until = time.time() + self.keep_alive
        return time.perf_counter() - started

    def _prompt_tokens(self, payload: dict) -> int:
        if isinstance(payload.get("messages"), list):
            text = " ".join(str(m.get("content", "")) for m in payload["messages"] if isinstance(m, dict))
            return len(text.split()) + 4 * len(payload["messages"])
        return len(str(payload.get("prompt", "")).split()) + 4

    async def _native(self, request: web.Request) -> web.StreamResponse:
        payload, error = await self._read(request)
        if error:
            return error
        chat = request.path == "/api/chat"
        options = payload.get("options") if isinstance(payload.get("options"), dict) else {}
        limit = options.get("num_predict")
        n_tokens = limit if isinstance(limit, int) and limit > 0 else self.tokens
        if self.eos_after is not None and self.eos_after < n_tokens:
            n_tokens, limit = self.eos_after, None  # the answer's own end comes first: done_reason "stop"
        model = self._models[normalise(payload.get("model"))]
        received = time.perf_counter()
        if await self._admit(model) is None:
            return _json({"error": "server busy, please try again.  maximum pending requests exceeded"}, status=503)
        try:
            return await self._generate_native(request, payload, model, chat, n_tokens, limit, received)
        except asyncio.CancelledError:
            self.stats["cancelled"] += 1
            raise
        finally:
            self._release(model)

    async def _generate_native(self, request, payload, model, chat, n_tokens, limit, received):
        load_seconds = await self._load(model)
        prompt_tokens = self._prompt_tokens(payload)
        prompt_started = time.perf_counter()
        await asyncio.sleep(self.token_delay / 4)
        prompt_seconds = time.perf_counter() - prompt_started
        stream = payload.get("stream", True) is not False
        name = model.name

        def chunk(token: str) -> dict:
            base = {"model": name, "created_at": _now_rfc3339()}
            if chat:
                base["message"] = {"role": "assistant", "content": token}
            else:
                base["response"] = token
            base["done"] = False
            return base

        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        if stream:
            await response.prepare(request)
        generated: list[str] = []
        eval_started = time.perf_counter()
        break_after = self.break_after_tokens
        for index in range(n_tokens):
            await asyncio.sleep(self.token_delay)
            token = WORDS[index % len(WORDS)]
            generated.append(token)
            if stream:
                await response.write(_dump(chunk(token)) + b"\n")
                if break_after is not None and index + 1 >= break_after:
                    self.break_after_tokens = None
                    request.transport.close()  # the engine died mid-stream
                    return response
        eval_seconds = time.perf_counter() - eval_started
        final = chunk("" if stream else "".join(generated))
        final.update(
            {
                "done": True,
                "done_reason": "length" if limit else "stop",
                "total_duration": int((time.perf_counter() - received) * 1e9),
                "load_duration": int(load_seconds * 1e9),
                "prompt_eval_count": prompt_tokens,
                "prompt_eval_duration": int(prompt_seconds * 1e9),
                "eval_count": len(generated),
                "eval_duration": int(eval_seconds * 1e9),
            }
        )
        if not chat:
            final["context"] = list(range(1, prompt_tokens + len(generated) + 1))[:32]
        self.stats["completed"] += 1
        if not stream:
            return _json(final)
        await response.write(_dump(final) + b"\n")
        await response.write_eof()
        return response

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        payload, error = await self._read(request)
        if error:
            return error
        limit = payload.get("max_completion_tokens") or payload.get("max_tokens")
        n_tokens = limit if isinstance(limit, int) and limit > 0 else self.tokens
        if self.eos_after is not None and self.eos_after < n_tokens:
            n_tokens, limit = self.eos_after, None  # the answer's own end comes first: done_reason "stop"
        model = self._models[normalise(payload.get("model"))]
        if await self._admit(model) is None:
            return _json(
                {
                    "error": {
                        "message": "server busy, please try again.  maximum pending requests exceeded",
                        "type": "api_error",
                    }
                },
                status=503,
            )
        try:
            return await self._generate_openai(request, payload, model, n_tokens, limit)
        except asyncio.CancelledError:
            self.stats["cancelled"] += 1
            raise
        finally:
            self._release(model)

    async def _generate_openai(self, request, payload, model, n_tokens, limit):
        await self._load(model)
        prompt_tokens = self._prompt_tokens(payload)
        await asyncio.sleep(self.token_delay / 4)
        created = int(time.time())
        ident = f"chatcmpl-{self.stats['requests']}"
        finish = "length" if limit else "stop"
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n_tokens,
            "total_tokens": prompt_tokens + n_tokens,
        }
        if not payload.get("stream"):
            await asyncio.sleep(self.token_delay * n_tokens)
            text = "".join(WORDS[i % len(WORDS)] for i in range(n_tokens))
            self.stats["completed"] += 1
            return _json(
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": created,
                    "model": model.name,
                    "system_fingerprint": "fp_ollama",
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                    ],
                    "usage": usage,
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        def event(choices: list, **extra) -> bytes:
            body = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model.name,
                "system_fingerprint": "fp_ollama",
                "choices": choices,
                **extra,
            }
            return b"data: " + _dump(body) + b"\n\n"

        for index in range(n_tokens):
            await asyncio.sleep(self.token_delay)
            delta = {"role": "assistant", "content": WORDS[index % len(WORDS)]}
            await response.write(event([{"index": 0, "delta": delta, "finish_reason": None}]))
        await response.write(
            event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": finish}])
        )
        options = payload.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            await response.write(event([], usage=usage))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        self.stats["completed"] += 1
        return response


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.doubles.ollama_simulator", description="Ollama API simulator (test double)."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="0 = any free port (printed)")
    parser.add_argument("--num-parallel", type=int, default=1, help="OLLAMA_NUM_PARALLEL (default 1)")
    parser.add_argument("--max-queue", type=int, default=512, help="OLLAMA_MAX_QUEUE (default 512)")
    parser.add_argument("--token-delay", type=float, default=0.01, help="seconds per generated token")
    parser.add_argument("--tokens", type=int, default=24, help="tokens generated when the request sets no limit")
    parser.add_argument("--load-delay", type=float, default=0.05, help="seconds a cold model takes to load")
    parser.add_argument("--keep-alive", type=float, default=300.0, help="seconds a model stays loaded after use")
    parser.add_argument("--model", action="append", help=f"model name (repeatable; default {DEFAULT_MODEL})")
    parser.add_argument("--version", default="0.12.6", help="what /api/version reports")
    args = parser.parse_args(argv)
    sim = OllamaSimulator(
        host=args.host,
        port=args.port,
        num_parallel=args.num_parallel,
        max_queue=args.max_queue,
        token_delay=args.token_delay,
        tokens=args.tokens,
        load_delay=args.load_delay,
        keep_alive=args.keep_alive,
        version=args.version,
        models=args.model or [DEFAULT_MODEL],
    )

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        try:
            await sim.start_async()
        except OSError as exc:
            print(f"ollama simulator: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
            raise SystemExit(1) from None
        print(f"ollama simulator listening on {sim.url}", flush=True)
        await stop.wait()
        await sim.stop_async()

    try:  # Ollama (Go) spends far less CPU per chunk than aiohttp does; uvloop narrows the gap on a 2-core machine
        import uvloop
    except ImportError:
        uvloop = None
    with asyncio.Runner(loop_factory=uvloop.new_event_loop if uvloop else None) as runner:
        runner.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
