"""plan_reuse on fake token arrays over a memory ChunkStore (and fake lookups), no model."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvboost_rag.plan.chunking import fixed_boundaries
from kvboost_rag.plan.keys import chained_prefix_hashes, content_hash, in_place_key, span_hashes
from kvboost_rag.plan.matching import plan_reuse
from kvboost_rag.plan.segments import Segment
from kvboost_rag.store.chunk_store import ChunkStore

from .conftest import DOC_FP

WINDOW = 4
CHUNK = 16


def store_of(*documents, window: int = WINDOW) -> ChunkStore:
    store = ChunkStore(budget_bytes=1 << 22, match_window=window)
    for document in documents:
        for entry in document.entries:
            assert store.put(entry)
        store.add_document(document.record)
    return store


def plan(fakes, tokens: np.ndarray, store, mode: str = "reuse", chunk: int = CHUNK):
    return plan_reuse(tokens, fixed_boundaries(len(tokens), chunk), store, fakes.keys, mode)


def covered(plan_, kind: str = "approximate") -> list[int]:
    return [p for s in plan_.segments if s.kind == kind for p in range(s.start, s.end)]


@pytest.mark.parametrize("lead", [0, 1, 3, 7, 13, 16, 29])
def test_document_found_at_any_offset(fakes, plan_checker, lead: int) -> None:
    document = fakes.document(40, band=1)
    store = store_of(document)
    prompt = np.concatenate([fakes.filler(lead), document.tokens, fakes.filler(9)])
    result = plan(fakes, prompt, store)
    plan_checker(result, prompt)
    assert covered(result) == list(range(lead, lead + 40))
    approximate = [s for s in result.segments if s.kind == "approximate"]
    assert [s.entry for s in approximate] == document.entries, "its three chunks, in order"
    assert [s.offset for s in approximate] == [0, 0, 0]
    assert result.exact_chunks == 0
    first, last = lead // CHUNK, (lead + 39) // CHUNK
    assert result.approximate_chunks == last - first + 1


def test_documents_found_in_any_order_among_other_text(fakes, plan_checker) -> None:
    a, b, c = (fakes.document(n, band=i + 1) for i, n in enumerate((40, 23, 57)))
    store = store_of(a, b, c)
    pieces = [fakes.filler(5), c.tokens, fakes.filler(11), a.tokens, b.tokens, fakes.filler(6)]
    prompt = np.concatenate(pieces)
    result = plan(fakes, prompt, store)
    plan_checker(result, prompt)
    c_start = 5
    a_start = c_start + 57 + 11
    b_start = a_start + 40
    expected = [*range(c_start, c_start + 57), *range(a_start, a_start + 40), *range(b_start, b_start + 23)]
    assert covered(result) == expected
    by_document = {id(e): name for name, d in (("a", a), ("b", b), ("c", c)) for e in d.entries}
    order = [by_document[id(s.entry)] for s in result.segments if s.kind == "approximate"]
    assert order == ["c"] * 4 + ["a"] * 3 + ["b"] * 2


def test_a_run_starting_inside_a_chunk_extends_back_and_crosses_into_following_chunks(fakes, plan_checker) -> None:
    document = fakes.document(40, band=1)
    store = store_of(document)
    prompt = np.concatenate([fakes.filler(3), document.tokens[5:], fakes.filler(4)])
    result = plan(fakes, prompt, store)
    plan_checker(result, prompt)
    approximate = [s for s in result.segments if s.kind == "approximate"]
    # The first indexed window at or after token 5 is at offset 8; the run reaches back to 5.
    assert [(s.start, s.end, s.offset) for s in approximate] == [(3, 14, 5), (14, 30, 0), (30, 38, 0)]
    assert [s.entry for s in approximate] == document.entries


def test_crossing_stops_where_the_prompt_leaves_the_document(fakes, plan_checker) -> None:
    document = fakes.document(40, band=1)
    store = store_of(document)
    prompt = np.concatenate([document.tokens[:19], fakes.filler(12)])
    result = plan(fakes, prompt, store)
    plan_checker(result, prompt)
    approximate = [(s.start, s.end, s.entry, s.offset) for s in result.segments if s.kind == "approximate"]
    assert approximate == [(0, 16, document.entries[0], 0), (16, 19, document.entries[1], 0)]


def test_next_chunk_with_other_tokens_is_never_served(fakes, plan_checker) -> None:
    """A next_chunk link to an entry whose tokens differ from the prompt's stops the run."""
    document = fakes.document(32, band=1)
    stranger = fakes.entry(fakes.tokens(16, band=7))
    first = replace(document.entries[0], next_chunk=stranger.content_hash)
    store = ChunkStore(1 << 22, WINDOW)
    store.put(first)
    store.put(stranger)
    prompt = np.concatenate([document.tokens, fakes.filler(3)])
    result = plan(fakes, prompt, store)
    plan_checker(result, prompt)
    assert covered(result) == list(range(16))
    assert all(s.entry is not stranger for s in result.segments)


@pytest.mark.parametrize("start", range(0, CHUNK - (2 * WINDOW - 1) + 1))
def test_any_run_of_two_windows_less_one_is_found_whole(fakes, plan_checker, start: int) -> None:
    document = fakes.document(CHUNK, band=1)
    store = store_of(document)
    run = document.tokens[start : start + 2 * WINDOW - 1]
    prompt = np.concatenate([fakes.filler(6), run, fakes.filler(6)])
    result = plan(fakes, prompt, store)
    plan_checker(result, prompt)
    assert covered(result) == list(range(6, 6 + len(run)))


def test_runs_shorter_than_the_window_are_computed(fakes, plan_checker) -> None:
    document = fakes.document(CHUNK, band=1)
    store = store_of(document)
    short = np.concatenate([fakes.filler(6), document.tokens[: WINDOW - 1], fakes.filler(6)])
    result = plan(fakes, short, store)
    plan_checker(result, short)
    assert result.tokens("approximate") == 0 and result.approximate_chunks == 0
    assert [s.kind for s in result.segments] == ["computed"]
    exactly = np.concatenate([fakes.filler(6), document.tokens[:WINDOW], fakes.filler(6)])
    result = plan(fakes, exactly, store)
    plan_checker(result, exactly)
    assert covered(result) == list(range(6, 6 + WINDOW)), "a whole window is long enough"


def test_the_last_prompt_token_is_always_computed(fakes, plan_checker) -> None:
    document = fakes.document(40, band=1)
    store = store_of(document)
    prompt = np.concatenate([fakes.filler(5), document.tokens])
    result = plan(fakes, prompt, store)
    plan_checker(result, prompt)
    assert result.segments[-1] == Segment(44, 45, "computed")
    assert covered(result) == list(range(5, 44))


def test_a_last_cached_segment_of_one_token_is_dropped(fakes, plan_checker) -> None:
    document = fakes.document(33, band=1, exact=True)  # chunks 16, 16, 1
    store = store_of(document)
    result = plan(fakes, document.tokens, store)
    plan_checker(result, document.tokens)
    assert [(s.start, s.end, s.kind) for s in result.segments] == [
        (0, 16, "exact"),
        (16, 32, "exact"),
        (32, 33, "computed"),
    ]
    assert result.exact_chunks == 3 and result.missed_chunks == 0


def test_exact_hits_at_the_head_then_approximate(fakes, plan_checker) -> None:
    document = fakes.document(40, band=1, exact=True)
    store = store_of(document)
    prompt = np.concatenate([document.tokens, fakes.filler(20)])
    result = plan(fakes, prompt, store)
    plan_checker(result, prompt)
    # The prompt's third chunk is doc[32:40] + filler: another prefix hash, found approximately.
    assert [(s.start, s.end, s.kind, s.entry) for s in result.segments] == [
        (0, 16, "exact", document.entries[0]),
        (16, 32, "exact", document.entries[1]),
        (32, 40, "approximate", document.entries[2]),
        (40, 60, "computed", None),
    ]
    assert (result.prompt_chunks, result.exact_chunks, result.approximate_chunks) == (4, 2, 1)
    assert result.exact_end == 32
    assert result.tokens("exact") == 32 and result.tokens("approximate") == 8


def test_mode_prefix_uses_exact_hits_only(fakes, plan_checker) -> None:
    document = fakes.document(40, band=1, exact=True)
    other = fakes.document(40, band=2)
    store = store_of(document, other)
    prompt = np.concatenate([document.tokens, other.tokens, fakes.filler(8)])
    result = plan(fakes, prompt, store, mode="prefix")
    plan_checker(result, prompt)
    assert [(s.start, s.end, s.kind) for s in result.segments] == [
        (0, 16, "exact"),
        (16, 32, "exact"),
        (32, 88, "computed"),
    ]
    assert result.approximate_chunks == 0 and result.exact_end == 88


def test_mode_full_uses_nothing(fakes, plan_checker) -> None:
    document = fakes.document(40, band=1, exact=True)
    store = store_of(document)
    prompt = np.concatenate([document.tokens, fakes.filler(8)])
    for store_ in (store, None):
        result = plan(fakes, prompt, store_, mode="full")
        plan_checker(result, prompt)
        assert result.segments == [Segment(0, 48, "computed")]
        assert (result.exact_chunks, result.approximate_chunks, result.missed_chunks) == (0, 0, 3)
    assert plan(fakes, prompt, None, mode="reuse").segments == [Segment(0, 48, "computed")]


def test_exact_hit_needs_the_same_base_position(fakes, plan_checker) -> None:
    tokens = fakes.tokens(16, band=1)
    key = chained_prefix_hashes(fakes.model_fp, tokens, [0, 16])[0]
    store = ChunkStore(1 << 22, WINDOW)
    store.put(fakes.entry(tokens, base_position=3, prefix=key, approximate_ok=False))
    prompt = np.concatenate([tokens, fakes.filler(4)])
    result = plan(fakes, prompt, store, mode="prefix")
    plan_checker(result, prompt)
    assert result.exact_chunks == 0 and [s.kind for s in result.segments] == ["computed"]


def test_a_prefix_hash_collision_cannot_serve_a_wrong_chunk(fakes, plan_checker) -> None:
    tokens = fakes.tokens(16, band=1)
    key = chained_prefix_hashes(fakes.model_fp, tokens, [0, 16])[0]
    impostor = fakes.entry(fakes.tokens(16, band=2), prefix=key, approximate_ok=False)
    store = ChunkStore(1 << 22, WINDOW)
    store.put(impostor)
    assert store.get_exact(key) is impostor, "the store itself returns what the key names"
    prompt = np.concatenate([tokens, fakes.filler(4)])
    for mode in ("prefix", "reuse"):
        result = plan(fakes, prompt, store, mode=mode)
        plan_checker(result, prompt)
        assert result.exact_chunks == 0 and all(s.entry is None for s in result.segments)


class CollidingLookup:
    """Every window key and every content key answers with the same wrong chunk."""

    def __init__(self, impostor, window: int) -> None:
        self.impostor, self.match_window = impostor, window
        self.used: list = []

    def get_exact(self, key):
        return None

    def get_content(self, key):
        return self.impostor

    def prefetch(self, keys) -> None:
        pass

    def window_candidates(self, key):
        return [(self.impostor, 0), (self.impostor, WINDOW)]

    def mark_used(self, entries) -> None:
        self.used += list(entries)


def test_a_window_key_collision_cannot_serve_a_wrong_chunk(fakes, plan_checker) -> None:
    impostor = fakes.entry(fakes.tokens(16, band=2))
    lookup = CollidingLookup(impostor, WINDOW)
    prompt = np.concatenate([fakes.filler(10), fakes.tokens(30, band=1)])
    result = plan(fakes, prompt, lookup)
    plan_checker(result, prompt)
    assert [s.kind for s in result.segments] == ["computed"] and lookup.used == []


def test_mark_used_gets_the_reused_entries(fakes) -> None:
    document = fakes.document(40, band=1)
    store = store_of(document)
    calls: list = []
    original = store.mark_used

    def recording(entries) -> None:
        calls.append(list(entries))
        original(calls[-1])

    store.mark_used = recording  # type: ignore[method-assign]
    plan(fakes, np.concatenate([fakes.filler(4), document.tokens, fakes.filler(4)]), store)
    assert calls == [document.entries]


def test_random_prompts_keep_the_plan_invariants(fakes, plan_checker) -> None:
    """Prompts spliced from random pieces of stored documents and filler: coverage, served tokens
    and the last token hold, and every piece of at least two windows less one is reused."""
    rng = np.random.default_rng(1)
    documents = [fakes.document(int(rng.integers(10, 70)), band=i + 1) for i in range(5)]
    store = store_of(*documents)
    for _ in range(25):
        pieces, long_pieces, position = [], [], 0
        for _ in range(int(rng.integers(1, 7))):
            if rng.random() < 0.3:
                piece = fakes.filler(int(rng.integers(1, 12)))
            else:
                tokens = documents[int(rng.integers(len(documents)))].tokens
                a = int(rng.integers(0, len(tokens)))
                b = int(rng.integers(a + 1, len(tokens) + 1))
                piece = tokens[a:b]
                # within one chunk and long enough, a piece is always found (when not last)
                if b - a >= 2 * WINDOW - 1 and a // CHUNK == (b - 1) // CHUNK:
                    long_pieces.append((position, position + b - a))
            pieces.append(piece)
            position += len(piece)
        prompt = np.concatenate(pieces + [fakes.filler(2)])
        result = plan(fakes, prompt, store)
        plan_checker(result, prompt)
        reused = set(covered(result))
        for start, end in long_pieces:
            assert set(range(start, end)) <= reused, (start, end, result.segments)


def test_the_longest_match_among_candidates_wins(fakes, plan_checker) -> None:
    """A passage shared by two documents: the prompt holds B, so B's run (which goes on) wins over
    A's (which ends with the passage), whichever the index lists first."""
    shared = fakes.tokens(8, band=3)
    a = fakes.document_of(np.concatenate([fakes.tokens(8, band=1), shared]))
    b = fakes.document_of(np.concatenate([shared, fakes.tokens(8, band=2)]))
    for order in ((a, b), (b, a)):
        store = store_of(*order)
        prompt = np.concatenate([fakes.filler(5), b.tokens, fakes.filler(5)])
        result = plan(fakes, prompt, store)
        plan_checker(result, prompt)
        assert [(s.start, s.end, s.entry) for s in result.segments if s.kind == "approximate"] == [
            (5, 21, b.entries[0])
        ]


def test_a_document_repeated_in_the_prompt_is_reused_each_time(fakes, plan_checker) -> None:
    document = fakes.document(24, band=1)
    store = store_of(document)
    prompt = np.concatenate([document.tokens, fakes.filler(3), document.tokens, fakes.filler(3)])
    result = plan(fakes, prompt, store)
    plan_checker(result, prompt)
    assert covered(result) == [*range(0, 24), *range(27, 51)]


def test_span_hashes_identify_every_token_before_each_end() -> None:
    from kvboost_rag.plan.keys import Fingerprint, span_hashes

    seed = Fingerprint(b"m" * 32)
    tokens = np.arange(50, dtype=np.int64)
    at_30, at_50 = span_hashes(seed, tokens, [30, 50])
    assert span_hashes(seed, tokens[:30], [30]) == [at_30], "a hash at 30 reads the first 30 tokens only"
    changed = tokens.copy()
    changed[0] = 99
    assert span_hashes(seed, changed, [30, 50]) != [at_30, at_50], "any earlier token changes it"
    assert span_hashes(Fingerprint(b"n" * 32), tokens, [50]) != [at_50]
    with pytest.raises(ValueError, match="decrease"):
        span_hashes(seed, tokens, [30, 20])


def kept_in_place(fakes, sequence: np.ndarray, base: int, end: int):
    """A chat turn `sequence[base:end]` kept where it was computed, after `sequence[:base]`."""
    context = span_hashes(fakes.keys.stored_kv, sequence, [base])[0]
    turn = sequence[base:end]
    return fakes.entry(turn, base_position=base, prefix=in_place_key(context, content_hash(DOC_FP, turn)))


def prompt_chunks(fakes, prompt: np.ndarray, count: int) -> list:
    """The prompt's first `count` chunks as a request stores them: EXACT-only, by prefix hash."""
    prefixes = chained_prefix_hashes(fakes.keys.stored_kv, prompt, fixed_boundaries(count * CHUNK, CHUNK))
    return [
        fakes.entry(prompt[i * CHUNK : (i + 1) * CHUNK], base_position=i * CHUNK, prefix=prefix, approximate_ok=False)
        for i, prefix in enumerate(prefixes)
    ]


def store_with(*entries) -> ChunkStore:
    store = ChunkStore(budget_bytes=1 << 22, match_window=WINDOW)
    for entry in entries:
        assert store.put(entry)
    return store


def test_the_rest_of_a_turn_kept_in_place_is_exact_after_a_chunk_that_covers_its_start(fakes, plan_checker) -> None:
    """A chat turn kept in place (an in-place key: every token before it) whose first tokens a
    stored prompt chunk covers: its rest is still EXACT, though no indexed window of the turn
    lies wholly in that rest (windows every WINDOW tokens; the rest is offsets 5-10 of 10)."""
    history, turn = fakes.filler(27), fakes.tokens(10, band=1)
    prompt = np.concatenate([history, turn, fakes.filler(5)])
    kept = kept_in_place(fakes, prompt, 27, 37)
    store = store_with(kept, *prompt_chunks(fakes, prompt, 2))
    result = plan(fakes, prompt, store)
    plan_checker(result, prompt)
    assert [(s.start, s.end, s.kind, s.offset) for s in result.segments] == [
        (0, 16, "exact", 0),
        (16, 32, "exact", 0),
        (32, 37, "exact", 5),
        (37, 42, "computed", 0),
    ]
    assert result.segments[2].entry is kept
    moved = np.concatenate([fakes.filler(1), prompt])  # one token earlier: not in place, moved
    shifted = plan(fakes, moved, store)
    plan_checker(shifted, moved)
    assert [(s.start, s.end, s.kind) for s in shifted.segments if s.entry is kept] == [(28, 38, "approximate")]


def test_overlapping_turns_kept_in_place_after_a_covering_chunk(fakes, plan_checker) -> None:
    """Two kept turns that overlap, the later-starting one found first: both are EXACT where
    they stand, whatever the order of their bases."""
    tokens = fakes.tokens(44, band=1)
    store = store_with(
        kept_in_place(fakes, tokens, 10, 20), kept_in_place(fakes, tokens, 3, 40), *prompt_chunks(fakes, tokens, 1)
    )
    result = plan(fakes, tokens, store)
    plan_checker(result, tokens)
    assert [(s.start, s.end, s.kind) for s in result.segments] == [
        (0, 16, "exact"),
        (16, 20, "exact"),
        (20, 40, "exact"),
        (40, 44, "computed"),
    ]


def test_a_turn_whose_first_tokens_differ_is_not_exact(fakes, plan_checker) -> None:
    """The rest of a kept turn is EXACT only where the prompt also holds the turn's first tokens
    (covered by another chunk): with them changed, the same rest is moved KV."""
    history, turn = fakes.filler(27), fakes.tokens(10, band=1)
    kept = kept_in_place(fakes, np.concatenate([history, turn]), 27, 37)
    changed = turn.copy()
    changed[:4] = fakes.filler(4) + 50_000  # other tokens, in no document
    prompt = np.concatenate([history, changed, fakes.filler(5)])
    store = store_with(kept, *prompt_chunks(fakes, prompt, 2))
    result = plan(fakes, prompt, store)
    plan_checker(result, prompt)
    assert [(s.start, s.end, s.kind, s.offset) for s in result.segments if s.entry is kept] == [
        (32, 37, "approximate", 5)
    ]


def test_a_turn_said_twice_is_exact_where_each_stands(fakes, plan_checker) -> None:
    """Two kept turns with the same tokens (the same question, the same answer): each is found
    where it was computed, not the first one moved."""
    turn = fakes.tokens(12, band=1)
    prompt = np.concatenate([fakes.filler(10), turn, fakes.filler(8), turn, fakes.filler(5)])
    first, second = kept_in_place(fakes, prompt, 10, 22), kept_in_place(fakes, prompt, 30, 42)
    result = plan(fakes, prompt, store_with(first, second))
    plan_checker(result, prompt)
    assert [(s.start, s.end, s.kind, s.entry) for s in result.segments if s.entry is not None] == [
        (10, 22, "exact", first),
        (30, 42, "exact", second),
    ]
