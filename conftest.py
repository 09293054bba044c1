"""What the core's and both framework packages' tests share."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest


def warm_in_another_process(passages: list[str], root: Path, store: str | None = None) -> str:
    """Each passage as a .txt file, warmed by `kvboost-rag warm` (a subprocess, as a user runs it)
    into `store` (a directory, a Redis URL or both; default: a fresh directory under `root`);
    the store's location."""
    documents, store = root / "documents", store or str(root / "store")
    documents.mkdir()
    for i, passage in enumerate(passages):
        (documents / f"{i}.txt").write_text(passage, encoding="utf-8")
    command = [sys.executable, "-m", "kvboost_rag.cli", "warm", str(documents), "--store", store]
    done = subprocess.run([*command, "--dtype", "float32"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"{len(passages)} warmed" in done.stdout
    return store


@pytest.fixture()
def warm_with_cli() -> Callable[..., str]:
    return warm_in_another_process
