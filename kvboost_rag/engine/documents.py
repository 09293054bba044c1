"""A document's KV into the store, chunk by chunk: what warming and keeping a chat turn share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..config import Quantization
from ..ops.quantization import QuantizedTensor, quantize_keys, quantize_values
from ..plan.keys import ContentHash, KeySpace, PrefixHash, content_hash
from ..store.chunk_store import ChunkStore
from ..store.entry import ALONE, ChunkEntry, DocumentRecord, WarmedAfter, value_norm

Boundaries = Callable[[np.ndarray], list[int]]  # where the engine cuts tokens into chunks


class DocumentWriter:
    """Stores documents' chunks, and their records, under one key space, kept as the settings say."""

    def __init__(self, store: ChunkStore, keys: KeySpace, kv_quantization: Quantization | None) -> None:
        self.store, self.keys = store, keys
        self.kv_quantization = kv_quantization

    def contents(self, tokens: np.ndarray, cuts: list[int]) -> list[ContentHash]:
        """The content hash of each chunk [cuts[i], cuts[i + 1]) of a document."""
        return [content_hash(self.keys.document, tokens[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]

    def write(
        self,
        doc_key: bytes,
        tokens: np.ndarray,
        cuts: list[int],
        contents: list[ContentHash],
        kv: tuple[torch.Tensor, torch.Tensor],
        base_position: int,
        prefixes: list[PrefixHash] | None,
        *,
        persist: bool = True,
        warmed_after: WarmedAfter = ALONE,
    ) -> int:
        """A document's chunks (cut at `cuts`, with their `contents` hashes) from its KV
        [L, H, len(tokens), D], computed at `base_position`..; `prefixes`: each chunk's EXACT key
        where its KV is full prefill's (None: moved only); `persist`: into the persistent tiers
        too (a warmed corpus), or memory only (a chat); `warmed_after`: what the document was
        encoded after, recorded on each chunk for the repair. Returns the chunks stored."""
        keys, values = kv
        fingerprint = self.keys.document
        spans = list(zip(cuts[:-1], cuts[1:]))
        stored = 0
        for i, (chunk_start, chunk_end) in enumerate(spans):
            kv_slice = slice(chunk_start, chunk_end)
            entry = ChunkEntry(
                tokens=tokens[chunk_start:chunk_end].copy(),
                keys=self._kept(keys[:, :, kv_slice], quantize_keys, persist),
                values=self._kept(values[:, :, kv_slice], quantize_values, persist),
                base_position=base_position + chunk_start,
                fingerprint=fingerprint,
                content_hash=contents[i],
                prefix_hash=prefixes[i] if prefixes else None,
                next_chunk=contents[i + 1] if i + 1 < len(contents) else None,
                importance=value_norm(values[:, :, kv_slice]),
                warmed_after=warmed_after,
            )
            stored += self.store.put(entry, persist=persist)
        self.store.add_document(DocumentRecord(doc_key, fingerprint, tuple(contents), len(tokens)), persist=persist)
        return stored

    def _kept(self, kv: torch.Tensor, quantizer: Any, at_rest: bool) -> torch.Tensor | QuantizedTensor:
        """A chunk's slice as kept: quantized where it goes to rest (a warmed document), else
        cloned so it does not pin its whole document (a chat's history stays as computed: its next
        turn is an EXACT prefix)."""
        kind = self.kv_quantization
        return quantizer(kv, kind) if kind and at_rest else kv.clone()
