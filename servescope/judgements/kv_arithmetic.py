"""The reference page's section-3 KV arithmetic, once: blocks x block size = tokens; tokens / max-model-len = concurrency.

The exporter turns vLLM's vllm:cache_config_info into servescope_kv_cache_* series with it, the
native stack prints it at start-up, the report works the burst through it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

# vllm:cache_config_info carries every CacheConfig field as a label; these two give the pool.
BLOCK_SIZE_LABEL = "block_size"
BLOCKS_LABEL = "num_gpu_blocks"  # on the CPU backend too: these blocks live in VLLM_CPU_KVCACHE_SPACE


@dataclass(frozen=True)
class KvPool:
    """A paged KV pool: `blocks` blocks of `block_size` tokens."""

    block_size: float
    blocks: float

    @property
    def capacity_tokens(self) -> float:
        return capacity_tokens(self.blocks, self.block_size)

    def max_concurrency(self, max_model_len: float) -> float:
        return max_concurrency(self.capacity_tokens, max_model_len)


def pool_from_cache_config(labels: Mapping[str, str]) -> KvPool | None:
    """The pool of one vllm:cache_config_info sample; None before vLLM has profiled its memory (labels "None")."""
    try:
        return KvPool(float(labels[BLOCK_SIZE_LABEL]), float(labels[BLOCKS_LABEL]))
    except (KeyError, ValueError):
        return None


def capacity_tokens(blocks: float, block_size: float) -> float:
    """Tokens the pool holds: the reference page's 1456 blocks x 16 tokens = 23,296."""
    return blocks * block_size


def max_concurrency(capacity: float, max_model_len: float) -> float:
    """Sequences of the full max-model-len that fit at once: the reference page's 23,296 / 1,024 = 22.75x."""
    return capacity / max_model_len


def blocks_for(tokens: float, block_size: float) -> int:
    """Blocks one sequence of `tokens` occupies (a block is taken whole)."""
    return math.ceil(tokens / block_size)
