"""The repair's token choice: rank the moved tokens by a score, recompute the top share.

Two scores rank them: CacheBlend's K or V deviation at its check layer (`deviation`), and the
attention the question pays them (`ops.attention_received`, the query-guided repair); one pick
(`top_share`) serves both.
"""

from __future__ import annotations

import math

import torch

from ..plan.matching import ReusePlan


def blend_candidates(plan: ReusePlan, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The repair's token masks over the prompt: the moved tokens, ranked by a score, and the
    uncached ones, always computed."""
    n = plan.segments[-1].end
    moved = torch.zeros(n, dtype=torch.bool, device=device)
    forced = torch.zeros_like(moved)
    for segment in plan.segments:
        moved[segment.start : segment.end] = segment.kind == "approximate"
        forced[segment.start : segment.end] = segment.kind == "computed"
    return moved, forced


def deviation(fresh: torch.Tensor, cached: torch.Tensor) -> torch.Tensor:
    """Each token's L2 deviation of fresh from cached K or V ([heads, N, dim] -> [N], fp32)."""
    return (fresh.float() - cached.float()).pow(2).sum(dim=(0, 2))


def top_share(
    scores: torch.Tensor, candidates: torch.Tensor, forced: torch.Tensor, rho: float, limit: int | None = None
) -> torch.Tensor:
    """Sorted token indices to recompute: the forced ones, and the top `rho` of candidates (at
    most `limit`) by `scores` [N]."""
    candidate_ids = torch.nonzero(candidates).flatten()
    picked = torch.zeros_like(candidates)
    count = math.ceil(rho * candidate_ids.numel())
    count = count if limit is None else min(count, limit)
    if count:
        top = torch.topk(scores[candidate_ids], count).indices
        picked[candidate_ids[top]] = True
    return torch.nonzero(picked | forced).flatten()


def select_for_recompute(
    fresh: torch.Tensor,
    cached: torch.Tensor,
    candidates: torch.Tensor,
    forced: torch.Tensor,
    rho: float,
    limit: int | None = None,
) -> torch.Tensor:
    """CacheBlend's choice: the forced tokens and the top `rho` of candidates by deviation."""
    return top_share(deviation(fresh, cached), candidates, forced, rho, limit)
