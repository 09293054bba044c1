"""CacheBlend's token choice: which moved tokens deviate most from their fresh K or V."""

from __future__ import annotations

import math

import torch

from ..plan.matching import ReusePlan


def blend_candidates(plan: ReusePlan, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """CacheBlend's token masks over the prompt: the moved tokens, ranked by deviation, and the
    uncached ones, always computed."""
    n = plan.segments[-1].end
    moved = torch.zeros(n, dtype=torch.bool, device=device)
    forced = torch.zeros_like(moved)
    for segment in plan.segments:
        moved[segment.start : segment.end] = segment.kind == "approximate"
        forced[segment.start : segment.end] = segment.kind == "computed"
    return moved, forced


def select_for_recompute(
    fresh: torch.Tensor,
    cached: torch.Tensor,
    candidates: torch.Tensor,
    forced: torch.Tensor,
    rho: float,
    limit: int | None = None,
) -> torch.Tensor:
    """Sorted token indices to recompute: the forced ones, and the top `rho` of candidates (at
    most `limit`) by the L2 deviation of fresh from cached K or V ([heads, N, dim])."""
    deviation = (fresh.float() - cached.float()).pow(2).sum(dim=(0, 2))
    candidate_ids = torch.nonzero(candidates).flatten()
    picked = torch.zeros_like(candidates)
    count = math.ceil(rho * candidate_ids.numel())
    count = count if limit is None else min(count, limit)
    if count:
        top = torch.topk(deviation[candidate_ids], count).indices
        picked[candidate_ids[top]] = True
    return torch.nonzero(picked | forced).flatten()
