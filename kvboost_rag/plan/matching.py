"""Which prompt tokens come from the store, and how: the reuse plan of one request.

The prompt's own tokens are the truth. EXACT: leading prompt chunks whose chained prefix hash is
stored (identical tokens and context, so identical KV), or the prompt's head (the tokens before
its first reused document: a system prompt and a template's opening) as an earlier prompt left
it, where the entry keeps its KV as computed: a quantized chunk is never what full prefill
computes, so it is APPROXIMATE wherever it stands (the repair and the exactness policy treat it
so). APPROXIMATE: any later run of at least `match_window` tokens identical to a stored chunk
(`approximate`). Everything else is computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..config import Mode
from .approximate import approximate_segments
from .keys import KeySpace, PrefixHash, chained_prefix_hashes, in_place_key, prefix_hash, span_hashes
from .segments import ChunkLookup, Segment, SegmentKind

if TYPE_CHECKING:
    from ..store.entry import ChunkEntry

# A shorter head is not worth an entry: its tokens cost less than the lookup saves.
MIN_HEAD_TOKENS = 8


@dataclass(slots=True)
class ReusePlan:
    segments: list[Segment]
    prompt_chunks: int
    exact_chunks: int
    approximate_chunks: int

    def tokens(self, kind: SegmentKind) -> int:
        return sum(len(s) for s in self.segments if s.kind == kind)

    @property
    def missed_chunks(self) -> int:
        return self.prompt_chunks - self.exact_chunks - self.approximate_chunks

    @property
    def exact_end(self) -> int:
        """Tokens before this position have exactly the KV a full prefill would give."""
        return next((s.start for s in self.segments if s.kind == "approximate"), self.segments[-1].end)


def plan_reuse(
    tokens: np.ndarray,
    boundaries: Sequence[int],
    store: ChunkLookup | None,
    keys: KeySpace,
    mode: Mode,
    shared: KeySpace | None = None,
) -> ReusePlan:
    """The segments covering all of `tokens`; the last token is always computed (its logits).
    `shared`: another key space whose chunks are found too, moved (a shared corpus beside a
    namespace's own); EXACT hits come from `keys` alone."""
    n = len(tokens)
    cached: list[Segment] = []
    found: list[Segment] = []
    exact_chunks = 0
    if mode != "full" and store is not None:
        cached, exact_chunks = _exact_segments(tokens, boundaries, store, keys)
        if mode == "reuse":
            start = cached[-1].end if cached else 0
            spaces = [keys] if shared is None or shared == keys else [keys, shared]
            found = approximate_segments(tokens, start, store, [space.document for space in spaces])
            cached += _head(tokens, found, store, keys) if not cached else []
            cached += _in_place_exact(tokens, found, keys)
    cached = _leave_last_token(cached, n)
    if store is not None:  # what the window index found counts as used (EXACT lookups count themselves)
        store.mark_used(s.entry for s in found if s.entry is not None)
    segments = _fill_gaps(cached, n)
    # Approximate runs start at or after the last exact chunk's end, so no chunk counts twice.
    approx_chunks = _chunks_touched(boundaries, [s for s in segments if s.kind == "approximate"])
    return ReusePlan(segments, len(boundaries) - 1, exact_chunks, approx_chunks)


def _exact_segments(
    tokens: np.ndarray, boundaries: Sequence[int], store: ChunkLookup, keys: KeySpace
) -> tuple[list[Segment], int]:
    segments: list[Segment] = []
    hashes = chained_prefix_hashes(keys.stored_kv, tokens, boundaries)
    for (start, end), key in zip(zip(boundaries[:-1], boundaries[1:]), hashes):
        entry = store.get_exact(key)
        if not _serves_exact(entry, keys, tokens, start, end):
            break
        assert entry is not None  # _serves_exact checked it
        segments.append(Segment(start, end, _in_context_kind(entry), entry, 0))
    return segments, sum(s.kind == "exact" for s in segments)


def _in_context_kind(entry: ChunkEntry) -> SegmentKind:
    """What a chunk computed in this very context is: EXACT, unless its KV is kept quantized."""
    return "approximate" if entry.quantized else "exact"


def _serves_exact(entry: ChunkEntry | None, keys: KeySpace, tokens: np.ndarray, start: int, end: int) -> bool:
    """Whether an EXACT lookup's entry holds prompt tokens [start, end) as computed there."""
    # NOTE: the fingerprint and token comparisons mean a hash collision can never serve a wrong
    # chunk, nor one made another way (another quantization, another model).
    return (
        entry is not None
        and keys.accepts(entry.fingerprint)
        and entry.base_position == start
        and np.array_equal(entry.tokens, tokens[start:end])
    )


def head_key(keys: KeySpace, head: np.ndarray) -> PrefixHash:
    """The key of a prompt's head, the tokens before its first reused document: the prefix hash
    it would have as a first chunk (same tokens from position 0, so the same KV)."""
    return prefix_hash(keys.stored_kv, None, head)


def _head(tokens: np.ndarray, found: list[Segment], store: ChunkLookup, keys: KeySpace) -> list[Segment]:
    """The head before the first found document as an EXACT segment, where an earlier prompt
    stored it (`engine.keeping.store_prompt_head`)."""
    if not found or found[0].start < MIN_HEAD_TOKENS:
        return []
    end = found[0].start
    entry = store.get_exact(head_key(keys, tokens[:end]))
    if entry is None or not _serves_exact(entry, keys, tokens, 0, end):
        return []
    return [Segment(0, end, _in_context_kind(entry), entry, 0)]


def _in_place_exact(tokens: np.ndarray, segments: list[Segment], keys: KeySpace) -> list[Segment]:
    """Found chunks that were computed after these very tokens, where they stand now (a chat's
    history kept in place): their KV is full prefill's, so they are EXACT, not moved, whole or
    any part of them (the matcher confirmed those tokens; the chunk's own tokens before the part
    are checked here, where the part does not start the chunk)."""
    in_place = [
        i
        for i, s in enumerate(segments)
        if s.entry is not None
        and not s.entry.quantized
        and s.entry.prefix_hash is not None
        and s.start - s.offset == s.entry.base_position
        and np.array_equal(tokens[s.entry.base_position : s.start], s.entry.tokens[: s.offset])
    ]
    if not in_place:
        return segments
    # NOTE: entries' bases need not rise along the segments (overlapping turns, each cut where
    # the one before it ends), and span hashes are taken at rising ends.
    bases = [segments[i].start - segments[i].offset for i in in_place]
    ends = sorted(set(bases))
    context_at = dict(zip(ends, span_hashes(keys.stored_kv, tokens, ends)))
    promoted = list(segments)
    for i, context in zip(in_place, (context_at[base] for base in bases)):
        s = segments[i]
        assert s.entry is not None
        if s.entry.prefix_hash == in_place_key(context, s.entry.content_hash):
            promoted[i] = Segment(s.start, s.end, "exact", s.entry, s.offset)
    return promoted


def _leave_last_token(cached: list[Segment], n: int) -> list[Segment]:
    if not cached or cached[-1].end < n:
        return cached
    last = cached[-1]
    if len(last) == 1:
        return cached[:-1]
    return cached[:-1] + [Segment(last.start, n - 1, last.kind, last.entry, last.offset)]


def _fill_gaps(cached: list[Segment], n: int) -> list[Segment]:
    segments: list[Segment] = []
    position = 0
    for segment in cached:
        if segment.start > position:
            segments.append(Segment(position, segment.start, "computed"))
        segments.append(segment)
        position = segment.end
    if position < n:
        segments.append(Segment(position, n, "computed"))
    return segments


def _chunks_touched(boundaries: Sequence[int], segments: list[Segment]) -> int:
    touched: set[int] = set()
    for segment in segments:
        first = int(np.searchsorted(boundaries, segment.start, side="right")) - 1
        last = int(np.searchsorted(boundaries, segment.end - 1, side="right")) - 1
        touched.update(range(first, last + 1))
    return len(touched)
