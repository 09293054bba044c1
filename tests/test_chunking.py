from __future__ import annotations

import pytest

from kvboost_rag.plan.chunking import adaptive_boundaries, chunk_boundaries, fixed_boundaries, semantic_boundaries


def words(text: str) -> list[str]:
    """One 'token' per word, keeping the leading space as BPE tokens do."""
    parts = text.split(" ")
    return [parts[0]] + [" " + p for p in parts[1:]]


def test_fixed_boundaries_cover_everything() -> None:
    assert fixed_boundaries(300, 128) == [0, 128, 256, 300]
    assert fixed_boundaries(256, 128) == [0, 128, 256]
    assert fixed_boundaries(5, 128) == [0, 5]
    assert fixed_boundaries(0, 128) == [0]


def test_adaptive_moves_each_cut_to_nearby_punctuation() -> None:
    tokens = ["a"] * 40
    tokens[17] = "."  # a cut after index 17 is 2 tokens past the fixed one at 16
    bounds = adaptive_boundaries(tokens, size=16, slack=4)
    assert bounds[0] == 0 and bounds[-1] == 40
    assert bounds[1] == 18
    assert all(0 < b - a <= 16 + 4 for a, b in zip(bounds[:-1], bounds[1:]))


def test_adaptive_keeps_fixed_cut_without_punctuation_in_reach() -> None:
    assert adaptive_boundaries(["a"] * 40, size=16, slack=4) == [0, 16, 32, 40]


def test_semantic_packs_whole_sentences() -> None:
    text = "One two three. Four five six seven. Eight nine. Ten eleven twelve thirteen fourteen."
    tokens = words(text)
    bounds = semantic_boundaries(tokens, size=8)
    pieces = ["".join(tokens[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    assert "".join(pieces) == text
    assert all(p.rstrip().endswith(".") for p in pieces)
    assert all(b - a <= 8 for a, b in zip(bounds[:-1], bounds[1:]))


def test_semantic_cuts_an_overlong_sentence() -> None:
    tokens = words("w " * 30 + "end.")
    bounds = semantic_boundaries(tokens, size=8)
    assert bounds[-1] == len(tokens)
    assert all(b - a <= 8 for a, b in zip(bounds[:-1], bounds[1:]))


def test_strategies_need_token_texts() -> None:
    with pytest.raises(ValueError, match="needs the text"):
        chunk_boundaries(None, 10, "semantic", 4)


@pytest.mark.parametrize("strategy", ["fixed", "semantic", "adaptive"])
def test_boundaries_depend_only_on_earlier_tokens(strategy: str) -> None:
    """Two sequences sharing a long head are cut alike there (what EXACT hits rely on)."""
    head = words("Alpha beta gamma. " * 20)
    first, second = head + words("x y z. " * 5), head + words("p q. " * 9)
    a = chunk_boundaries(first, len(first), strategy, 16, 4)
    b = chunk_boundaries(second, len(second), strategy, 16, 4)
    shared = [x for x in a if x <= len(head) - 16]
    assert shared == [x for x in b if x <= len(head) - 16]
