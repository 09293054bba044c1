"""Repair planning on hand-built and planned reuse plans: runs, boundaries, recomputed positions."""

from __future__ import annotations

import numpy as np
import pytest

from kvboost_rag.plan.chunking import fixed_boundaries
from kvboost_rag.plan.matching import ReusePlan, plan_reuse
from kvboost_rag.plan.repair import boundary_positions, continues, reused_runs, with_recomputed
from kvboost_rag.plan.segments import Segment
from kvboost_rag.store.chunk_store import ChunkStore


def build(segments: list[Segment]) -> ReusePlan:
    return ReusePlan(segments, prompt_chunks=4, exact_chunks=0, approximate_chunks=3)


@pytest.fixture()
def layout(fakes):
    """doc A (chunks a0 -> a1, 16 each) and doc B (one chunk of 16), in one prompt of 70 tokens:
    computed [0,5) | a0 [5,21) | a1 [21,37) | computed [37,40) | a0[3:13] [40,50) | b [50,66) | computed [66,70)."""
    a = fakes.document(32, band=1)
    b = fakes.document(16, band=2)
    a0, a1 = a.entries
    (b0,) = b.entries
    segments = [
        Segment(0, 5, "computed"),
        Segment(5, 21, "approximate", a0, 0),
        Segment(21, 37, "approximate", a1, 0),
        Segment(37, 40, "computed"),
        Segment(40, 50, "approximate", a0, 3),
        Segment(50, 66, "approximate", b0, 0),
        Segment(66, 70, "computed"),
    ]
    return build(segments), a0, a1, b0


def test_reused_runs_merge_consecutive_chunks_of_one_document(layout) -> None:
    plan, *_ = layout
    assert reused_runs(plan) == [(5, 37), (40, 50), (50, 66)]


def test_continues_needs_the_whole_chunk_then_the_next_one_from_its_start(layout, fakes) -> None:
    _, a0, a1, b0 = layout
    assert continues(Segment(0, 16, "approximate", a0, 0), Segment(16, 32, "approximate", a1, 0))
    assert continues(Segment(0, 10, "approximate", a0, 6), Segment(10, 26, "approximate", a1, 0)), "a tail of a0"
    assert not continues(Segment(0, 15, "approximate", a0, 0), Segment(15, 31, "approximate", a1, 0)), "a0 not whole"
    assert not continues(Segment(0, 16, "approximate", a0, 0), Segment(16, 30, "approximate", a1, 2)), "a1 not at 0"
    assert not continues(Segment(0, 16, "approximate", a0, 0), Segment(17, 33, "approximate", a1, 0)), "a gap"
    assert not continues(Segment(0, 16, "approximate", a0, 0), Segment(16, 32, "approximate", b0, 0)), "not next"
    assert not continues(Segment(0, 16, "exact", a0, 0), Segment(16, 32, "approximate", a1, 0)), "exact is not moved"


def test_a_computed_segment_between_chunks_splits_the_run(layout) -> None:
    _, a0, a1, _ = layout
    plan = build(
        [
            Segment(0, 16, "approximate", a0, 0),
            Segment(16, 17, "computed"),
            Segment(17, 33, "approximate", a1, 0),
            Segment(33, 34, "computed"),
        ]
    )
    assert reused_runs(plan) == [(0, 16), (17, 33)]


def test_boundary_positions_take_head_and_tail_of_each_run(layout) -> None:
    plan, *_ = layout
    assert boundary_positions(plan, head=3, tail=0) == {5, 6, 7, 40, 41, 42, 50, 51, 52}
    assert boundary_positions(plan, head=2, tail=2) == {5, 6, 35, 36, 40, 41, 48, 49, 50, 51, 64, 65}
    assert boundary_positions(plan, head=100, tail=0) == set(range(5, 37)) | set(range(40, 66)), "clipped to runs"
    assert boundary_positions(plan, head=0, tail=0) == set()


def test_with_recomputed_keeps_coverage_and_what_each_position_reads(layout) -> None:
    plan, *_ = layout
    positions = {0, 5, 6, 20, 21, 30, 38, 45, 49, 50, 65, 69}

    def reads(p: ReusePlan) -> dict[int, tuple[int, int] | None]:
        out: dict[int, tuple[int, int] | None] = {}
        for s in p.segments:
            for i in range(s.start, s.end):
                out[i] = None if s.entry is None else (id(s.entry), s.offset + i - s.start)
        return out

    repaired = with_recomputed(plan, positions)
    assert [s.start for s in repaired.segments] == sorted(s.start for s in repaired.segments)
    assert all(a.end == b.start for a, b in zip(repaired.segments, repaired.segments[1:]))
    assert repaired.segments[0].start == 0 and repaired.segments[-1].end == 70
    before, after = reads(plan), reads(repaired)
    moved = {i for s in plan.segments if s.kind == "approximate" for i in range(s.start, s.end)}
    for i in range(70):
        if i in positions and i in moved:
            assert after[i] is None, i
        else:
            assert after[i] == before[i], i
    assert repaired.tokens("approximate") == len(moved - positions)
    assert repaired.tokens("computed") == 70 - len(moved - positions)
    assert plan.tokens("approximate") == len(moved), "the original plan is left as it was"


def test_with_recomputed_of_nothing_is_the_plan_itself(layout) -> None:
    plan, *_ = layout
    assert with_recomputed(plan, set()) is plan


def test_with_recomputed_leaves_exact_segments_alone(fakes) -> None:
    document = fakes.document(32, band=1, exact=True)
    plan = build([Segment(0, 16, "exact", document.entries[0]), Segment(16, 20, "computed")])
    assert with_recomputed(plan, {0, 1, 2, 17}).segments == plan.segments


def test_boundary_repair_on_a_planned_prompt(fakes, plan_checker) -> None:
    """Two documents back to back in a prompt: each run's head is recomputed, the rest reused."""
    a, b = fakes.document(40, band=1), fakes.document(20, band=2)
    store = ChunkStore(1 << 22, 4)
    for d in (a, b):
        for e in d.entries:
            store.put(e)
    prompt = np.concatenate([fakes.filler(7), a.tokens, b.tokens, fakes.filler(3)])
    plan = plan_reuse(prompt, fixed_boundaries(len(prompt), 16), store, fakes.keys, "reuse")
    assert reused_runs(plan) == [(7, 47), (47, 67)]
    positions = boundary_positions(plan, head=4, tail=0)
    assert positions == {7, 8, 9, 10, 47, 48, 49, 50}
    repaired = with_recomputed(plan, positions)
    plan_checker(repaired, prompt)
    assert repaired.tokens("approximate") == 60 - 8
