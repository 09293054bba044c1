"""Freed memory back to the system, for a long-running process such as `kvboost-rag serve`.

glibc's malloc keeps what a process frees for its next allocations, in one arena per thread
that contended (up to 8 a core): a server that keeps replacing mid-sized tensors (each running
request's cache, the memory tier's chunks, a prefill's activations, from ~100 KB to a few MB)
grows far past what it holds. Measured on the server (8 streaming clients, 160 requests, a 0.5 GiB
memory tier; `benchmarks/bench_memory_under_load.py`): RSS 3.19 GiB as glibc leaves it; 2.78 with
2 arenas; 2.21 with 2 arenas and a trim a second, at the same speed (90 s against 90 s); 2.11 with
every allocation past 128 KB mapped on its own, but 1.6x slower. So: 2 arenas and a trim a second.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)
ARENAS = 2
TRIM_EVERY_S = 1.0

_started = False
_lock = threading.Lock()


def _glibc() -> Any | None:
    """The process's C library where it is glibc (mallopt, malloc_trim), else None."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def release_freed_memory(every_s: float = TRIM_EVERY_S) -> bool:
    """Hold malloc to `ARENAS` arenas and give free heap pages back every `every_s` seconds, from a
    daemon thread; once a process. Call it before the model loads (arenas are made as threads
    first contend). False where the C library is not glibc (nothing to do)."""
    global _started
    libc = _glibc()
    if libc is None:
        return False
    with _lock:
        if _started:
            return True
        _started = True
    libc.mallopt(M_ARENA_MAX, ARENAS)

    def trim() -> None:
        while True:
            time.sleep(every_s)
            libc.malloc_trim(0)

    threading.Thread(target=trim, name="kvboost-heap-trim", daemon=True).start()
    return True
