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


def question_attention(question: torch.Tensor, keys: torch.Tensor, scale: float) -> torch.Tensor:
    """How much the question reads each earlier token: the attention of its queries [heads, q,
    dim] over keys [kv_heads, n, dim] (all before the question), averaged over heads and
    queries; [n], summing to 1. Query head h reads key head h // group."""
    heads, rows, dim = question.shape
    kv_heads = keys.shape[0]
    grouped = question.float().reshape(kv_heads, heads // kv_heads * rows, dim) * scale
    probs = torch.matmul(grouped, keys.float().transpose(1, 2)).softmax(dim=-1)
    return probs.mean(dim=(0, 1))


def select_for_recompute(
    fresh: torch.Tensor,
    cached: torch.Tensor,
    candidates: torch.Tensor,
    forced: torch.Tensor,
    rho: float,
    limit: int | None = None,
    weight: torch.Tensor | None = None,
    use_deviation: bool = True,
) -> torch.Tensor:
    """Sorted token indices to recompute: the forced ones, and the top `rho` of candidates (at
    most `limit`) by the L2 deviation of fresh from cached K or V ([heads, N, dim]), times
    `weight` [<= N] where given (tokens past its end weigh 0); by `weight` alone without
    `use_deviation`."""
    deviation = (fresh.float() - cached.float()).pow(2).sum(dim=(0, 2)) if use_deviation else None
    if weight is not None:
        padded = torch.zeros(candidates.numel(), dtype=torch.float32, device=candidates.device)
        padded[: weight.numel()] = weight
        deviation = padded if deviation is None else deviation * padded
    assert deviation is not None, "no ranking: neither deviation nor weight"
    candidate_ids = torch.nonzero(candidates).flatten()
    picked = torch.zeros_like(candidates)
    count = math.ceil(rho * candidate_ids.numel())
    count = count if limit is None else min(count, limit)
    if count:
        top = torch.topk(deviation[candidate_ids], count).indices
        picked[candidate_ids[top]] = True
    return torch.nonzero(picked | forced).flatten()
