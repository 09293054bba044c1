"""After an answer: keep the prompt's exactly computed chunks for later EXACT (prefix) hits."""

from __future__ import annotations

import torch

from ..hf.cache import gather_slots
from ..plan.keys import KeySpace, chained_prefix_hashes, content_hash
from ..store.entry import ChunkEntry
from ..store.memory import ChunkStore
from .request import Request


def store_prompt_chunks(store: ChunkStore, keys: KeySpace, chunk_size: int, request: Request) -> None:
    """Store the chunks before `request.exact_end` that the plan did not already hit EXACT.

    Their KV is dense and exact: they carry the model's fingerprint, under prefix hashes of this
    engine's key space."""
    tokens, boundaries, plan = request.tokens, request.boundaries, request.plan
    assert plan is not None and request.slot_positions is not None
    prefixes = chained_prefix_hashes(keys.stored_kv, tokens, boundaries)
    slot_of_position = torch.argsort(request.slot_positions)
    for i, (start, end) in enumerate(zip(boundaries[:-1], boundaries[1:])):
        if end > request.exact_end or end - start < chunk_size and end == len(tokens):
            break  # NOTE: a partial last chunk would never be hit: the next prompt's differs
        if i < plan.exact_chunks:
            continue
        chunk_keys, chunk_values = gather_slots(request.cache, slot_of_position[start:end])
        store.put(
            ChunkEntry(
                tokens=tokens[start:end].copy(),
                keys=chunk_keys,
                values=chunk_values,
                base_position=start,
                fingerprint=keys.model,
                content_hash=content_hash(keys.model, tokens[start:end]),
                prefix_hash=prefixes[i],
                approximate_ok=False,
            )
        )
