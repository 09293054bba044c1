"""The engine: the facade, warming, one request's state, prefill strategies and the decode loop.

The names below are imported on first use (`kvboost_rag/lazy.py`), so the torch-free modules
(`inputs`, `sampling`) can be imported without the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
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
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "DecodeObserver": ".decode",
        "KVBoostRAG": ".engine",
        "Prompt": ".prompts",
        "PromptTooLongError": ".prompts",
        "Request": ".request",
        "GenerationResult": ".result",
        "StageTimings": ".result",
        "WarmReport": ".result",
        "SamplingParams": ".sampling",
        "GenerationStream": ".stream",
    },
)
