"""Other load testers against the synthetic server, each from its own venv: the command that sends the same traffic,
and its per-request stamps read back under servescope's definitions (TTFT to the first content chunk, ITL every gap
between content chunks)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from servescope.contracts import knobs

CACHE = knobs.path("SERVESCOPE_CACHE")
TOKENIZER = CACHE / "models" / "smollm2-135m-instruct-f32"  # the bench's model's tokenizer, local (no hub here)
RESULT = "result"  # the file or folder name each peer writes its result under, inside the run's own folder


@dataclass(frozen=True)
class Stamps:
    """A peer's run read back: requests it completed, and each one's TTFT and content gaps (seconds)."""

    completed: int
    ttfts: list[float]
    itls: list[float]


@dataclass(frozen=True)
class Peer:
    """A load tester in its own venv: the command that sends the bench's traffic, and its stamps read back."""

    name: str  # as the table prints it
    venv: str  # its venv under SERVESCOPE_CACHE
    requirement: str  # what `make peers` installs into it: the version the bench's figures were measured with
    note: str  # how its stamps were read, printed under the table

    @property
    def program(self) -> Path:
        return CACHE / self.venv / "bin" / self.venv.removeprefix("venv-")

    def available(self) -> bool:
        return not self.missing()

    def missing(self) -> str:
        """What this peer still needs before the bench can run it, in a few words ('' when nothing)."""
        if not self.program.exists():
            return "not installed"
        if not (TOKENIZER / "tokenizer.json").exists():
            return f"installed; the model's tokenizer is not ({TOKENIZER}: `make up` fetches it)"
        return ""

    def command(self, url: str, concurrency: int, requests: int, tokens: int, out: Path) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def stamps(self, out: Path) -> Stamps:
        raise NotImplementedError


class Servebench(Peer):
    def command(self, url: str, concurrency: int, requests: int, tokens: int, out: Path) -> list[str]:
        return [
            str(self.program), "run", "--url", f"{url}/v1", "--model", "synthetic/model", "--concurrency",
            str(concurrency), "--num-requests", str(requests), "--input-len", "16", "--output-len", str(tokens),
            "--warmup", "0", "--no-gpu", "--out", str(out / f"{RESULT}.json"),
        ]  # fmt: skip

    def stamps(self, out: Path) -> Stamps:
        """run.json's requests: `ttft` and `chunk_times` (each content chunk's time from the request's start)."""
        doc = json.loads((out / f"{RESULT}.json").read_text())
        ttfts, itls, completed = [], [], 0
        for level in doc.get("levels", []):
            for r in level.get("requests", []):
                times = r.get("chunk_times") or []
                if not r.get("ok") or r.get("ttft") is None or not times:
                    continue
                completed += 1
                ttfts.append(float(r["ttft"]))
                itls.extend(b - a for a, b in zip(times, times[1:], strict=False))
        return Stamps(completed, ttfts, itls)


class Aiperf(Peer):
    def command(self, url: str, concurrency: int, requests: int, tokens: int, out: Path) -> list[str]:
        return [
            str(self.program), "profile", "--model", "synthetic/model", "--url", url, "--endpoint-type", "chat",
            "--streaming", "--concurrency", str(concurrency), "--request-count", str(requests),
            "--synthetic-input-tokens-mean", "16", "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean",
            str(tokens), "--output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true", "--tokenizer",
            str(TOKENIZER), "--artifact-dir", str(out / RESULT), "--ui-type", "none", "--export-level", "records",
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        # AIPerf 0.13 reads a local tokenizer directory only with the hub's offline switches unset.
        return {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}

    def stamps(self, out: Path) -> Stamps:
        """profile_export.jsonl's records: `time_to_first_token` (to the first content response) and
        `inter_chunk_latency` (the gaps between content responses), both in ms."""
        ttfts, itls, completed = [], [], 0
        with open(out / RESULT / "profile_export.jsonl", encoding="utf-8") as lines:
            for line in filter(str.strip, lines):
                record = json.loads(line)
                metrics = record.get("metrics") or {}
                ttft = (metrics.get("time_to_first_token") or {}).get("value")
                gaps = (metrics.get("inter_chunk_latency") or {}).get("value") or []
                if record.get("error") or ttft is None:
                    continue  # a failed request (a stream cut after its first chunk keeps its TTFT, and its error)
                completed += 1
                ttfts.append(float(ttft) / 1000)
                itls.extend(float(g) / 1000 for g in gaps)
        return Stamps(completed, ttfts, itls)


SERVEBENCH = Servebench(
    "servebench run",
    "venv-servebench",
    "servebench==1.1.3",
    "servebench: its run.json's per-request ttft (first content chunk) and chunk_times (the gaps between them)",
)
AIPERF = Aiperf(
    "aiperf profile",
    "venv-aiperf",
    "aiperf==0.13.0",
    "aiperf: its profile_export.jsonl's per-request time_to_first_token (first content response) and "
    "inter_chunk_latency (the gaps between content responses); its token counts come from its own tokenizer",
)
PEERS = (SERVEBENCH, AIPERF)


def install(peer: Peer) -> int:
    """The peer's venv made and its pinned version installed from PyPI (pip's output kept in the venv); 0 when done."""
    venv = CACHE / peer.venv
    log = CACHE / f"{peer.venv}-install.log"
    started = time.monotonic()
    print(f"peers: {peer.requirement} into {venv} (pip's output: {log})", flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        for step in (
            [sys.executable, "-m", "venv", str(venv)],
            [str(venv / "bin" / "pip"), "install", peer.requirement],
        ):
            rc = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT).returncode
            if rc != 0:
                print(f"peers: {peer.requirement} not installed: `{' '.join(step[:3])}` exited {rc} (see {log})")
                return rc
    print(f"peers: {peer.requirement} ready ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


def cli(argv: list[str] | None = None) -> int:
    """`python -m bench.peers [--install]` (not `main`: `make bench` runs every module's main as a benchmark)."""
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    parser.add_argument("--install", action="store_true", help="install every missing peer into its venv")
    args = parser.parse_args(argv)
    for peer in PEERS:
        if args.install and not peer.available():
            if install(peer):
                return 1
        print(f"{peer.name:<16} {peer.program}: {peer.missing() or 'ready'}")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
