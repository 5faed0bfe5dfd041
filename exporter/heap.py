"""The C heap's free pages handed back to the system after a large body was let go (glibc's malloc_trim).

Large bodies (a request the proxy relays, an engine's metrics page) grow the heap; freed, their pages stay
with the process unless trimmed, since glibc raises its mmap threshold after freeing a large block and
serves the next one from the heap: after a few large bodies the exporter's resident memory stays near its
peak (bench/exporter_attacks.py measures it after each attack).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

# A body at least this large, once let go, makes its reader hand free heap memory back to the system.
LARGE_BODY_BYTES = 1024 * 1024


def _heap_trimmer() -> Callable[[int], object] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; elsewhere freed memory goes back by itself, or cannot
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _heap_trimmer()


def give_back_memory() -> None:
    """Return the C heap's free pages to the system, where the C library can (a few milliseconds)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
