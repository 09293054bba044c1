"""A request's fields as `KVBoostRAG.stream` takes them."""

from __future__ import annotations

from typing import Any

from ..config import ExactnessConfig
from .schemas import ChatCompletionRequest, CompletionRequest

# OpenAI's defaults where a request leaves a field out (chat: no limit but the context window,
# which the engine enforces; this keeps a forgotten limit from holding the model for minutes).
DEFAULT_TEMPERATURE = 1.0
DEFAULT_CHAT_TOKENS = 512


def stream_arguments(body: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    limit = body.token_limit
    ours = body.kvboost
    arguments: dict[str, Any] = {
        "max_new_tokens": limit if limit is not None else DEFAULT_CHAT_TOKENS,
        "temperature": DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "seed": body.seed,
        "stop": body.stop,
    }
    if ours is not None:
        if ours.top_k is not None:
            arguments["top_k"] = ours.top_k
        if ours.mode is not None:
            arguments["mode"] = ours.mode
        if ours.repair is not None:
            arguments["repair"] = ours.repair
        if ours.refresh:
            arguments["exactness"] = ExactnessConfig.exact_answer()
        if ours.store_prompt is not None:
            arguments["store_prompt"] = ours.store_prompt
        if ours.timeout_s is not None:
            arguments["timeout_s"] = float(ours.timeout_s)
    return arguments
