"""One request's decode-time KV retrieval: per layer, its page summaries and its last query.

A decode step's attention asks `attend`; past the budget it attends to the selected tokens
only (see `page_selection.py`), else it returns None and the step attends densely. Summaries
of whole pages are computed once, as pages fill. With `speculative`, the step attends to the
pages its previous query chose (FreeKV: that selection can run beside the previous step), and
a KV head whose query group moved (mean cosine similarity below the threshold) re-selects with
the current query first.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from ..config import RetrievalConfig
from .page_selection import attend_selected, page_bounds, page_summaries, select_pages


@dataclass(slots=True)
class RetrievalStats:
    steps: int = 0  # layer steps that attended to a selection
    corrected_heads: int = 0  # KV heads that re-selected with the current query
    heads: int = 0
    select_s: float = 0.0  # summaries, bounds and selection
    attend_s: float = 0.0  # gathering the selected pages and attending to them

    @property
    def corrected_share(self) -> float:
        return self.corrected_heads / self.heads if self.heads else 0.0


@dataclass(slots=True)
class _Layer:
    mins: torch.Tensor | None = None  # [kv_heads, pages, d]
    maxs: torch.Tensor | None = None
    query: torch.Tensor | None = None  # the previous step's [heads, d]


@dataclass(slots=True)
class DecodeRetrieval:
    config: RetrievalConfig
    stats: RetrievalStats = field(default_factory=RetrievalStats)
    _layers: dict[int, _Layer] = field(default_factory=dict)

    def forget(self) -> None:
        """Drop every layer's summaries and last query: the cache was replaced (an exact
        recompute), so they no longer describe its keys."""
        self._layers.clear()

    def attend(
        self, layer: int, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
    ) -> torch.Tensor | None:
        """One decode query [1, heads, 1, d] over K/V [1, kv_heads, n, d]: [1, 1, heads, d], or
        None where the cache fits the budget (dense attention is then exact and as cheap)."""
        config, length = self.config, keys.shape[2]
        if query.shape[0] != 1 or query.shape[2] != 1 or length <= config.budget_tokens:
            return None
        started = time.perf_counter()
        state = self._layers.setdefault(layer, _Layer())
        mins, maxs = self._summaries(state, keys[0])
        current = query[0, :, 0]
        kv_heads = keys.shape[1]
        chooser = current
        if config.speculative and state.query is not None:
            moved = _group_similarity(current, state.query, kv_heads) < config.correction_threshold
            corrected = int(moved.sum())
            self.stats.corrected_heads += corrected
            self.stats.heads += kv_heads
            if corrected < kv_heads:  # all moved: the current query for every head
                group = current.shape[0] // kv_heads
                chooser = torch.where(moved.repeat_interleave(group).unsqueeze(-1), current, state.query)
        state.query = current  # NOTE: a fresh tensor each step (the model's projection): no copy needed
        bounds = page_bounds(chooser, mins, maxs)
        selection = select_pages(
            bounds, length, config.page_size, config.budget_tokens, config.sink_tokens, config.recent_tokens
        )
        selected = time.perf_counter()
        out = attend_selected(current, keys[0], values[0], selection, scale)
        self.stats.steps += 1
        self.stats.select_s += selected - started
        self.stats.attend_s += time.perf_counter() - selected
        return out.view(1, 1, *out.shape)

    def _summaries(self, state: _Layer, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's page summaries, extended by the pages filled since the last step."""
        page = self.config.page_size
        done = 0 if state.mins is None else state.mins.shape[1]
        whole = keys.shape[1] // page
        if whole > done:
            mins, maxs = page_summaries(keys[:, done * page : whole * page], page)
            state.mins = mins if state.mins is None else torch.cat([state.mins, mins], dim=1)
            state.maxs = maxs if state.maxs is None else torch.cat([state.maxs, maxs], dim=1)
        assert state.mins is not None and state.maxs is not None
        return state.mins, state.maxs


def _group_similarity(current: torch.Tensor, previous: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Mean cosine similarity of each KV head's query group between two steps: [kv_heads]."""
    similarity = torch.nn.functional.cosine_similarity(current.float(), previous.float(), dim=-1)
    return similarity.view(kv_heads, -1).mean(dim=1)


# The retrieval of the decode step this thread runs, for the attention function.
ACTIVE_RETRIEVAL: ContextVar[DecodeRetrieval | None] = ContextVar("kvboost_active_retrieval", default=None)
