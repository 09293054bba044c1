"""Decode-time KV retrieval (Quest's bound, FreeKV's selection): which pages a query attends to.

The cache is cut into pages of `page_size` tokens; each page keeps the element-wise min and max
of its keys per KV head. For a query q, sum_d max(q_d * min_d, q_d * max_d) bounds q.k for
every key k of the page from above, so pages are ranked by that bound. A GQA group shares its
KV head, so the group's queries are pooled (their bounds summed) and the group selects one set.
The first and the most recent tokens are always kept; the rest of the budget goes to the best
pages.
"""

from __future__ import annotations

import torch


def page_summaries(keys: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Min and max keys of each whole page: keys [kv_heads, n, d] -> two [kv_heads, n // page, d]."""
    heads, n, dim = keys.shape
    pages = keys[:, : n - n % page_size].reshape(heads, n // page_size, page_size, dim)
    return pages.amin(dim=2), pages.amax(dim=2)


def page_bounds(query: torch.Tensor, mins: torch.Tensor, maxs: torch.Tensor) -> torch.Tensor:
    """Quest's upper bound of q.k over each page, pooled over each KV head's query group.

    query [heads, d] (heads = kv_heads * group, grouped as transformers' repeat_kv lays them
    out); mins, maxs [kv_heads, pages, d]. Returns [kv_heads, pages].
    """
    kv_heads = mins.shape[0]
    grouped = query.float().view(kv_heads, -1, 1, query.shape[-1])  # [kv, group, 1, d]
    bound = torch.maximum(grouped * mins.float().unsqueeze(1), grouped * maxs.float().unsqueeze(1))
    return bound.sum(dim=-1).sum(dim=1)


def select_tokens(
    bounds: torch.Tensor, length: int, page_size: int, budget: int, sink: int, recent: int
) -> torch.Tensor:
    """Token indices each KV head attends to [kv_heads, budget'], ascending: the first `sink`
    tokens, the last `recent`, and the best whole pages between them within `budget` tokens.

    `bounds` [kv_heads, pages] covers the whole pages of the first `length` tokens.
    """
    kv_heads, pages = bounds.shape
    first_page = -(-sink // page_size)  # pages wholly or partly in the sink are kept whole
    recent_start = max(length - recent, first_page * page_size)
    last_page = recent_start // page_size  # pages from here on overlap the recent window
    spare = max(0, (budget - first_page * page_size - (length - last_page * page_size)) // page_size)
    device = bounds.device
    middle = bounds[:, first_page:last_page]
    take = min(spare, middle.shape[1])
    chosen = middle.topk(take, dim=1).indices + first_page if take else middle.new_zeros(kv_heads, 0, dtype=torch.long)
    chosen = chosen.sort(dim=1).values
    offsets = torch.arange(page_size, device=device)
    picked = (chosen.unsqueeze(-1) * page_size + offsets).reshape(kv_heads, -1)
    head = torch.arange(first_page * page_size, device=device).expand(kv_heads, -1)
    tail = torch.arange(last_page * page_size, length, device=device).expand(kv_heads, -1)
    return torch.cat([head, picked, tail], dim=1)


def attend_selected(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tokens: torch.Tensor, scale: float
) -> torch.Tensor:
    """One query per head [heads, d] over each KV head's selected tokens [kv_heads, m] of
    keys/values [kv_heads, n, d]. Returns [heads, d]."""
    kv_heads, _, dim = keys.shape
    index = tokens.unsqueeze(-1).expand(-1, -1, dim)
    picked_keys, picked_values = keys.gather(1, index), values.gather(1, index)  # only the selected pages
    grouped = (query * scale).view(kv_heads, -1, dim)  # [kv, group, d]
    probs = torch.matmul(grouped, picked_keys.transpose(1, 2)).float().softmax(dim=-1).to(values.dtype)
    return torch.matmul(probs, picked_values).reshape(-1, dim)
