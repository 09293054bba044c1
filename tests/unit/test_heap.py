"""The server gives freed memory back: glibc held to 2 arenas and trimmed from one daemon thread."""

from __future__ import annotations

import platform
import threading

import pytest

from kvboost_rag import heap


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt and malloc_trim")
def test_release_starts_one_trimming_thread_a_process() -> None:
    assert heap.release_freed_memory(every_s=0.05) and heap.release_freed_memory()
    trimming = [t for t in threading.enumerate() if t.name == "kvboost-heap-trim"]
    assert len(trimming) == 1 and trimming[0].daemon and trimming[0].is_alive()
