"""kvboost-rag: reuse the KV cache of retrieved documents wherever they land in a prompt.

The names below are imported on first use (`lazy.py`): `import kvboost_rag` and the command line
start without torch and transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_exports

if TYPE_CHECKING:
    from .config import EngineConfig, ExactnessConfig, RepairConfig, SparseDecodeConfig
    from .engine import (
        DecodeObserver,
        GenerationResult,
        GenerationStream,
        KVBoostRAG,
        PromptTooLongError,
        SamplingParams,
        StageTimings,
        WarmReport,
    )
    from .hf.support import UnsupportedModelError
    from .store.chunk_store import ChunkStore
    from .store.settings import StoreSettingsError

__all__ = [
    "ChunkStore",
    "DecodeObserver",
    "EngineConfig",
    "ExactnessConfig",
    "SparseDecodeConfig",
    "GenerationResult",
    "GenerationStream",
    "KVBoostRAG",
    "PromptTooLongError",
    "RepairConfig",
    "SamplingParams",
    "StageTimings",
    "StoreSettingsError",
    "UnsupportedModelError",
    "WarmReport",
]
__version__ = "0.1.0"

_CONFIG = ("EngineConfig", "ExactnessConfig", "RepairConfig", "SparseDecodeConfig")
_ENGINE = (
    "DecodeObserver",
    "GenerationResult",
    "GenerationStream",
    "KVBoostRAG",
    "PromptTooLongError",
    "SamplingParams",
    "StageTimings",
    "WarmReport",
)
__getattr__, __dir__ = lazy_exports(
    __name__,
    {name: ".config" for name in _CONFIG}
    | {name: ".engine" for name in _ENGINE}
    | {
        "UnsupportedModelError": ".hf.support",
        "ChunkStore": ".store.chunk_store",
        "StoreSettingsError": ".store.settings",
    },
)
