"""The memory of an engine's process tree, counted once: the proportional set size (PSS) of each process, summed.

Why PSS and not RSS: an engine is several processes sharing pages (vLLM's API server, engine core
and workers map the same torch libraries; forked workers share their parent's pages copy-on-write).
RSS counts a shared page in full in every process that maps it, so a sum of RSS over the tree
counts it once per process; PSS charges each process 1/N of a page N processes share, so the sum
counts every page once: the memory the engine really holds, comparable with a container's.

PSS comes from /proc/<pid>/smaps_rollup (Linux 4.14+), which needs the same user (or root) and
costs a walk of the process's page tables (about a millisecond per GiB mapped). Where the kernel
does not give it (another OS, a process of another user), that process's RSS stands in.
"""

from __future__ import annotations

from collections.abc import Iterable

import psutil


def process_memory(proc: psutil.Process) -> int:
    """PSS of one process in bytes (RSS where PSS cannot be read); psutil.NoSuchProcess when it is gone."""
    try:
        return proc.memory_full_info().pss
    except (AttributeError, psutil.AccessDenied):  # AttributeError: no `pss` outside Linux
        return proc.memory_info().rss


def processes_memory(processes: Iterable[psutil.Process]) -> int:
    """PSS summed over processes; one that exits meanwhile counts nothing."""
    total = 0
    for proc in processes:
        try:
            total += process_memory(proc)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return total


def tree_memory(proc: psutil.Process) -> int:
    """PSS of a process and all its descendants (an engine and its workers), each page counted once."""
    try:
        members = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    return processes_memory(members)
