"""Attention math for reuse passes: exact masks by position and grouped attention for few queries."""

from __future__ import annotations

import torch


def position_mask(query_positions: torch.Tensor, slot_positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Exact causal mask by position, for slots not in position order: [1, 1, q, kv].

    Additive 0/-inf floats, which both eager (adds the mask) and sdpa read correctly; a boolean
    mask is silently wrong under eager attention.
    """
    allowed = slot_positions.view(1, -1) <= query_positions.view(-1, 1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=query_positions.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.view(1, 1, *allowed.shape)


def grouped_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention of queries [b, heads, q, d] over K/V [b, kv_heads, n, d] with a mask [b, 1, q, >=n]:
    two matmuls per key/value head group, without copying K/V for every query head.

    Query head h reads key/value head h // group, as transformers' repeat_kv lays them out.
    Scores stay in the inputs' dtype (the softmax kernel accumulates in fp32 anyway). Returns
    [b, q, heads, d], the layout attention modules expect back.
    """
    batch, heads, queries, head_dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    group = heads // kv_heads
    grouped = (query * scale).reshape(batch, kv_heads, group * queries, head_dim)
    scores = torch.matmul(grouped, key.transpose(2, 3)).view(batch, kv_heads, group, queries, length)
    mask = mask[..., :length].unsqueeze(2)  # [b, 1, 1, q, n]: one mask for every head
    if mask.dtype == torch.bool:
        scores.masked_fill_(~mask, float("-inf"))
    else:
        scores.add_(mask)
    probs = scores.softmax(dim=-1).view(batch, kv_heads, group * queries, length)
    out = torch.matmul(probs, value).view(batch, heads, queries, head_dim)
    return out.transpose(1, 2).contiguous()
