"""Attention math for reuse passes: exact masks by position and grouped attention for few queries."""

from __future__ import annotations

import torch

SDPA_GROUPS = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)  # sdpa's enable_gqa


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


def single_query_on_matmuls(query: torch.Tensor) -> bool:
    """Whether a single query runs faster through `single_query_attention` than through sdpa:
    on a CPU in 16-bit floats (in fp32, sdpa's kernel is as fast; fp64 would lose precision)."""
    return query.device.type == "cpu" and query.dtype in (torch.bfloat16, torch.float16)


def single_query_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    decode_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """One new token per sequence, queries [b, heads, 1, d], over every cached K/V [b, kv_heads,
    n, d] (no mask: a decode step sees the whole cache). `decode_kv`: the keys already in float32
    and the values in float32 or as their whole buffer [b, kv_heads, >= n, d] (slots past n
    finite: they are weighted by zero), where the caller keeps them
    (`hf.cache.GrowingLayer.decode_kv`).

    Scores and softmax in fp32, as sdpa's kernels keep them, so a reduced-precision decode step
    reads the same attention. Over fp32 K/V, sdpa's kernel on an fp32 query: one operator where
    the products take five (a step of the default model at 512 tokens 14.2 against 14.8 ms, 2
    AVX-512 cores; docs/research-log.md, "Issue 33, third pass"). Over 16-bit K/V, two matmuls
    per key/value head group: sdpa's kernel takes one bf16 query 3-6x longer there (0.40 against
    0.12 ms a layer at 700 keys, 4.9 against 0.87 ms at 8,000; "Issue 15, third pass").
    Returns [b, 1, heads, d] in the values' dtype.
    """
    batch, heads, _, head_dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    keys, values = (key, value) if decode_kv is None else decode_kv
    if SDPA_GROUPS and keys.dtype == torch.float32 and values.dtype == torch.float32:
        attended = torch.nn.functional.scaled_dot_product_attention(
            query.float(), keys, values, scale=scale, enable_gqa=True
        )
        return attended.to(value.dtype).transpose(1, 2)
    grouped = (query.float() * scale).reshape(batch, kv_heads, heads // kv_heads, head_dim)
    probs = torch.matmul(grouped, keys.transpose(2, 3).float()).softmax(dim=-1)  # no copy if fp32 already
    return weighted_values(probs, values, length, value.dtype).reshape(batch, 1, heads, value.shape[-1])


def weighted_values(probs: torch.Tensor, values: torch.Tensor, length: int, dtype: torch.dtype) -> torch.Tensor:
    """probs [..., q, length] (fp32) times values [..., >= length, d], in `dtype`: in fp32 for
    fp32 values, else in the values' dtype over their whole buffer where it is longer (the
    probabilities padded with zeros: a bf16 product over a view of a buffer is slow on a CPU)."""
    if values.dtype == torch.float32:
        return torch.matmul(probs, values).to(dtype)
    if values.shape[-2] > length:
        padded = probs.new_zeros(*probs.shape[:-1], values.shape[-2], dtype=values.dtype)
        padded[..., :length].copy_(probs)
        return torch.matmul(padded, values).to(dtype)
    return torch.matmul(probs.to(values.dtype), values).to(dtype)


def causal_blocks(query_positions: torch.Tensor, blocks: int) -> list[tuple[int, int, int]]:
    """Queries sorted by position, cut into `blocks` runs of rows: (first row, end row, keys
    they need), where keys lie in position order, so a run needs none after its last query."""
    rows = query_positions.numel()
    cuts = sorted({rows * b // blocks for b in range(blocks + 1)})
    ends = query_positions[torch.tensor(cuts[1:], device=query_positions.device) - 1].tolist() if rows else []
    return [(a, b, end + 1) for a, b, end in zip(cuts[:-1], cuts[1:], ends)]


def blockwise_grouped_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    query_positions: torch.Tensor,
    rows_per_block: int = 64,
    max_blocks: int = 8,
) -> torch.Tensor:
    """`grouped_attention` of queries sorted by position over K/V in position order, each run of
    queries over the keys up to its last position only: the keys it skips are the ones the
    mask would drop, so the output is the same for about (blocks + 1) / (2 blocks) the work
    (at 2.6k tokens, 0.26x a full prefill's TTFT instead of 0.33x; benchmarks/results/frontier).

    NOTE: blocks of 64 rows or more: each block is a few kernel calls, and blocks of 16 rows cost
    more in calls than they saved in keys (bf16, 100 queries over 527 keys: 1.95 ms a layer in
    blocks of 16, 1.25 ms in blocks of 64; 300 over 2,400: 7.6 against 6.4 ms)."""
    blocks = max(1, min(max_blocks, query_positions.numel() // rows_per_block))
    parts = [
        grouped_attention(query[:, :, a:b], key[:, :, :end], value[:, :, :end], mask[..., a:b, :end], scale)
        for a, b, end in causal_blocks(query_positions, blocks)
    ]
    return torch.cat(parts, dim=1)
