"""Sparse decode's page selection (Quest's bound, FreeKV's selection): which pages a query attends to.

The cache is cut into pages of `page_size` tokens; each page keeps the element-wise min and max
of its keys per KV head. For a query q, sum_d max(q_d * min_d, q_d * max_d) bounds q.k for
every key k of the page from above, so pages are ranked by that bound. A GQA group shares its
KV head, so the group's queries are pooled (their bounds summed) and the group selects one set.
The first and the most recent tokens are always kept; the rest of the budget goes to the best
pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import single_query_attention, single_query_on_matmuls


def page_summaries(keys: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Min and max keys of each whole page: keys [kv_heads, n, d] -> two [kv_heads, n // page, d]."""
    heads, n, dim = keys.shape
    pages = keys[:, : n - n % page_size].reshape(heads, n // page_size, page_size, dim)
    return pages.amin(dim=2), pages.amax(dim=2)


def page_bounds(query: torch.Tensor, mins: torch.Tensor, maxs: torch.Tensor) -> torch.Tensor:
    """Quest's upper bound of q.k over each page, pooled over each KV head's query group.

    query [heads, d] (heads = kv_heads * group, grouped as transformers' repeat_kv lays them
    out); mins, maxs [kv_heads, pages, d]. Returns [kv_heads, pages]. The bound
    sum_d max(q_d min_d, q_d max_d) is q+ . max + q- . min, and pooled over the group it is the
    group's summed q+ and q- against each page: two matrix products, no [heads, pages, d] term.
    """
    kv_heads, dim = mins.shape[0], query.shape[-1]
    grouped = query.view(kv_heads, -1, dim).to(mins.dtype)
    positive = grouped.clamp(min=0).sum(dim=1, keepdim=True)  # [kv, 1, d]
    negative = grouped.clamp(max=0).sum(dim=1, keepdim=True)
    bound = torch.baddbmm(torch.bmm(positive, maxs.transpose(1, 2)), negative, mins.transpose(1, 2))
    return bound.squeeze(1).float()


@dataclass(slots=True, frozen=True)
class Selection:
    """What each KV head attends to: tokens [0, sink_end), the middle pages `pages`
    [kv_heads, m] (ascending), and tokens [recent_start, length)."""

    sink_end: int
    pages: torch.Tensor
    recent_start: int
    length: int
    page_size: int

    def tokens(self) -> torch.Tensor:
        """The selected token indices [kv_heads, sink + m * page + recent], ascending."""
        kv_heads, device = self.pages.shape[0], self.pages.device
        offsets = torch.arange(self.page_size, device=device)
        middle = (self.pages.unsqueeze(-1) * self.page_size + offsets).reshape(kv_heads, -1)
        head = torch.arange(self.sink_end, device=device).expand(kv_heads, -1)
        tail = torch.arange(self.recent_start, self.length, device=device).expand(kv_heads, -1)
        return torch.cat([head, middle, tail], dim=1)


def select_pages(bounds: torch.Tensor, length: int, page_size: int, budget: int, sink: int, recent: int) -> Selection:
    """The first `sink` tokens, the last `recent` and the best whole pages between them, within
    `budget` tokens (sink and recent rounded out to whole pages).

    `bounds` [kv_heads, pages] covers the whole pages of the first `length` tokens.
    """
    kv_heads = bounds.shape[0]
    first_page = -(-sink // page_size)  # pages wholly or partly in the sink are kept whole
    recent_start = max(length - recent, first_page * page_size)
    last_page = recent_start // page_size  # pages from here on overlap the recent window
    kept = first_page * page_size + (length - last_page * page_size)
    middle = bounds[:, first_page:last_page]
    take = min(max(0, (budget - kept) // page_size), middle.shape[1])
    if take:
        pages = middle.topk(take, dim=1).indices.sort(dim=1).values + first_page
    else:
        pages = torch.zeros(kv_heads, 0, dtype=torch.long, device=bounds.device)
    return Selection(first_page * page_size, pages, last_page * page_size, length, page_size)


def attend_selected(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, selection: Selection, scale: float
) -> torch.Tensor:
    """One query per head [heads, d] over each KV head's selection of keys/values [kv_heads, n, d].
    Returns [heads, d].

    The selected tokens are copied once into one block per KV head (the middle pages whole
    pages at a time, sink and recent as slices): a few MB a layer, against reading all n.
    """
    kv_heads, _, dim = keys.shape
    page, m = selection.page_size, selection.pages.shape[1]
    rows = torch.arange(kv_heads, device=keys.device).unsqueeze(1)

    def gathered(kv: torch.Tensor) -> torch.Tensor:
        paged = kv[:, : selection.recent_start].view(kv_heads, -1, page, dim)
        middle = paged[rows, selection.pages].view(kv_heads, m * page, dim)
        head, tail = kv[:, : selection.sink_end], kv[:, selection.recent_start : selection.length]
        return torch.cat([head, middle, tail], dim=1).unsqueeze(0)

    query, keys, values = query.view(1, -1, 1, dim), gathered(keys), gathered(values)
    if single_query_on_matmuls(query):
        return single_query_attention(query, keys, values, scale).reshape(-1, dim)
    out = torch.nn.functional.scaled_dot_product_attention(query, keys, values, scale=scale, enable_gqa=True)
    return out.view(-1, dim)
