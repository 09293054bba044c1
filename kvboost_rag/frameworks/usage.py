"""Usage and finish reason as OpenAI reports them: the shape every framework's users look for.

Both framework packages build theirs from these, and an OpenAI-compatible server can reuse them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..engine import GenerationResult

# The engine tells EOS from a stop string and the token limit from the timeout; OpenAI does not.
_OPENAI_FINISH = {"eos": "stop", "stop": "stop", "length": "length", "timeout": "length"}


def finish_reason(reason: str) -> str:
    """OpenAI's finish_reason: "stop" (EOS or a stop string) or "length" (max tokens, timeout)."""
    try:
        return _OPENAI_FINISH[reason]
    except KeyError:
        raise ValueError(f"unknown finish reason {reason!r}") from None


def openai_usage(result: GenerationResult) -> dict[str, Any]:
    """OpenAI's usage object; cached_tokens counts the prompt tokens served from reused KV."""
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.new_tokens,
        "total_tokens": result.prompt_tokens + result.new_tokens,
        "prompt_tokens_details": {"cached_tokens": result.reused_tokens},
    }


def sum_usage(usages: Iterable[Mapping[str, Any] | None]) -> dict[str, Any]:
    """Usage objects added up, for a batch of calls (None, a call without usage, counts 0)."""
    total = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    cached = 0
    for usage in usages:
        if not usage:
            continue
        for key in total:
            total[key] += usage.get(key, 0)
        cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {**total, "prompt_tokens_details": {"cached_tokens": cached}}


def reuse_details(result: GenerationResult) -> dict[str, Any]:
    """What kvboost adds beside the usage: how the prompt was served, how soon, and why it ended."""
    return {
        "engine_finish_reason": result.finish_reason,
        "ttft_s": result.ttft_s,
        "total_s": result.total_s,
        "reuse_share": result.reuse_share,
        "reused_exact_tokens": result.reused_exact_tokens,
        "reused_approximate_tokens": result.reused_approximate_tokens,
        "computed_tokens": result.computed_tokens,
        "repair_tokens": result.repair_tokens,
    }
