"""Benchmark: the exporter under attack by engines and clients: scrape time, /metrics size, resident memory after each.

A real exporter process (`python -m exporter`) watches a vLLM and a llama.cpp that drip their
pages (256 B every 50 ms, 16 B every 100 ms) and the Ollama simulator behind the proxy. Then, one
after another: client model names that grow labels (3,000 unknown names, 10 of 60,000 characters),
500 models loaded in Ollama, slowloris connections, and large unfinished request bodies. After each,
the exporter's resident memory is compared with its idle figure (goal: within 20%).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import requests

from bench.processes import python_module
from bench.proxy_overhead import free_port, wait_ready
from servescope.host.children import stop

BUDGET_S = 3.0  # the exporter's default per-engine timeout
GOAL_SCRAPE_S = BUDGET_S + 0.5
GOAL_RSS_RATIO = 1.2
PAGE = b"vllm:num_requests_running 1\n" * 2248  # about a vLLM page


class Dripper:
    """A listener answering every request with a 200 whose body comes `size` bytes every `every` s."""

    def __init__(self, size: int, every: float):
        self.size, self.every = size, every
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(PAGE))
                for start in range(0, len(PAGE), self.size):
                    if self.stop.wait(self.every):
                        return
                    conn.sendall(PAGE[start : start + self.size])
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def settled_rss(pid: int, seconds: float = 3.0) -> float:
    """The exporter's RSS once it stops falling (what it gives back after an attack), at most `seconds` later."""
    deadline, last = time.monotonic() + seconds, rss_mb(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = rss_mb(pid)
        if now >= last - 0.5:
            return now
        last = now
    return last


def scrape(url: str) -> tuple[float, int, bool]:
    """(seconds, page bytes, answered) of one GET /metrics as Prometheus makes it (4 s scrape timeout)."""
    started = time.monotonic()
    try:
        size = len(requests.get(url, timeout=4).content)
        return time.monotonic() - started, size, True
    except requests.RequestException:
        return time.monotonic() - started, 0, False


def scrapes(url: str, rounds: int, at_once: int) -> list[tuple[float, int, bool]]:
    results = []
    with ThreadPoolExecutor(at_once) as pool:
        for _ in range(rounds):
            results += list(pool.map(lambda _: scrape(url), range(at_once)))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.exporter_attacks", description=__doc__)
    parser.add_argument("--slowloris", type=int, default=600, help="slow connections (default 600)")
    parser.add_argument("--body-mib", type=int, default=60, help="MiB each of the 6 unfinished bodies sends")
    parser.add_argument("--quick", action="store_true", help="smaller attacks (200 slow connections, 20 MiB bodies)")
    args = parser.parse_args(argv)
    if args.quick:
        args.slowloris, args.body_mib = 200, 20
    vllm, llamacpp = Dripper(256, 0.05), Dripper(16, 0.1)
    sim_port, port, proxy_port = free_port(), free_port(), free_port()
    models = ["smollm2-135m"] + [f"m{i:03d}" for i in range(500)]
    model_flags = [flag for model in models for flag in ("--model", model)]
    sim = python_module(
        "tests.doubles.ollama_simulator",
        *("--port", sim_port, "--num-parallel", 8, "--token-delay", 0.001, "--load-delay", 0, *model_flags),
    )
    exporter = python_module(
        "exporter",
        *("--port", port, "--timeout", BUDGET_S, "--vllm-url", vllm.url, "--llamacpp-url", llamacpp.url),
        *("--ollama-url", f"http://127.0.0.1:{sim_port}", "--proxy-port", proxy_port),
    )
    metrics = f"http://127.0.0.1:{port}/metrics"
    proxy = f"http://127.0.0.1:{proxy_port}"
    rows: list[tuple[str, str, str, str]] = []
    try:
        wait_ready(f"http://127.0.0.1:{sim_port}/api/version", sim)
        wait_ready(f"http://127.0.0.1:{port}/", exporter)
        for _ in range(3):
            requests.post(f"{proxy}/api/chat", json={"model": "smollm2-135m", "messages": []}, timeout=10)
        warm = scrapes(metrics, 2, 1)
        idle = settled_rss(exporter.pid)
        print(f"  exporter idle: {idle:.1f} MB resident, /metrics {warm[-1][1]} bytes", flush=True)

        def row(attack: str, worst: float, page: int) -> None:
            after = settled_rss(exporter.pid, 10.0)
            verdict = "yes" if after <= idle * GOAL_RSS_RATIO else "NO"
            rows.append((attack, f"{worst:.2f} s", f"{page:,} B", f"{after:.1f} MB ({after / idle:.2f}x) {verdict}"))
            print(f"  {attack}: worst scrape {worst:.2f} s, page {page:,} B, RSS after {after:.1f} MB", flush=True)

        # 1. slow engines, Prometheus-like scrapes (4 at once, 4 s timeout)
        results = scrapes(metrics, 3, 4)
        answered = sum(ok for _, _, ok in results)
        print(f"  slow engines: {answered}/{len(results)} scrapes answered", flush=True)
        row("slow engines (dripping pages)", max(t for t, _, _ in results), max(s for _, s, _ in results))

        # 2. client model names: 3,000 unknown ones and 10 of 60,000 characters
        with requests.Session() as session:
            for name in [f"junk-{i}" for i in range(3000)] + ["x" * 60_000 + str(i) for i in range(10)]:
                session.post(f"{proxy}/api/chat", json={"model": name, "messages": []}, timeout=10)
        results = scrapes(metrics, 2, 1)
        row("3,010 client model names", max(t for t, _, _ in results), max(s for _, s, _ in results))

        # 3. 500 models loaded in Ollama (each asked for once, straight from the simulator)
        with requests.Session() as session:
            for model in models[1:]:
                session.post(
                    f"http://127.0.0.1:{sim_port}/api/generate",
                    json={"model": model, "prompt": "hi", "stream": False, "options": {"num_predict": 1}},
                    timeout=10,
                )
        results = scrapes(metrics, 2, 1)
        row("500 loaded models", max(t for t, _, _ in results), max(s for _, s, _ in results))

        # 4. slowloris: a byte every second on every connection, past the 30 s request deadline
        slow = []
        for _ in range(args.slowloris):
            try:
                slow.append(socket.create_connection(("127.0.0.1", proxy_port), 5))
            except OSError:
                break
        worst, page, started = 0.0, 0, time.monotonic()
        head = b"POST /api/chat HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
        for index in range(36):
            for sock in slow:
                try:
                    sock.send(head[index : index + 1])
                except OSError:
                    pass
            if index % 6 == 0:
                took, size, _ = scrape(metrics)
                worst, page = max(worst, took), max(page, size)
            time.sleep(max(0.0, started + index + 1 - time.monotonic()))
        still_open = len(psutil.Process(exporter.pid).net_connections(kind="tcp"))
        for sock in slow:
            sock.close()
        print(f"  slowloris: {len(slow)} connections; exporter sockets open after 36 s: {still_open}", flush=True)
        row(f"slowloris ({len(slow)} connections, 36 s)", worst, page)

        # 5. six unfinished request bodies
        body_socks, refused = [], 0
        chunk = b"x" * (1 << 20)
        for _ in range(6):
            sock = socket.create_connection(("127.0.0.1", proxy_port), 5)
            sock.sendall(b"POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (64 << 20))
            try:
                for _ in range(args.body_mib):
                    sock.sendall(chunk)
            except OSError:
                refused += 1
            body_socks.append(sock)
        peak = rss_mb(exporter.pid)
        took, size, _ = scrape(metrics)
        for sock in body_socks:
            sock.close()
        print(f"  bodies: 6 x {args.body_mib} MiB, {refused} cut off; RSS while held {peak:.1f} MB", flush=True)
        row(f"6 unfinished bodies of {args.body_mib} MiB", took, size)

        print(f"  goal: every scrape <= {GOAL_SCRAPE_S:.1f} s; RSS after each attack <= {GOAL_RSS_RATIO:.1f} x idle")
        print(f"  load average after measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print("  " + " | ".join(f"{h:<34}" if i == 0 else f"{h:>14}" for i, h in enumerate(HEADER)))
        for attack, worst_s, page_b, after in rows:
            print(f"  {attack:<34} | {worst_s:>14} | {page_b:>14} | {after}")
        return 0
    finally:
        stop(exporter, sim)
        vllm.close()
        llamacpp.close()


HEADER = ("attack", "worst scrape", "largest page", "RSS after (x idle), goal met")


if __name__ == "__main__":
    sys.exit(main())
