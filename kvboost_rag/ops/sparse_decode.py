"""One request's sparse decode (decode-time KV page selection): per layer, its page summaries and its last query.

A decode step's attention asks `attend`; past the budget it attends to the selected tokens
only (see `page_selection.py`), else it returns None and the step attends densely. Summaries
of whole pages are computed once, as pages fill. With `speculative`, a step attends to the
pages its previous query chose (FreeKV), and a KV head whose query group moved (mean cosine
similarity below the threshold) re-selects with the current query first. FreeKV runs the
speculative selection beside the next step on a GPU; on a CPU there is nothing beside, so the
selections of every layer are made together, in one batch of operators at the next step's
first layer, instead of ~10 small operators in each of the 30 layers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..config import SparseDecodeConfig
from .page_selection import Selection, attend_selected, page_bounds, page_summaries, select_pages


@dataclass(slots=True)
class SparseDecodeStats:
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
    selection: Selection | None = None  # what `query` chose, for this step (speculative)


@dataclass(slots=True)
class SparseDecode:
    config: SparseDecodeConfig
    stats: SparseDecodeStats = field(default_factory=SparseDecodeStats)
    _layers: dict[int, _Layer] = field(default_factory=dict)
    _queried: list[int] = field(default_factory=list)  # layers whose query this step awaits selection
    _stacked: tuple[torch.Tensor, torch.Tensor] | None = None  # every layer's summaries, for the batch

    def forget(self) -> None:
        """Drop every layer's summaries and last query: the cache was replaced (an exact
        recompute), so they no longer describe its keys."""
        self._layers.clear()
        self._queried.clear()
        self._stacked = None

    def attend(
        self, layer: int, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
    ) -> torch.Tensor | None:
        """One decode query [1, heads, 1, d] over K/V [1, kv_heads, n, d]: [1, 1, heads, d], or
        None where the cache fits the budget (dense attention is then exact and as cheap)."""
        config, length = self.config, keys.shape[2]
        if query.shape[0] != 1 or query.shape[2] != 1 or length <= config.budget_tokens:
            return None
        started = time.perf_counter()
        if config.speculative and layer in self._queried:  # a new step: select for every layer at once
            self._select_speculatively(length)
        state = self._layers.setdefault(layer, _Layer())
        mins, maxs = self._summaries(state, keys[0])
        current = query[0, :, 0]
        kv_heads = keys.shape[1]
        selection = state.selection if state.selection is not None and state.selection.length == length else None
        if selection is None or state.query is None:
            selection = self._select(current, mins, maxs, length)
        else:
            self.stats.heads += kv_heads
            corrected = 0
            if config.correction_threshold > -1.0:  # a cosine similarity is never below -1
                moved = _group_similarity(current, state.query, kv_heads) < config.correction_threshold
                corrected = int(moved.sum())
                self.stats.corrected_heads += corrected
            if corrected:  # re-select with the current query for the heads that moved
                group = current.shape[0] // kv_heads
                chooser = torch.where(moved.repeat_interleave(group).unsqueeze(-1), current, state.query)
                selection = self._select(chooser, mins, maxs, length)
        state.query, state.selection = current, None  # NOTE: a fresh tensor each step: no copy needed
        if config.speculative:
            self._queried.append(layer)
        selected = time.perf_counter()
        out = attend_selected(current, keys[0], values[0], selection, scale)
        self.stats.steps += 1
        self.stats.select_s += selected - started
        self.stats.attend_s += time.perf_counter() - selected
        return out.view(1, 1, *out.shape)

    def _select(self, query: torch.Tensor, mins: torch.Tensor, maxs: torch.Tensor, length: int) -> Selection:
        c = self.config
        return select_pages(
            page_bounds(query, mins, maxs), length, c.page_size, c.budget_tokens, c.sink_tokens, c.recent_tokens
        )

    def _select_speculatively(self, length: int) -> None:
        """Every queried layer's selection for this step from its previous query, in one batch:
        the same pages each layer's own selection would choose."""
        layers, self._queried = self._queried, []
        shapes = {(self._layers[i].mins.shape, self._layers[i].query.shape) for i in layers}  # type: ignore[union-attr]
        if len(shapes) != 1:  # layers unlike in heads or pages: each selects on its own
            return
        summary_shape = next(iter(shapes))[0]
        # NOTE: summaries only grow (forget() drops the stack), so a stack of the same shape is current
        if self._stacked is None or self._stacked[0].shape[:3] != (len(layers), *summary_shape[:2]):
            self._stacked = (
                torch.stack([self._layers[i].mins for i in layers]),  # type: ignore[misc]
                torch.stack([self._layers[i].maxs for i in layers]),  # type: ignore[misc]
            )
        mins, maxs = self._stacked
        count, kv_heads = mins.shape[:2]
        queries = torch.stack([self._layers[i].query for i in layers])  # type: ignore[misc]
        batched = self._select(queries.flatten(0, 1), mins.flatten(0, 1), maxs.flatten(0, 1), length)
        chosen = batched.pages.view(count, kv_heads, -1)
        for i, layer in enumerate(layers):
            self._layers[layer].selection = Selection(
                batched.sink_end, chosen[i], batched.recent_start, length, batched.page_size
            )

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
