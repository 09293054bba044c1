"""What a reuse plan is made of: segments of the prompt, and the store lookups that find them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from .keys import ContentHash, PrefixHash, WindowKey

if TYPE_CHECKING:
    from ..store.entry import ChunkEntry

SegmentKind = Literal["exact", "approximate", "computed"]


class ChunkLookup(Protocol):
    """What matching asks of a store: index lookups only (the chunk store implements it)."""

    @property
    def match_window(self) -> int: ...

    def get_exact(self, key: PrefixHash) -> ChunkEntry | None: ...

    def get_content(self, key: ContentHash) -> ChunkEntry | None: ...

    def prefetch(self, keys: list[WindowKey]) -> None: ...

    def window_candidates(self, key: WindowKey) -> list[tuple[ChunkEntry, int]]: ...

    def mark_used(self, entries: Iterable[ChunkEntry]) -> None: ...


@dataclass(slots=True, frozen=True)
class Segment:
    """Prompt tokens [start, end); cached ones read entry tokens [offset, offset + len)."""

    start: int
    end: int
    kind: SegmentKind
    entry: ChunkEntry | None = None
    offset: int = 0

    def __len__(self) -> int:
        return self.end - self.start
