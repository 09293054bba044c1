"""A request's fields as `KVBoostRAG.stream` takes them."""

from __future__ import annotations

from typing import Any

from ..config import ExactnessConfig
from ..options import stream_options
from .schemas import ChatCompletionRequest, CompletionRequest

# OpenAI's defaults where a request leaves a field out (chat: no limit but the context window,
# which the engine enforces; this keeps a forgotten limit from holding the model for minutes).
DEFAULT_TEMPERATURE = 1.0
DEFAULT_CHAT_TOKENS = 512


def stream_arguments(body: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    """OpenAI's fields and ours (`kvboost`), the option table's defaults beneath but OpenAI's own
    for the temperature and the token limit. A bad value is the engine's ValueError."""
    ours: dict[str, Any] = body.kvboost.model_dump(exclude_none=True) if body.kvboost is not None else {}
    refresh = ours.pop("refresh", False)
    limit = body.token_limit
    openai = {
        "max_tokens": DEFAULT_CHAT_TOKENS if limit is None else limit,
        "temperature": DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
        "top_p": body.top_p,
        "seed": body.seed,
        "stop": body.stop,
    }
    arguments = stream_options({}, {**openai, **ours})
    if refresh:
        arguments["exactness"] = ExactnessConfig.exact_answer()
    return arguments
