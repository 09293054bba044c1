"""After an answer: keep what later prompts will hold again, with no model work spent on it.

The prompt's exactly computed chunks, for later EXACT (prefix) hits; its head (a system prompt
and a template's opening, before the first reused document), which every later prompt of the
same template opens with; and the conversation's new tail (the tokens the prompt computed after
its last reused one, and the answer), so the next turn of a chat finds its history wherever it
lands. All of it is kept in memory only.
"""

from __future__ import annotations

import numpy as np
import torch

from ..hf.cache import gather_slots
from ..plan.keys import (
    KeySpace,
    PrefixHash,
    chained_prefix_hashes,
    content_hash,
    document_hash,
    in_place_key,
    span_hashes,
)
from ..plan.matching import MIN_HEAD_TOKENS, head_key
from ..store.chunk_store import ChunkStore
from ..store.entry import ChunkEntry
from .documents import Boundaries, DocumentWriter
from .request import Request


class AnswerKeeper:
    """Keeps what each stored-prompt request computed, in one store under one key space."""

    def __init__(self, writer: DocumentWriter, boundaries: Boundaries, chunk_size: int, match_window: int) -> None:
        self.writer, self.store, self.keys = writer, writer.store, writer.keys
        self.boundaries = boundaries
        self.chunk_size = chunk_size
        self.match_window = match_window

    def keep(self, request: Request) -> None:
        """The prompt's exact chunks and head, and the conversation's tail with the answer."""
        store_prompt_chunks(self.store, self.keys, self.chunk_size, request)
        store_prompt_head(self.store, self.keys, request)
        tail = conversation_tail(request, self.match_window)
        if tail is not None:
            sequence, slots, start = tail
            keys, values = gather_slots(request.cache, slots)
            self.keep_span(sequence, start, keys, values, exact=request.exact)

    def keep_span(self, sequence: np.ndarray, start: int, keys: torch.Tensor, values: torch.Tensor, exact: bool) -> int:
        """Store KV a request computed anyway (`sequence[start:]`: a conversation's new turn and
        its answer) as a document found at any offset. `exact`: it was computed on exact KV, so
        where it stands after the same tokens it is served as EXACT (each chunk's
        `in_place_key`). Returns the chunks stored."""
        tokens = sequence[start:]
        cuts = self.boundaries(tokens)
        contents = self.writer.contents(tokens, cuts)
        prefixes = None
        if exact:
            contexts = span_hashes(self.keys.stored_kv, sequence, [start + cut for cut in cuts[:-1]])
            prefixes = [in_place_key(context, content) for context, content in zip(contexts, contents)]
        # in place, the span's identity is its whole context; moved, its tokens alone
        doc_key = prefixes[-1] if prefixes else document_hash(self.keys.document, tokens)
        with self.store.serving():
            if self.store.has_document(doc_key):
                return 0
            return self.writer.write(doc_key, tokens, cuts, contents, (keys, values), start, prefixes, persist=False)


def store_prompt_chunks(store: ChunkStore, keys: KeySpace, chunk_size: int, request: Request) -> None:
    """Store the chunks before `request.exact_end` that the plan did not already hit EXACT.

    Their KV is dense and exact: they carry the model's fingerprint, under prefix hashes of this
    engine's key space."""
    tokens, boundaries, plan = request.asked.tokens, request.boundaries, request.plan
    assert plan is not None and request.slot_positions is not None
    prefixes = chained_prefix_hashes(keys.stored_kv, tokens, boundaries)
    slot_of_position = torch.argsort(request.slot_positions)
    for i, (start, end) in enumerate(zip(boundaries[:-1], boundaries[1:])):
        if end > request.exact_end or end - start < chunk_size and end == len(tokens):
            break  # NOTE: a partial last chunk would never be hit: the next prompt's differs
        if i < plan.exact_chunks:
            continue
        store.put(_exact_entry(keys, request, slot_of_position, start, end, prefixes[i]))


def store_prompt_head(store: ChunkStore, keys: KeySpace, request: Request) -> None:
    """Store the computed tokens before the prompt's first reused document, when it has one.

    Nothing before them, so their KV is full prefill's whatever the repair did later; kept in
    memory only (it is one entry per template, and the next process makes it with its first
    request)."""
    plan = request.plan
    assert plan is not None and request.slot_positions is not None
    first, following = plan.segments[0], plan.segments[1] if len(plan.segments) > 1 else None
    if first.kind != "computed" or following is None or following.kind != "approximate":
        return
    if len(first) < MIN_HEAD_TOKENS:
        return
    slot_of_position = torch.argsort(request.slot_positions)
    store.put(
        _exact_entry(keys, request, slot_of_position, 0, first.end, head_key(keys, request.asked.tokens[: first.end]))
    )


def _exact_entry(
    keys: KeySpace, request: Request, slot_of_position: torch.Tensor, start: int, end: int, prefix: PrefixHash
) -> ChunkEntry:
    """Prompt tokens [start, end) with their KV as this request computed it exactly: an EXACT-only
    entry (kept in memory, never indexed for approximate matches) under `prefix`."""
    tokens = request.asked.tokens[start:end].copy()
    chunk_keys, chunk_values = gather_slots(request.cache, slot_of_position[start:end])
    return ChunkEntry(
        tokens=tokens,
        keys=chunk_keys,
        values=chunk_values,
        base_position=start,
        fingerprint=keys.model,
        content_hash=content_hash(keys.model, tokens),
        prefix_hash=prefix,
        approximate_ok=False,
    )


def conversation_tail(request: Request, min_tokens: int) -> tuple[np.ndarray, torch.Tensor, int] | None:
    """The prompt and the answer as one sequence, the cache slots of its tail (the tokens after
    the prompt's last reused one, with the answer's) and where that tail starts; None when the
    whole sequence is shorter than `min_tokens` (too short to be found again).

    A tail shorter than `min_tokens` (the match window) starts earlier, over reused tokens, so
    that it can be found: a chat of short messages would otherwise keep a turn only every other
    turn, and compute the turn it dropped again in the next.
    An answer that ended at end-of-sequence fed every token it kept; one cut by the token
    limit or a stop string never fed its last, whose KV is not there."""
    plan = request.plan
    assert plan is not None and request.slot_positions is not None
    answer = request.generated if request.finish == "eos" else request.generated[:-1]
    sequence = np.concatenate([request.asked.tokens, np.asarray(answer, dtype=np.int64)])
    if len(sequence) < min_tokens:
        return None
    reused_end = max((s.end for s in plan.segments if s.kind != "computed"), default=0)
    start = min(reused_end, len(sequence) - min_tokens)
    prompt_slots = torch.argsort(request.slot_positions)[start:]
    answer_slots = torch.arange(
        len(request.asked.tokens), len(request.asked.tokens) + len(answer), device=prompt_slots.device
    )
    return sequence, torch.cat([prompt_slots, answer_slots]), start
