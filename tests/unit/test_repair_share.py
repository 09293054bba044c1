"""The repair's share of a prompt's moved tokens, from how each moved chunk was warmed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvboost_rag.plan.keys import ContentHash, Fingerprint
from kvboost_rag.plan.matching import ReusePlan
from kvboost_rag.plan.repair import repair_share
from kvboost_rag.plan.segments import Segment
from kvboost_rag.store.entry import ChunkEntry


def _entry(tokens: int, context_tokens: int) -> ChunkEntry:
    kv = torch.zeros(1, 1, tokens, 2)
    return ChunkEntry(
        np.arange(tokens), kv, kv, 0, Fingerprint(b"f"), ContentHash(b"c"), None, context_tokens=context_tokens
    )


def _plan(*moved: tuple[int, int]) -> ReusePlan:
    segments, start = [Segment(0, 10, "computed")], 10
    for tokens, context in moved:
        segments.append(Segment(start, start + tokens, "approximate", _entry(tokens, context)))
        start += tokens
    return ReusePlan(segments, prompt_chunks=len(moved) + 1, exact_chunks=0, approximate_chunks=len(moved))


@pytest.mark.parametrize(
    ("moved", "rho", "after", "share"),
    [
        (((100, 0), (300, 0)), 0.15, 0.05, 0.15),  # all alone: rho exactly
        (((100, 20), (300, 40)), 0.15, 0.05, 0.05),  # all after neighbours
        (((100, 0), (300, 40)), 0.15, 0.05, (15 + 15) / 400),  # each chunk its own share
        (((100, 0), (300, 40)), 0.15, None, 0.15),  # None: one share
        (((100, 0), (300, 40)), 1.0, 0.05, 1.0),  # rho 1: everything, however warmed
    ],
)
def test_each_moved_chunk_counts_with_its_own_share(
    moved: tuple[tuple[int, int], ...], rho: float, after: float | None, share: float
) -> None:
    assert repair_share(_plan(*moved), rho, after) == pytest.approx(share)
