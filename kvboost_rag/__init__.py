"""kvboost-rag: reuse the KV cache of retrieved documents wherever they land in a prompt."""

from .config import EngineConfig, ExactnessConfig, RepairConfig, RetrievalConfig
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
from .store.memory import ChunkStore
from .store.settings import StoreSettingsError

__all__ = [
    "ChunkStore",
    "DecodeObserver",
    "EngineConfig",
    "ExactnessConfig",
    "RetrievalConfig",
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
