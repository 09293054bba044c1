"""APPROXIMATE matches: runs of prompt tokens equal to stored chunks, wherever they stand.

Found through window-key lookups and extended token by token, so a document is found at any
offset and in any order even when its edges were tokenized differently inside the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .keys import Fingerprint, window_keys
from .segments import ChunkLookup, Segment

if TYPE_CHECKING:
    from ..store.entry import ChunkEntry


def approximate_segments(
    tokens: np.ndarray, start: int, store: ChunkLookup, fingerprints: Sequence[Fingerprint]
) -> list[Segment]:
    """The runs of `tokens` from `start` on that stored chunks of these key spaces hold (a
    namespace's own, then the shared one's: each window is looked up under each)."""
    window = store.match_window
    # NOTE: windows are indexed every `window` tokens of an entry, so the scan resumes window - 1
    # tokens before what is covered (the EXACT chunks, then each run found): the rest of an entry
    # whose first part is covered already (a chat turn kept in place, after a stored prompt chunk
    # or an earlier turn that overlaps it) is then found by a window that begins in the covered
    # part, and the run is cut where that part ends.
    scan = max(0, start - window + 1)
    if len(tokens) - scan < window:
        return []
    keyed = [(fingerprint, window_keys(fingerprint, tokens[scan:], window)) for fingerprint in fingerprints]
    store.prefetch([key for _, keys in keyed for key in keys])
    segments: list[Segment] = []
    covered = start
    i = scan
    while i - scan < len(keyed[0][1]):
        best: list[Segment] = []
        gain, placed = 0, False
        candidates = [
            (entry, offset)
            for fingerprint, keys in keyed
            for entry, offset in store.window_candidates(keys[i - scan])
            if entry.fingerprint == fingerprint  # else an 8-byte window key collided with another key space's
        ]
        for entry, offset in candidates:
            run = _extend_match(tokens, i, entry, offset, covered, store)
            beyond = _from(run, covered)
            new = sum(map(len, beyond))
            # of equal runs, one that stands where it was computed (a chat turn seen twice); a
            # moved run must add a window's worth, a run in place any part (it may be EXACT)
            here = entry.base_position == i - offset
            if sum(map(len, run)) >= window and (new >= window or here) and (new, here) > (gain, placed):
                best, gain, placed = beyond, new, here
        if gain:
            segments += best
            covered = best[-1].end
            i = max(i + 1, covered - window + 1)
        else:
            i += 1
    return segments


def _from(run: list[Segment], start: int) -> list[Segment]:
    """The run's segments cut to begin at `start` or later."""
    kept = []
    for s in run:
        if s.end <= start:
            continue
        if s.start < start:
            s = Segment(start, s.end, s.kind, s.entry, s.offset + start - s.start)
        kept.append(s)
    return kept


def _extend_match(
    tokens: np.ndarray, position: int, entry: ChunkEntry, offset: int, floor: int, store: ChunkLookup
) -> list[Segment]:
    """The run of prompt tokens equal to the entry's around (position, offset), crossing into
    the following chunks of the same document."""
    back = 0
    while (
        position - back > floor and offset - back > 0 and tokens[position - back - 1] == entry.tokens[offset - back - 1]
    ):
        back += 1
    run: list[Segment] = []
    start, entry_offset = position - back, offset - back
    current: ChunkEntry | None = entry
    while current is not None and start < len(tokens):
        length = _common_prefix(tokens[start:], current.tokens[entry_offset:])
        if length == 0:
            break
        run.append(Segment(start, start + length, "approximate", current, entry_offset))
        start += length
        if entry_offset + length < len(current) or current.next_chunk is None:
            break
        following = store.get_content(current.next_chunk)
        current = following if following is not None and following.fingerprint == current.fingerprint else None
        entry_offset = 0
    return run


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n
