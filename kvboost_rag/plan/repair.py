"""Repair of reused chunks: what to recompute so moved documents attend to each other again.

Chunks encoded apart lack cross-document attention, and a chunk that started a document carries
the attention-sink at its first tokens. Three strategies:
- `none`: reuse as it is (the floor, to show what repair buys);
- `boundary`: recompute the first `boundary_tokens` of every reused run that does not continue
  its own document (EPIC's LegoLink), and optionally the last `tail_tokens` before each seam;
- `cacheblend`: recompute every token through the first layers, measure each reused token's
  K/V deviation at `check_layer`, and recompute only the top `rho` of them (plus every uncached
  token) through the remaining layers (CacheBlend, EuroSys'25), with an exact causal mask; its
  token choice is tensor math, in `ops/selection.py`.

This module plans which positions, on the reuse plan alone.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .matching import ReusePlan
from .segments import Segment

if TYPE_CHECKING:
    from ..store.entry import WarmedAfter


def repair_share(
    plan: ReusePlan, rho: float, rho_after_neighbours: float | None, rho_among_strangers: float | None = None
) -> float:
    """The share of the plan's moved tokens CacheBlend recomputes: each moved chunk counts with
    its own share, `rho_after_neighbours` where one of the documents it was warmed after stands in
    this prompt too, `rho_among_strangers` (None: `rho`) where none of them does (its KV attended
    to text this prompt lacks), else `rho` (warmed alone). Exactly `rho` when no chunk was warmed
    after neighbours, and at rho 1 (every moved token recomputed: full prefill's logits, however
    the chunks were warmed). Measured against a share in proportion to how many of them stand
    there, and against one that asks a neighbour to stand before the chunk: docs/research-log.md,
    issue 31, second and seventh passes."""
    moved = [(len(s), s.entry.warmed_after) for s in plan.segments if s.kind == "approximate" and s.entry]
    if rho >= 1.0 or rho_after_neighbours is None or not any(warmed.context_tokens for _, warmed in moved):
        return rho
    in_prompt = {s.entry.content_hash for s in plan.segments if s.entry is not None}
    strangers = rho if rho_among_strangers is None else rho_among_strangers

    def share(warmed: WarmedAfter) -> float:
        if warmed.neighbour_in(in_prompt):
            return rho_after_neighbours
        return strangers if warmed.context_tokens else rho

    return sum(n * share(warmed) for n, warmed in moved) / sum(n for n, _ in moved)


def continues(previous: Segment, segment: Segment) -> bool:
    """Whether `segment` is the next chunk of `previous`'s document, right after it."""
    return (
        previous.kind == segment.kind == "approximate"
        and previous.end == segment.start
        and previous.entry is not None
        and segment.entry is not None
        and previous.offset + len(previous) == len(previous.entry)
        and previous.entry.next_chunk == segment.entry.content_hash
        and segment.offset == 0
    )


def reused_runs(plan: ReusePlan) -> list[tuple[int, int]]:
    """Prompt ranges [start, end) of each contiguous reuse of one document."""
    runs: list[tuple[int, int]] = []
    previous: Segment | None = None
    for segment in plan.segments:
        if segment.kind == "approximate":
            if previous is not None and continues(previous, segment):
                runs[-1] = (runs[-1][0], segment.end)
            else:
                runs.append((segment.start, segment.end))
        previous = segment
    return runs


def boundary_positions(plan: ReusePlan, head: int, tail: int) -> set[int]:
    positions: set[int] = set()
    for start, end in reused_runs(plan):
        positions.update(range(start, min(start + head, end)))
        positions.update(range(max(end - tail, start), end))
    return positions


def with_recomputed(plan: ReusePlan, positions: set[int]) -> ReusePlan:
    """The plan with the given approximate positions computed instead of reused."""
    if not positions:
        return plan
    segments: list[Segment] = []
    for segment in plan.segments:
        if segment.kind != "approximate":
            segments.append(segment)
            continue
        start = segment.start
        while start < segment.end:
            computed = start in positions
            end = start + 1
            while end < segment.end and (end in positions) == computed:
                end += 1
            if computed:
                segments.append(Segment(start, end, "computed"))
            else:
                segments.append(
                    Segment(start, end, "approximate", segment.entry, segment.offset + start - segment.start)
                )
            start = end
    return replace(plan, segments=segments)
