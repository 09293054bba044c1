"""The repair's share of a prompt's moved tokens, from how each moved chunk was warmed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvboost_rag.plan.keys import ContentHash, Fingerprint
from kvboost_rag.plan.matching import ReusePlan
from kvboost_rag.plan.repair import repair_share
from kvboost_rag.plan.segments import Segment
from kvboost_rag.store.entry import ALONE, ChunkEntry, WarmedAfter

# A moved chunk: (its tokens, what it was warmed after, its own key). Names are first chunks' keys.
Moved = tuple[int, WarmedAfter, str]


def _entry(tokens: int, warmed_after: WarmedAfter, name: str) -> ChunkEntry:
    kv = torch.zeros(1, 1, tokens, 2)
    return ChunkEntry(np.arange(tokens), kv, kv, 0, Fingerprint(b"f"), _key(name), None, warmed_after=warmed_after)


def _key(name: str) -> ContentHash:
    return ContentHash(name.encode().ljust(32, b"."))


def _after(*names: str) -> WarmedAfter:
    return WarmedAfter(40 * len(names), tuple(_key(n) for n in names), "test")


def _plan(*moved: Moved) -> ReusePlan:
    segments, start = [Segment(0, 10, "computed")], 10
    for tokens, warmed_after, name in moved:
        segments.append(Segment(start, start + tokens, "approximate", _entry(tokens, warmed_after, name)))
        start += tokens
    return ReusePlan(segments, prompt_chunks=len(moved) + 1, exact_chunks=0, approximate_chunks=len(moved))


@pytest.mark.parametrize(
    ("moved", "rho", "after", "share"),
    [
        (((100, ALONE, "a"), (300, ALONE, "b")), 0.15, 0.05, 0.15),  # all alone: rho exactly
        (((100, _after("b"), "a"), (300, _after("a"), "b")), 0.15, 0.05, 0.05),  # among their neighbours
        (((100, _after("x"), "a"), (300, _after("y"), "b")), 0.15, 0.05, 0.15),  # neighbours not here: as alone
        (((100, _after("b", "x"), "a"), (300, ALONE, "b")), 0.15, 0.05, (5 + 45) / 400),  # one of them here
        (((100, WarmedAfter(40), "a"), (300, ALONE, "b")), 0.15, 0.05, (5 + 45) / 400),  # not named: taken as here
        (((100, _after("b"), "a"), (300, _after("a"), "b")), 0.15, None, 0.15),  # None: one share
        (((100, _after("b"), "a"), (300, _after("a"), "b")), 1.0, 0.05, 1.0),  # rho 1: everything, however warmed
    ],
)
def test_each_moved_chunk_counts_with_the_share_its_neighbours_in_the_prompt_give_it(
    moved: tuple[Moved, ...], rho: float, after: float | None, share: float
) -> None:
    assert repair_share(_plan(*moved), rho, after) == pytest.approx(share)


def test_chunks_warmed_among_documents_the_prompt_lacks_take_the_strangers_share() -> None:
    plan = _plan((100, _after("x"), "a"), (100, _after("a"), "b"), (200, ALONE, "c"))
    # a: its neighbour x is absent (a stranger here); b: a stands here; c: warmed alone
    expected = (100 * 0.3 + 100 * 0.05 + 200 * 0.15) / 400
    assert repair_share(plan, 0.15, 0.05, 0.3) == pytest.approx(expected)
    # a count without names (older stores) is taken as warmed among documents present, never a stranger
    unnamed = _plan((100, WarmedAfter(40), "a"), (300, ALONE, "b"))
    assert repair_share(unnamed, 0.15, 0.05, 0.3) == pytest.approx((5 + 45) / 400)
