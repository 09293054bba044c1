"""kvboost-rag: reuse the KV cache of retrieved documents wherever they land in a prompt."""

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
