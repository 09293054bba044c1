"""Small fake data for the unit tests: token arrays and KV tensors, no model.

KV tensors are [layers=2, kv_heads=1, tokens, head_dim=4]. Token ids of fake documents come
from disjoint ranges, so no window of one document ever equals a window of another or of the
filler text between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from kvboost_rag.plan.chunking import fixed_boundaries
from kvboost_rag.plan.keys import (
    Fingerprint,
    KeySpace,
    chained_prefix_hashes,
    content_hash,
    document_hash,
    fingerprint_from_parts,
)
from kvboost_rag.plan.matching import ReusePlan
from kvboost_rag.store.entry import ChunkEntry, DocumentRecord

MODEL_FP = fingerprint_from_parts(["unit-test-model"])
DOC_FP = fingerprint_from_parts([MODEL_FP, b"", "", "fixed:16:4"])


@dataclass
class FakeDocument:
    tokens: np.ndarray
    entries: list[ChunkEntry]
    record: DocumentRecord

    def __len__(self) -> int:
        return len(self.tokens)


class Fakes:
    model_fp: Fingerprint = MODEL_FP
    doc_fp: Fingerprint = DOC_FP
    # fake documents' prefix hashes are seeded with the model fingerprint itself
    keys: KeySpace = KeySpace(MODEL_FP, MODEL_FP, DOC_FP)

    def __init__(self) -> None:
        self._generator = torch.Generator().manual_seed(0)
        self._rng = np.random.default_rng(0)

    def kv(self, n: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (torch.randn(2, 1, n, 4, generator=self._generator) * scale).to(dtype)

    def tokens(self, n: int, band: int) -> np.ndarray:
        """n distinct token ids from the band [band * 10_000, band * 10_000 + 10_000)."""
        return (band * 10_000 + self._rng.permutation(10_000)[:n]).astype(np.int64)

    def filler(self, n: int) -> np.ndarray:
        """Text that is in no document (ids below 10_000, distinct)."""
        return self.tokens(n, 0) if n else np.zeros(0, dtype=np.int64)

    def entry(
        self,
        tokens: Sequence[int] | np.ndarray,
        *,
        base_position: int = 0,
        fingerprint: Fingerprint = DOC_FP,
        prefix: bytes | None = None,
        next_chunk: bytes | None = None,
        approximate_ok: bool = True,
        value_scale: float = 1.0,
        importance: float | None = None,
    ) -> ChunkEntry:
        tokens = np.asarray(tokens, dtype=np.int64)
        return ChunkEntry(
            tokens=tokens,
            keys=self.kv(len(tokens)),
            values=self.kv(len(tokens), value_scale),
            base_position=base_position,
            fingerprint=fingerprint,
            content_hash=content_hash(fingerprint, tokens),
            prefix_hash=prefix,  # type: ignore[arg-type]
            next_chunk=next_chunk,  # type: ignore[arg-type]
            approximate_ok=approximate_ok,
            importance=importance,
        )

    def document(self, n: int, band: int, chunk: int = 16, *, exact: bool = False) -> FakeDocument:
        """A document of n tokens cut every `chunk` tokens, as warming stores it: chunks chained by
        next_chunk, content keys under the document fingerprint, prefix keys (model fingerprint)
        when `exact`."""
        tokens = self.tokens(n, band)
        return self.document_of(tokens, chunk, exact=exact)

    def document_of(self, tokens: np.ndarray, chunk: int = 16, *, exact: bool = False) -> FakeDocument:
        bounds = fixed_boundaries(len(tokens), chunk)
        spans = list(zip(bounds[:-1], bounds[1:]))
        contents = [content_hash(DOC_FP, tokens[s:e]) for s, e in spans]
        prefixes = chained_prefix_hashes(MODEL_FP, tokens, bounds) if exact else [None] * len(spans)
        entries = [
            ChunkEntry(
                tokens=tokens[s:e].copy(),
                keys=self.kv(e - s),
                values=self.kv(e - s),
                base_position=s,
                fingerprint=DOC_FP,
                content_hash=contents[i],
                prefix_hash=prefixes[i],
                next_chunk=contents[i + 1] if i + 1 < len(contents) else None,
            )
            for i, (s, e) in enumerate(spans)
        ]
        record = DocumentRecord(document_hash(DOC_FP, tokens), DOC_FP, tuple(contents), len(tokens))
        return FakeDocument(tokens, entries, record)


@pytest.fixture()
def fakes() -> Fakes:
    return Fakes()


def check_plan(plan: ReusePlan, tokens: np.ndarray) -> None:
    """The invariants every plan keeps: segments cover the prompt once, in order, non-empty;
    every cached token is the stored chunk's token at that offset; the last token is computed."""
    position = 0
    for segment in plan.segments:
        assert segment.start == position, f"gap or overlap at {position}: {plan.segments}"
        assert segment.end > segment.start, f"empty segment {segment}"
        if segment.kind == "computed":
            assert segment.entry is None
        else:
            assert segment.entry is not None
            stored = segment.entry.tokens[segment.offset : segment.offset + len(segment)]
            assert np.array_equal(stored, tokens[segment.start : segment.end]), f"wrong tokens served by {segment}"
        position = segment.end
    assert position == len(tokens)
    assert plan.segments[-1].kind == "computed" and plan.segments[-1].end == len(tokens)
    assert sum(len(s) for s in plan.segments) == len(tokens)


@pytest.fixture()
def plan_checker():
    return check_plan
