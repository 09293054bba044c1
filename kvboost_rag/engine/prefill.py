"""Prefill of one prompt from its reuse plan: assemble the cached KV, repair it, compute the rest.

Four strategies share the assembly, chosen from a table by the repair's name: `none` (cached
KV first, then one pass over the uncached tokens with an exact position mask), `boundary` (the
plan with run starts computed, then the same pass), `cacheblend` (every token through the
first layers, then only the selected ones) and `query` (the uncached tokens' pass, scoring the
moved tokens by the question's attention, then the same pass with the top ones recomputed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from ..config import RepairConfig
from ..hf.blend import SelectiveCache, selective_forward
from ..hf.cache import forward_last_logits, make_cache
from ..ops.attention import position_mask
from ..ops.attention_received import AttentionReceived
from ..ops.rope import rerotate_keys
from ..ops.selection import blend_candidates, select_for_recompute, top_share
from ..plan.matching import ReusePlan
from ..plan.repair import boundary_positions, repair_share, reused_runs, with_recomputed
from ..plan.segments import Segment
from .compute import Compute
from .result import StageTimings

if TYPE_CHECKING:
    from ..store.entry import ChunkEntry

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Prefill:
    """A prompt's cache after prefill, its last logits, and each cache slot's position."""

    cache: Any
    logits: torch.Tensor
    slot_positions: torch.Tensor
    repair_tokens: int = 0


Strategy = Callable[["PrefillRunner", np.ndarray, ReusePlan, StageTimings, RepairConfig], Prefill]


class PrefillRunner:
    """Runs prefills on one model; forward passes run where `compute.py` runs model work."""

    def __init__(self, model: Any, rotary: Any | None, compute: Compute) -> None:
        self.model = model
        self.rotary = rotary  # None: reuse off, nothing is moved or repaired
        self.compute = compute
        first_param = next(model.parameters())
        self.device, self.dtype = first_param.device, first_param.dtype

    def run(self, tokens: np.ndarray, plan: ReusePlan, timings: StageTimings, repair: RepairConfig) -> Prefill:
        """Assemble the cached KV at its new positions, repair it, compute every other token."""
        moved = plan.tokens("approximate")
        if moved and moved / len(tokens) >= repair.min_reused_share and self.rotary is not None:
            strategy = self.strategies[repair.strategy]
            return strategy(self, tokens, plan, timings, repair)
        return self._plain(tokens, plan, timings)

    def assemble(
        self, plan: ReusePlan, in_position_order: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Cached K/V [L, H, n, D] of the plan's reused segments, keys moved to their new
        positions, and those positions.

        Slots follow the segments (n = cached tokens), or with `in_position_order` the prompt's
        positions (n = prompt tokens), where the slots of uncached tokens are left unwritten for
        the caller to fill.
        """
        cached = [s for s in plan.segments if s.kind != "computed"]
        dense = {id(s.entry): _entry(s).dense_kv() for s in cached}  # dequantized once per entry
        some_keys = dense[id(cached[0].entry)][0]
        layers, heads, _, head_dim = some_keys.shape
        slots = plan.segments[-1].end if in_position_order else sum(len(s) for s in cached)
        keys = some_keys.new_empty(layers, heads, slots, head_dim, device=self.device)
        values = torch.empty_like(keys)
        deltas = torch.zeros(slots, dtype=torch.long, device=self.device)
        slot = 0
        for s in cached:
            start = s.start if in_position_order else slot
            end, source = start + len(s), _entry(s).base_position + s.offset
            entry_keys, entry_values = dense[id(s.entry)]
            keys[:, :, start:end] = entry_keys[:, :, s.offset : s.offset + len(s)]
            values[:, :, start:end] = entry_values[:, :, s.offset : s.offset + len(s)]
            deltas[start:end] = s.start - source
            slot = end
        if self.rotary is not None:
            rerotate_keys(keys, deltas, self.rotary, in_place=True)
        return keys, values, _positions(cached, self.device)

    def _plain(self, tokens: np.ndarray, plan: ReusePlan, timings: StageTimings) -> Prefill:
        """Cached KV first in the cache, then one pass over the uncached tokens at their true
        positions. Slots stay cached-first: decoding attends to every slot whatever its order,
        so no reordering is paid before the first token."""
        mark = time.perf_counter()
        query_positions = _positions([s for s in plan.segments if s.kind == "computed"], self.device)
        keys: torch.Tensor | None = None
        values: torch.Tensor | None = None
        cached_positions = query_positions[:0]
        if any(s.kind != "computed" for s in plan.segments):
            keys, values, cached_positions = self.assemble(plan)
        timings.assemble_s, mark = time.perf_counter() - mark, time.perf_counter()
        prefill = self._pass(tokens, keys, values, cached_positions, query_positions)
        timings.prefill_s = time.perf_counter() - mark
        return prefill

    def _pass(
        self,
        tokens: np.ndarray,
        keys: torch.Tensor | None,
        values: torch.Tensor | None,
        cached_positions: torch.Tensor,
        query_positions: torch.Tensor,
        scores: AttentionReceived | None = None,
    ) -> Prefill:
        """One forward pass of the tokens at `query_positions` over cached K/V [L, H, n, D] at
        `cached_positions` (None: no cache), with an exact position mask where they interleave."""
        cache = make_cache(keys, values)
        slot_positions = torch.cat([cached_positions, query_positions])
        mask = None
        if cached_positions.numel() and cached_positions[-1] > query_positions[0]:
            mask = position_mask(query_positions, slot_positions, self.dtype)  # the causal mask would be wrong
        ids = torch.from_numpy(tokens).to(self.device)[query_positions]
        logits = self.compute.run(forward_last_logits, self.model, ids, query_positions, cache, mask, scores)
        return Prefill(cache, logits, slot_positions)

    def _none(self, tokens: np.ndarray, plan: ReusePlan, timings: StageTimings, repair: RepairConfig) -> Prefill:
        return self._plain(tokens, plan, timings)

    def _boundary(self, tokens: np.ndarray, plan: ReusePlan, timings: StageTimings, repair: RepairConfig) -> Prefill:
        """EPIC's LegoLink: the first tokens of every moved run computed with the uncached ones."""
        recompute = boundary_positions(plan, repair.boundary_tokens, repair.tail_tokens)
        prefill = self._plain(tokens, with_recomputed(plan, recompute), timings)
        prefill.repair_tokens = len(recompute)
        # NOTE: one pass computes repaired and uncached tokens together; repair_s is the share of
        # that pass's time that its tokens take, and prefill_s the rest.
        timings.repair_s = timings.prefill_s * len(recompute) / (plan.tokens("computed") + len(recompute))
        timings.prefill_s -= timings.repair_s
        return prefill

    def _blend(self, tokens: np.ndarray, plan: ReusePlan, timings: StageTimings, repair: RepairConfig) -> Prefill:
        """CacheBlend: every token through layers 0..check_layer, then only the selected ones."""
        mark = time.perf_counter()
        n = len(tokens)
        # NOTE: the slots of uncached tokens stay unwritten: they are always selected, so every
        # layer writes them before attention reads them.
        mixed_keys, mixed_values, _ = self.assemble(plan, in_position_order=True)
        layers = mixed_keys.shape[0]
        moved, uncached = blend_candidates(plan, self.device)
        sinks, rho, limit = self._budget(plan, repair, moved)
        forced = uncached | sinks
        use_values = repair.deviation == "value"

        def select(layer: int, fresh_keys: torch.Tensor, fresh_values: torch.Tensor) -> torch.Tensor:
            fresh, cached = (fresh_values, mixed_values[layer]) if use_values else (fresh_keys, mixed_keys[layer])
            return select_for_recompute(fresh, cached, moved, forced, rho, limit)

        check_layer = min(repair.check_layer, layers - 1)
        cache = SelectiveCache(mixed_keys, mixed_values, check_layer, select, repair.narrow_check_layer)
        timings.assemble_s, mark = time.perf_counter() - mark, time.perf_counter()
        logits = self.compute.run(selective_forward, self.model, torch.from_numpy(tokens).to(self.device), cache)
        done = time.perf_counter()
        timings.repair_s, timings.prefill_s = cache.selected_at - mark, done - cache.selected_at
        assert cache.selected is not None
        prefill = Prefill(make_cache(mixed_keys, mixed_values), logits, torch.arange(n, device=self.device))
        prefill.repair_tokens = int(moved[cache.selected].sum())
        return prefill

    @staticmethod
    def _budget(plan: ReusePlan, repair: RepairConfig, moved: torch.Tensor) -> tuple[torch.Tensor, float, int | None]:
        """What a choosing repair (CacheBlend's or the question's) spends on moved tokens: each
        moved run's first `blend_boundary_tokens` always (a mask like `moved`), the share by how
        each chunk was warmed, and the cap of tokens over all runs (None: no cap)."""
        sinks = torch.zeros_like(moved)
        if repair.blend_boundary_tokens:
            sinks[list(boundary_positions(plan, repair.blend_boundary_tokens, 0))] = True
        rho = repair_share(plan, repair.rho, repair.rho_after_neighbours, repair.rho_among_strangers)
        cap = repair.max_tokens_per_run
        return sinks, rho, cap * len(reused_runs(plan)) if cap is not None and rho < 1.0 else None

    def _query(self, tokens: np.ndarray, plan: ReusePlan, timings: StageTimings, repair: RepairConfig) -> Prefill:
        """Query-guided repair (FusionRAG): the uncached tokens over the reused KV, scoring each
        cached token by the attention the question pays it in the last layers; then the top
        share of moved tokens recomputed with the uncached ones over the rest."""
        mark = time.perf_counter()
        keys, values, cached_positions = self.assemble(plan)
        query_positions = _positions([s for s in plan.segments if s.kind == "computed"], self.device)
        layers = keys.shape[0]
        # the question: the uncached tokens after the last moved one (the template's end at least)
        last_moved = max(s.end for s in plan.segments if s.kind == "approximate")
        question = int((query_positions >= last_moved).sum())
        scores = AttentionReceived(
            set(range(max(0, layers - repair.query_layers), layers)), question, len(cached_positions)
        )
        timings.assemble_s, mark = time.perf_counter() - mark, time.perf_counter()

        scored = self._pass(tokens, keys, values, cached_positions, query_positions, scores)
        if scores.scores is None:  # the model attends through another implementation: no scores
            log.warning("kvboost-rag: %s records no attention scores; repairing with CacheBlend", type(self.model))
            return self._blend(tokens, plan, timings, replace(repair, strategy="cacheblend"))
        moved, _ = blend_candidates(plan, self.device)  # the uncached tokens are computed in any case
        sinks, rho, limit = self._budget(plan, repair, moved)
        by_position = torch.zeros(len(tokens), device=self.device)
        by_position[cached_positions] = scores.scores
        selected = top_share(by_position, moved, sinks, rho, limit)
        timings.repair_s, mark = time.perf_counter() - mark, time.perf_counter()
        if not selected.numel():
            return scored  # nothing to repair: the question's pass is the prefill

        kept = torch.ones(len(tokens), dtype=torch.bool, device=self.device)
        kept[selected] = False
        slots = kept[cached_positions]
        recomputed = torch.cat([selected, query_positions]).sort().values
        prefill = self._pass(tokens, keys[:, :, slots], values[:, :, slots], cached_positions[slots], recomputed)
        prefill.repair_tokens = int(selected.numel())
        timings.prefill_s = time.perf_counter() - mark
        return prefill

    # by `RepairConfig.strategy`; `run` passes the runner itself (they are unbound functions here)
    strategies: ClassVar[dict[str, Strategy]] = {
        "none": _none,
        "boundary": _boundary,
        "cacheblend": _blend,
        "query": _query,
    }


def _positions(segments: Sequence[Segment], device: torch.device) -> torch.Tensor:
    return torch.cat([torch.arange(s.start, s.end, device=device) for s in segments])


def _entry(segment: Segment) -> ChunkEntry:
    """The entry a cached segment reads: every segment but a computed one carries it."""
    assert segment.entry is not None, f"a {segment.kind} segment without its entry"
    return segment.entry
