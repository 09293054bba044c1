"""kvboost-rag: reuse the KV cache of retrieved documents wherever they land in a prompt."""

from .chunk_store import ChunkStore
from .config import EngineConfig
from .engine import GenerationStream, KVBoostRAG, PromptTooLongError
from .model_support import UnsupportedModelError
from .result import GenerationResult, StageTimings, WarmReport
from .sampling import SamplingParams

__all__ = [
    "ChunkStore",
    "EngineConfig",
    "GenerationResult",
    "GenerationStream",
    "KVBoostRAG",
    "PromptTooLongError",
    "SamplingParams",
    "StageTimings",
    "UnsupportedModelError",
    "WarmReport",
]
__version__ = "0.1.0"
