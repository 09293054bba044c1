"""Which chunk leaves first when the memory budget is full: one documented score.

    keep_score = last_request + hit_weight * log2(1 + hits) + importance_weight * (importance - 1)

`last_request` is the number of the last request that used the chunk (warming counts as the
request in progress), so recency is in requests: a prompt's 20-40 lookups age nothing. One
doubling of a chunk's hit count is worth `hit_weight` requests of recency; `importance`, the
mean L2 norm of the chunk's value vectors over the store's running mean (1 for an average
chunk), adds `importance_weight` requests per unit above the mean. The lowest score is evicted
first; pinned chunks never are, nor any chunk of a request being served.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class EvictionWeights:
    hit_weight: float = 4.0
    importance_weight: float = 2.0


@dataclass(slots=True)
class Usage:
    last_request: int
    importance: float  # relative to the store's mean when it was inserted
    hits: int = 0
    pinned: bool = False


def keep_score(usage: Usage, weights: EvictionWeights) -> float:
    return (
        usage.last_request
        + weights.hit_weight * math.log2(1 + usage.hits)
        + weights.importance_weight * (usage.importance - 1.0)
    )
