"""Response bodies and stream events in the OpenAI API's shapes: Chat Completions, Completions and
the Responses API."""

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

    def __init__(self, request_id: str, model: str, chat: bool, include_usage: bool = False) -> None:
        self.request_id, self.model, self.chat, self.include_usage = request_id, model, chat, include_usage
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

    def whole(self, result: GenerationResult) -> dict[str, Any]:
        """The answer not streamed: one body."""
        return (chat_completion if self.chat else text_completion)(self.request_id, self.model, result)

    def finish(self, result: GenerationResult) -> list[str]:
        events = [self._event([self._choice(None if self.chat else "", finish_reason(result.finish_reason))])]
        if self.include_usage:
            events.append(self._event([], usage=openai_usage(result), kvboost=details(result)))
        events.append("data: [DONE]\n\n")
        return events


def responses_usage(result: GenerationResult) -> dict[str, Any]:
    """The Responses API's usage; cached_tokens counts the prompt tokens served from reused KV."""
    return {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {"cached_tokens": result.reused_tokens},
        "output_tokens": result.new_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": result.prompt_tokens + result.new_tokens,
    }


class ResponseWriter:
    """A Responses API answer: the response object, and the events that stream it."""

    def __init__(self, response_id: str, model: str, settings: dict[str, Any]) -> None:
        self.response_id, self.model, self.settings = response_id, model, settings
        self.message_id = new_id("msg")
        self.created = int(time.time())
        self.text, self._sequence = "", 0

    def response(self, result: GenerationResult | None = None) -> dict[str, Any]:
        """The response object: in progress, or with its output and usage once `result` is known."""
        incomplete = result is not None and result.finish_reason in ("length", "timeout")
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created,
            "status": "in_progress" if result is None else "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "error": None,
            "model": self.model,
            "output": [self._message("completed")] if result else [],
            "parallel_tool_calls": False,
            "tool_choice": "none",
            "tools": [],
            **self.settings,
            "usage": responses_usage(result) if result else None,
            "kvboost": details(result) if result else None,
        }

    def _message(self, status: str) -> dict[str, Any]:
        return {
            "type": "message",
            "id": self.message_id,
            "status": status,
            "role": "assistant",
            "content": [self._part()],
        }

    def _part(self) -> dict[str, Any]:
        return {"type": "output_text", "text": self.text, "annotations": []}

    def _event(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    def start(self) -> str:
        """The events that open the stream: the response created and in progress, its message."""
        self.text = ""
        created = self.response()
        item = {**self._message("in_progress"), "content": []}
        return (
            self._event("response.created", response=created)
            + self._event("response.in_progress", response=created)
            + self._event("response.output_item.added", output_index=0, item=item)
            + self._event(
                "response.content_part.added",
                item_id=self.message_id,
                output_index=0,
                content_index=0,
                part=self._part(),
            )
        )

    def delta(self, text: str) -> str:
        self.text += text
        return self._event(
            "response.output_text.delta",
            item_id=self.message_id,
            output_index=0,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def finish(self, result: GenerationResult) -> list[str]:
        self.text = result.text
        done = self.response(result)
        kind = "response.completed" if done["status"] == "completed" else "response.incomplete"
        return [
            self._event(
                "response.output_text.done",
                item_id=self.message_id,
                output_index=0,
                content_index=0,
                text=self.text,
                logprobs=[],
            ),
            self._event(
                "response.content_part.done",
                item_id=self.message_id,
                output_index=0,
                content_index=0,
                part=self._part(),
            ),
            self._event("response.output_item.done", output_index=0, item=self._message("completed")),
            self._event(kind, response=done),
        ]

    def error(self, error: Any) -> str:
        """The event that ends a stream cut short (the server stopping), in OpenAI's error shape."""
        return self._event("error", **error.body()["error"])

    def whole(self, result: GenerationResult) -> dict[str, Any]:
        self.text = result.text
        return self.response(result)
