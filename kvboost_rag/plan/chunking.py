"""Where a token sequence is cut into chunks.

Every strategy returns boundaries [0, b1, ..., n]; each depends only on the tokens, so a
document warmed alone and the same document inside a prompt are cut alike wherever their
tokens agree.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..config import ChunkingStrategy

SENTENCE_END = (".", "!", "?", "。", "！", "？")
SOFT_BREAK = SENTENCE_END + (",", ";", ":", ")", "]")


def fixed_boundaries(n: int, size: int) -> list[int]:
    return list(range(0, n, size)) + [n] if n else [0]


def adaptive_boundaries(token_texts: Sequence[str], size: int, slack: int) -> list[int]:
    """Fixed boundaries, each moved up to `slack` tokens to just after punctuation or a newline."""
    n = len(token_texts)
    bounds = [0]
    while n - bounds[-1] > size:
        target = bounds[-1] + size
        best = target
        for distance in range(0, slack + 1):
            candidates = (target - distance, target + distance)
            hit = [c for c in candidates if bounds[-1] < c < n and _is_break(token_texts[c - 1], SOFT_BREAK)]
            if hit:
                best = hit[0]
                break
        bounds.append(best)
    bounds.append(n)
    return bounds


def semantic_boundaries(token_texts: Sequence[str], size: int) -> list[int]:
    """Whole sentences packed up to `size` tokens; a paragraph break closes a chunk early.

    A sentence longer than `size` is cut at fixed offsets.
    """
    n = len(token_texts)
    sentences: list[tuple[int, int, bool]] = []  # (start, end, ends_paragraph)
    start = 0
    for i, text in enumerate(token_texts):
        paragraph = "\n\n" in text or (text.strip(" ") == "\n" and i > 0 and token_texts[i - 1].endswith("\n"))
        if paragraph or _is_break(text, SENTENCE_END):
            sentences.append((start, i + 1, paragraph))
            start = i + 1
    if start < n:
        sentences.append((start, n, False))

    bounds = [0]
    for s_start, s_end, ends_paragraph in sentences:
        if s_end - bounds[-1] > size and s_start > bounds[-1]:
            bounds.append(s_start)
        while s_end - bounds[-1] > size:
            bounds.append(bounds[-1] + size)
        if ends_paragraph and s_end - bounds[-1] >= size // 4 and s_end < n:
            bounds.append(s_end)
    if bounds[-1] != n:
        bounds.append(n)
    return bounds if n else [0]


def chunk_boundaries(
    token_texts: Sequence[str] | None, n: int, strategy: ChunkingStrategy, size: int, slack: int = 16
) -> list[int]:
    if strategy == "fixed":
        return fixed_boundaries(n, size)
    if token_texts is None or len(token_texts) != n:
        raise ValueError(f"{strategy} chunking needs the text of each of the {n} tokens")
    if n == 0:
        return [0]
    if strategy == "adaptive":
        return adaptive_boundaries(token_texts, size, slack)
    if strategy == "semantic":
        return semantic_boundaries(token_texts, size)
    raise ValueError(f"unknown chunking strategy {strategy!r}")


def _is_break(text: str, marks: tuple[str, ...]) -> bool:
    stripped = text.rstrip(" ")
    return "\n" in text or stripped.endswith(marks)
