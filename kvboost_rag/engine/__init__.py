"""The engine: the facade, warming, one request's state, prefill strategies and the decode loop."""

from .decode import DecodeObserver
from .engine import KVBoostRAG
from .prompts import Prompt, PromptTooLongError
from .request import Request
from .result import GenerationResult, StageTimings, WarmReport
from .sampling import SamplingParams
from .stream import GenerationStream

__all__ = [
    "DecodeObserver",
    "GenerationResult",
    "GenerationStream",
    "KVBoostRAG",
    "Prompt",
    "PromptTooLongError",
    "Request",
    "SamplingParams",
    "StageTimings",
    "WarmReport",
]
