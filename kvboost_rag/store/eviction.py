"""Which chunk leaves first when the memory budget is full: one documented score.

    keep_score = last_access + hit_weight * log2(1 + hits) + importance_weight * (importance - 1)

`last_access` counts store accesses (every lookup hit and insert ticks a clock), so recency is
in accesses; one doubling of a chunk's hit count is worth `hit_weight` accesses of recency; and
`importance`, the mean L2 norm of the chunk's value vectors over the store's running mean (1 for
an average chunk), adds `importance_weight` accesses per unit above the mean: chunks that carry
more signal stay longer. The lowest score is evicted first; pinned chunks never are. The clock
is common to all chunks, so scores only change on a chunk's own access and a heap orders them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class EvictionWeights:
    hit_weight: float = 64.0
    importance_weight: float = 64.0


@dataclass(slots=True)
class Usage:
    last_access: int
    importance: float  # relative to the store's mean when it was inserted
    hits: int = 0
    pinned: bool = False


def keep_score(usage: Usage, weights: EvictionWeights) -> float:
    return (
        usage.last_access
        + weights.hit_weight * math.log2(1 + usage.hits)
        + weights.importance_weight * (usage.importance - 1.0)
    )

