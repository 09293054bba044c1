"""Stop strings while streaming: where one ends the answer, and what is not yet safe to emit."""

from __future__ import annotations

from .detokenize import INCOMPLETE


def find_stop(text: str, stops: list[str], search_from: int) -> int | None:
    """Where the first stop string starts in `text` at or after `search_from`, if any."""
    found = [i for i in (text.find(s, search_from) for s in stops) if i >= 0]
    return min(found) if found else None


def held_back(text: str, stops: list[str]) -> int:
    """How many trailing characters are not yet safe to stream: an incomplete multi-byte
    character, and before it what might start a stop string (the character may complete one)."""
    complete = text.rstrip(INCOMPLETE)
    hold = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(complete)), hold, -1):
            if complete.endswith(stop[:k]):
                hold = k
                break
    return hold + len(text) - len(complete)
