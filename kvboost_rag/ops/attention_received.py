"""The attention a pass's last queries pay each key: what the query-guided repair ranks by.

FusionRAG (arXiv 2601.12904) prefills the question over the reused KV and recomputes the reused
tokens the question's last-layer attention reads most. Here the question's pass hands this
recorder to the attention of the layers it scores; each adds, for each cached key, the softmax
attention the pass's last `rows` queries pay it, summed over those queries and every head.
"""

from __future__ import annotations

import torch


class AttentionReceived:
    """Attention mass each of the first `slots` keys receives from a pass's last `rows` queries,
    summed over the layers in `layers`, the queries and the heads ([slots], fp32)."""

    def __init__(self, layers: set[int], rows: int, slots: int) -> None:
        if rows < 1:
            raise ValueError("the question's pass scores by at least one query")
        self.layers, self.rows, self.slots = layers, rows, slots
        self.scores: torch.Tensor | None = None
        self.seen: set[int] = set()

    def observe(
        self,
        layer: int | None,
        query: torch.Tensor,
        key: torch.Tensor,
        mask: torch.Tensor | None,
        scale: float,
    ) -> None:
        """One layer's attention (`last_rows_attention`'s arguments), added where it is scored."""
        if layer not in self.layers:
            return
        received = last_rows_attention(query, key, mask, scale, self.rows).sum(dim=(0, 1))[: self.slots]
        self.scores = received if self.scores is None else self.scores + received
        self.seen.add(layer)


def last_rows_attention(
    query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scale: float, rows: int
) -> torch.Tensor:
    """The softmax attention of the last `rows` queries [1, heads, q, d] over keys [1, kv_heads, n,
    d] (grouped: head h reads key head h // group) under the pass's mask [1, 1, q, >= n] (additive or
    boolean; None: causal, the queries being the last q keys): [heads, rows, n], fp32."""
    heads, queries, head_dim = query.shape[1], query.shape[2], query.shape[3]
    kv_heads, length = key.shape[1], key.shape[2]
    rows = min(rows, queries)
    grouped = (query[0, :, queries - rows :].float() * scale).reshape(kv_heads, heads // kv_heads * rows, head_dim)
    logits = torch.matmul(grouped, key[0].float().transpose(1, 2)).view(heads, rows, length)
    if mask is None:  # causal: query i of q stands at key n - q + i
        row_positions = torch.arange(length - rows, length, device=key.device).view(-1, 1)
        allowed = torch.arange(length, device=key.device).view(1, -1) <= row_positions
        logits.masked_fill_(~allowed, float("-inf"))
    else:
        tail = mask[0, 0, queries - rows :, :length]
        if tail.dtype == torch.bool:
            logits.masked_fill_(~tail, float("-inf"))
        else:
            logits.add_(tail.float())
    return logits.softmax(dim=-1)
