"""Where kvboost-rag keeps files: one root in the user cache directory, shared by every entry point."""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_cache_dir

CACHE_DIR_ENV = "KVBOOST_RAG_CACHE_DIR"


def cache_dir() -> Path:
    """Root of everything kvboost-rag keeps on disk; override with KVBOOST_RAG_CACHE_DIR."""
    return Path(os.environ.get(CACHE_DIR_ENV) or user_cache_dir("kvboost-rag"))


def default_store_dir() -> Path:
    """The chunk store that the CLI, the engine and both framework packages use by default."""
    return cache_dir() / "chunks"
