"""Response bodies and stream chunks in the OpenAI API's shapes."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict
from typing import Any

from ..engine import GenerationResult
from ..frameworks.usage import finish_reason, openai_usage, reuse_details


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def details(result: GenerationResult) -> dict[str, Any]:
    """Our timings and reuse figures, beside OpenAI's fields."""
    return {
        **reuse_details(result),
        "second_token_s": result.second_token_s,
        "recomputed_tokens": result.recomputed_tokens,
        "timings": asdict(result.timings),
    }


def chat_completion(request_id: str, model: str, result: GenerationResult) -> dict[str, Any]:
    message = {"role": "assistant", "content": result.text, "refusal": None}
    return _completion("chat.completion", request_id, model, result, {"message": message})


def text_completion(request_id: str, model: str, result: GenerationResult) -> dict[str, Any]:
    return _completion("text_completion", request_id, model, result, {"text": result.text})


def _completion(
    kind: str, request_id: str, model: str, result: GenerationResult, content: dict[str, Any]
) -> dict[str, Any]:
    choice = {"index": 0, **content, "logprobs": None, "finish_reason": finish_reason(result.finish_reason)}
    return {
        "id": request_id,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": openai_usage(result),
        "system_fingerprint": None,
        "kvboost": details(result),
    }


class ChunkWriter:
    """Server-sent events of one streamed answer, chat or completions."""

    def __init__(self, request_id: str, model: str, chat: bool) -> None:
        self.request_id, self.model, self.chat = request_id, model, chat
        self.created = int(time.time())

    def _event(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        body = {
            "id": self.request_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
            **extra,
        }
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    def _choice(self, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def start(self) -> str | None:
        """The role delta a chat stream opens with (completions have none)."""
        return self._event([self._choice("", None, role=True)]) if self.chat else None

    def delta(self, text: str) -> str:
        return self._event([self._choice(text, None)])

    def error(self, error: Any) -> str:
        """The event that ends a stream cut short (the server stopping), in OpenAI's error shape."""
        return f"data: {json.dumps(error.body())}\n\n"

    def finish(self, result: GenerationResult, include_usage: bool) -> list[str]:
        events = [self._event([self._choice(None if self.chat else "", finish_reason(result.finish_reason))])]
        if include_usage:
            events.append(self._event([], usage=openai_usage(result), kvboost=details(result)))
        events.append("data: [DONE]\n\n")
        return events
