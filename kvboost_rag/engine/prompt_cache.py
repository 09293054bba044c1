"""After an answer: keep the prompt's exactly computed chunks for later EXACT (prefix) hits."""

from __future__ import annotations

import torch

from ..hf.cache import gather_slots
from ..plan.keys import Fingerprint, chained_prefix_hashes, content_hash
from ..store.entry import ChunkEntry
from ..store.memory import ChunkStore
from .request import Request


def store_prompt_chunks(store: ChunkStore, fingerprint: Fingerprint, chunk_size: int, request: Request) -> None:
    """Store the chunks before `request.exact_end` that the plan did not already hit EXACT."""
    tokens, boundaries, plan = request.tokens, request.boundaries, request.plan
    assert plan is not None and request.slot_positions is not None
    prefixes = chained_prefix_hashes(fingerprint, tokens, boundaries)
    slot_of_position = torch.argsort(request.slot_positions)
    for i, (start, end) in enumerate(zip(boundaries[:-1], boundaries[1:])):
        if end > request.exact_end or end - start < chunk_size and end == len(tokens):
            break  # NOTE: a partial last chunk would never be hit: the next prompt's differs
        if i < plan.exact_chunks:
            continue
        keys, values = gather_slots(request.cache, slot_of_position[start:end])
        store.put(
            ChunkEntry(
                tokens=tokens[start:end].copy(),
                keys=keys,
                values=values,
                base_position=start,
                fingerprint=fingerprint,
                content_hash=content_hash(fingerprint, tokens[start:end]),
                prefix_hash=prefixes[i],
                approximate_ok=False,
            )
        )
