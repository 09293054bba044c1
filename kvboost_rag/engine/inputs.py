"""Checks of what callers pass in, in one place, run before any model work.

Each failure is a `TypeError` (wrong kind of value) or a `ValueError` (right kind, bad value)
that names the argument, so odd input never reaches the tokenizer, the chat template or the
model as a raw error from deep inside them, and is never silently read as something else.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from numbers import Integral, Real
from typing import Any

Messages = list[dict[str, str]]
SEED_RANGE = (-(2**63), 2**64)  # what torch.Generator.manual_seed takes


def _kind(value: Any) -> str:
    return type(value).__name__


def check_text(text: str, name: str) -> str:
    """Text the tokenizer can take: encodable as UTF-8 (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"{name} is not valid Unicode: {text[error.start]!r} at position {error.start} "
            "is a lone surrogate (decode the source with errors='replace' or fix it)"
        ) from None
    return text


def can_be_neighbour(text: str) -> bool:
    """Whether a text can stand before another when warming: not blank, and text the tokenizer
    (and the embedder that finds neighbours) can take. Warming the text itself reports why not."""
    try:
        return bool(check_text(text, "text").strip())
    except ValueError:
        return False


def check_groups(groups: Any) -> list[list[str]]:
    """`warm_together`'s argument: an iterable of groups, each one `check_documents` takes (a lone
    text is a group of one), every text checked before any is warmed."""
    if isinstance(groups, (str, bytes, bytearray, Mapping)) or not isinstance(groups, Iterable):
        raise TypeError(f"groups must be an iterable of lists of texts, got {_kind(groups)}")
    return [check_documents(group) for group in groups]


def check_prompt(prompt: Any) -> str | Messages:
    """A non-empty str, or a non-empty list/tuple of {'role': str, 'content': str} messages."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("prompt is empty")
        return check_text(prompt, "prompt")
    if not isinstance(prompt, (list, tuple)):
        raise TypeError(f"prompt must be a str or a list of chat messages, got {_kind(prompt)}")
    if not prompt:
        raise ValueError("chat prompt must be a non-empty list of {'role': ..., 'content': ...} messages")
    messages: Messages = []
    for i, message in enumerate(prompt):
        if not isinstance(message, Mapping):
            raise TypeError(f"prompt messages[{i}] must be a dict with 'role' and 'content', got {_kind(message)}")
        for key in ("role", "content"):
            if key not in message:
                raise ValueError(f"chat prompt messages[{i}] lacks {key!r}")
            if not isinstance(message[key], str):
                raise TypeError(f"prompt messages[{i}].{key} must be a str, got {_kind(message[key])}")
            check_text(message[key], f"prompt messages[{i}].{key}")
        messages.append(dict(message))
    return messages


def check_document(index: int, text: Any) -> str:
    """One document to warm: a str of valid Unicode."""
    if not isinstance(text, str):
        hint = " (decode it first)" if isinstance(text, (bytes, bytearray)) else ""
        raise TypeError(f"document {index} (documents[{index}]) is a {_kind(text)}, expected str{hint}")
    return check_text(text, f"document {index} (documents[{index}])")


def check_documents(documents: Any) -> list[str]:
    """`warm`'s argument: one str or an iterable of str, every one checked before any is warmed.

    A mapping or bytes is refused whole rather than iterated (over its keys, or its byte values).
    """
    if isinstance(documents, str):
        return [check_document(0, documents)]
    if isinstance(documents, (bytes, bytearray, Mapping)) or not isinstance(documents, Iterable):
        hint = " (decode it first)" if isinstance(documents, (bytes, bytearray)) else ""
        hint = " (pass its text, e.g. documents=[record['text']])" if isinstance(documents, Mapping) else hint
        raise TypeError(f"documents must be a str or an iterable of str, got {_kind(documents)}{hint}")
    return [check_document(i, text) for i, text in enumerate(documents)]


# sampling ---------------------------------------------------------------------------------
def check_int(value: Any, name: str, minimum: int) -> int:
    """An integer (numpy ones too, bool not) >= minimum."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an integer, got {_kind(value)} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_real(value: Any, name: str) -> float:
    """A real number (bool not): the range is the caller's to check."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {_kind(value)} {value!r}")
    return float(value)


def check_temperature(value: Any) -> float:
    """Finite and >= 0: inf would sample uniformly, NaN nothing sensible."""
    temperature = check_real(value, "temperature")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be finite and >= 0, got {value!r}")
    return temperature


def check_top_p(value: Any) -> float:
    top_p = check_real(value, "top_p")
    if not 0 < top_p <= 1:  # also catches NaN
        raise ValueError(f"top_p must be in (0, 1], got {value!r}")
    return top_p


def check_min_p(value: Any) -> float:
    min_p = check_real(value, "min_p")
    if not 0 <= min_p <= 1:  # also catches NaN
        raise ValueError(f"min_p must be in [0, 1], got {value!r}")
    return min_p


def check_repetition_penalty(value: Any) -> float:
    """Finite and > 0: it divides (or multiplies) logits, so 0 or inf would wipe them out."""
    penalty = check_real(value, "repetition_penalty")
    if not (math.isfinite(penalty) and penalty > 0):
        raise ValueError(f"repetition_penalty must be finite and > 0, got {value!r}")
    return penalty


def check_seed(value: Any) -> int | None:
    """None or an integer torch can seed with; checked here, not when the decode starts."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"seed must be an integer or None, got {_kind(value)} {value!r}")
    seed = int(value)
    if not SEED_RANGE[0] <= seed < SEED_RANGE[1]:
        raise ValueError(f"seed must be in [-2**63, 2**64), got {value!r}")
    return seed


def check_stop(value: Any) -> list[str]:
    """None, a non-empty str, or a list/tuple of non-empty str: "" would silently mean no stop."""
    if value is None:
        return []
    stops: Sequence[Any] = [value] if isinstance(value, str) else value
    if not isinstance(stops, (list, tuple)):
        raise TypeError(f"stop must be a str or a list of str, got {_kind(value)}")
    for i, stop in enumerate(stops):
        name = "stop" if isinstance(value, str) else f"stop[{i}]"
        if not isinstance(stop, str):
            raise TypeError(f"{name} must be a str, got {_kind(stop)}")
        if not stop:
            raise ValueError(f"{name} is an empty string: stop strings must be non-empty (None means no stop)")
        check_text(stop, name)
    return list(stops)


NAMESPACE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_namespace(namespace: Any) -> str:
    """ "" (the shared namespace) or a name of 1-64 letters, digits, '_', '.' and '-' (not first)."""
    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be a str, got {_kind(namespace)}")
    if namespace and not NAMESPACE_PATTERN.fullmatch(namespace):
        raise ValueError(
            f"namespace {namespace!r} is not a name: 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return namespace
