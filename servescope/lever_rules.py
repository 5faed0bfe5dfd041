"""The "which lever" alert rules, generated from the threshold table (servescope/thresholds.py) the report's verdict reads.

python -m servescope.lever_rules --write   # regenerate prometheus/rules/{vllm_levers,llamacpp,ollama}.yml
python -m servescope.lever_rules --check   # exit 1 when a committed file is stale
"""

from __future__ import annotations

import argparse
import sys

import yaml

from servescope import series, thresholds
from servescope.knobs import REPO_ROOT
from servescope.prometheus_config import RULES_DIR

W, F = thresholds.ALERT_WINDOW, thresholds.ALERT_FOR
# A queue that never drained over the window, then held for `for:`: how long the texts say it lasted.
LASTED = f"{thresholds.minutes(W) + thresholds.minutes(F)} minutes"


def _waiting(engine: str) -> str:
    """A queue that never drained over the window: a queue that comes and goes between bursts is batching working."""
    return f'min_over_time({series.REQUESTS_WAITING}{{engine="{engine}"}}[{W}]) > 0'


def _alert(name: str, expr: str, lever: str, summary: str, description: str) -> dict:
    return {
        "alert": name,
        "expr": expr,
        "for": F,
        "labels": {"severity": "warning", "lever": lever},
        "annotations": {"summary": summary, "description": " ".join(description.split())},
    }


def vllm_levers() -> dict:
    """The seed's section 4: waiting with KV room -> --max-num-seqs; waiting on a full pool -> KV space (disjoint)."""
    kv = f'{series.KV_CACHE_USAGE}{{engine="vllm"}}[{W}]'
    room, full = thresholds.KV_ROOM, thresholds.KV_FULL
    return {
        "groups": [
            {
                "name": "vllm-kv-cache-levers",
                "rules": [
                    _alert(
                        "VllmQueueWithKvCacheToSpare",
                        f"{_waiting('vllm')}\nand on (engine, instance)\nmax_over_time({kv}) < {room:g}",
                        "max-num-seqs",
                        "vLLM {{ $labels.instance }}: requests queue while the KV cache has room: raise max-num-seqs",
                        f"""vLLM {{{{ $labels.instance }}}} has had at least {{{{ $value }}}} request(s) waiting for
                        over {LASTED} while its KV cache stayed below {room:.0%} full, so the running batch is capped by
                        --max-num-seqs, not by memory. Raise VLLM_MAX_NUM_SEQS in .env and restart vLLM; check the vLLM
                        dashboard's max concurrency first, since every extra sequence needs its own KV blocks.""",
                    ),
                    # On the CPU backend --swap-space adds zero blocks (the seed's section 3): never the lever.
                    _alert(
                        "VllmQueueWithKvCacheFull",
                        f"{_waiting('vllm')}\nand on (engine, instance)\navg_over_time({kv}) >= {full:g}",
                        "kv-cache-space",
                        "vLLM {{ $labels.instance }}: requests queue on a full KV cache: "
                        "raise VLLM_CPU_KVCACHE_SPACE or lower --max-model-len",
                        f"""vLLM {{{{ $labels.instance }}}} has had at least {{{{ $value }}}} request(s) waiting for
                        over {LASTED} with its KV cache at {full:.0%} or more, so requests wait for KV blocks. Raise
                        VLLM_CPU_KVCACHE_SPACE (within the container's memory limit) or lower VLLM_MAX_MODEL_LEN in
                        .env. Not --swap-space: on the CPU backend it adds no KV blocks. Raising max-num-seqs would
                        only queue more on memory.""",
                    ),
                ],
            }
        ]
    }


def llamacpp_levers() -> dict:
    """llama.cpp defers a request only when no slot is idle: the lever is always --parallel (its context split with it)."""
    return {
        "groups": [
            {
                "name": "llamacpp-slots",
                "rules": [
                    _alert(
                        "LlamacppRequestsDeferred",
                        _waiting("llamacpp"),
                        "parallel-slots",
                        "llama.cpp {{ $labels.instance }}: requests wait for a free slot: raise --parallel",
                        f"""llama.cpp {{{{ $labels.instance }}}} has had at least {{{{ $value }}}} request(s) deferred
                        for over {LASTED}: every slot is busy. Raise LLAMACPP_PARALLEL (-np) in .env; the context (-c)
                        is split across slots, so raise LLAMACPP_CTX with it to keep each slot's context.""",
                    )
                ],
            }
        ]
    }


def ollama_levers() -> dict:
    """Ollama reports no queue; its own durations do: the time it held a request outside the model is a wait for a slot.

    Read from what the exporter's proxy saw (servescope_proxy_queue_seconds: total_duration - load_duration -
    prompt_eval_duration - eval_duration of each request it relayed), the same rule as the report's TTFT split
    and its threshold; never from requests in flight against OLLAMA_NUM_PARALLEL, which would be the knob's own
    assumption read back as a measurement.
    """
    queue = series.PROXY_QUEUE_SECONDS
    least = thresholds.TTFT_QUEUED_MIN_S
    return {
        "groups": [
            {
                "name": "ollama-concurrency",
                "rules": [
                    _alert(
                        "OllamaRequestsQueued",
                        f"sum by (engine, instance) (rate({queue}_sum[{W}]))\n"
                        f"/ (sum by (engine, instance) (rate({queue}_count[{W}])) > 0)\n"
                        f">= {least:g}",
                        "ollama-num-parallel",
                        "Ollama {{ $labels.instance }}: requests wait inside Ollama for a parallel slot: "
                        "raise OLLAMA_NUM_PARALLEL",
                        f"""For over {LASTED} the requests relayed to Ollama {{{{ $labels.instance }}}} through the
                        exporter's proxy spent on average {{{{ $value | humanizeDuration }}}} inside Ollama outside
                        loading the model, evaluating the prompt and generating (its own total_duration minus
                        load_duration, prompt_eval_duration and eval_duration; {least * 1000:g} ms or more counts as a
                        wait): they queued for one of its OLLAMA_NUM_PARALLEL slots, and the wait is part of their
                        TTFT. Raise OLLAMA_NUM_PARALLEL in .env (each parallel slot multiplies the context memory of
                        the loaded model) or send fewer concurrent requests.""",
                    )
                ],
            }
        ]
    }


FILES = {
    RULES_DIR / "vllm_levers.yml": vllm_levers,
    RULES_DIR / "llamacpp.yml": llamacpp_levers,
    RULES_DIR / "ollama.yml": ollama_levers,
}
HEADER = (
    "# GENERATED by `python -m servescope.lever_rules --write` from servescope/thresholds.py (the table the\n"
    "# report's verdict reads). Do not edit: change the table or servescope/lever_rules.py.\n"
)


class _Dumper(yaml.SafeDumper):
    """Multi-line PromQL as a literal block, the way a person writes a rule file."""


_Dumper.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None),
)


def rendered() -> dict:
    return {
        path: HEADER + yaml.dump(build(), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=110)
        for path, build in FILES.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servescope.lever_rules", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write the rule files (default)")
    mode.add_argument("--check", action="store_true", help="exit 1 when a committed rule file differs from the table")
    args = parser.parse_args(argv)
    files = rendered()
    if args.check:
        stale = [p for p, text in files.items() if not p.exists() or p.read_text() != text]
        for path in stale:
            print(
                f"{path.relative_to(REPO_ROOT)} is stale: run `python -m servescope.lever_rules --write`",
                file=sys.stderr,
            )
        if stale:
            return 1
        print(f"lever rules up to date ({len(files)} files)")
        return 0
    for path, text in files.items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
