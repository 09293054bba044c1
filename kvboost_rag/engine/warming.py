"""Warming: encode each document alone, in one pass, and store it chunk by chunk.

Writers warming one store at once (processes, hosts) claim each document before encoding it
(`ChunkStore.claim`), so none is encoded twice: a document another writer holds is waited for,
or left to it (`wait=False`, counted as deferred) for the caller to come back to.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..hf.cache import forward_last_logits, make_cache, stacked_kv
from ..hf.model import model_shape
from ..plan.keys import ContentHash, chained_prefix_hashes, document_hash
from ..store.claims import claimant
from ..store.entry import ALONE, DocumentRecord, WarmedAfter
from .cancellation import check_cancelled
from .compute import Compute
from .documents import Boundaries, DocumentWriter
from .inputs import check_document, check_text
from .result import WarmReport

Neighbours = Sequence[Sequence[str]]  # per document, the texts it is encoded after
Member = tuple[np.ndarray, bytes]  # a document's tokens and key
Work = tuple[list[Member], Callable[[list[bool]], None]]  # members, and what encodes those taken

# NOTE: a claim outlives any one group's passes; a writer that died on another host leaves its
# documents claimed this long at most (one on this host, not at all: `store.claims`), after which
# another encodes them (work done twice at worst, never lost).
CLAIM_SECONDS = 300.0
CLAIM_POLL_SECONDS = 0.5  # how often a writer waiting on another's documents looks again


class Warmer:
    """Warms documents into one store with one model; its passes run where `compute.py` runs model work."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        writer: DocumentWriter,
        boundaries: Boundaries,
        compute: Compute,
        max_context: int,
        prefix_tokens: np.ndarray,
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.writer, self.store, self.keys = writer, writer.store, writer.keys
        self.boundaries = boundaries
        self.compute = compute
        self.max_context = max_context
        first_param = next(model.parameters())
        self.device, self.dtype = first_param.device, first_param.dtype
        self.prefix_tokens = prefix_tokens  # the warm prefix, tokenized once by the engine (its keys hold it)
        self._prefix_kv: tuple[torch.Tensor, torch.Tensor] | None = None
        self._prefix_lock = threading.Lock()

    def warm(
        self,
        texts: list[str],
        *,
        pin: bool = False,
        neighbours: Neighbours | None = None,
        neighbours_from: str = "",
        wait: bool = True,
    ) -> WarmReport:
        """A document already warm is skipped without any model work. `pin` keeps its chunks in
        memory whatever the budget asks. `neighbours[i]`: texts encoded before document i, as
        they would stand before it in a prompt (FusionRAG); only the document's KV is kept, with
        a record of them and of `neighbours_from` (how they were found). `wait`: see the module."""
        started = time.perf_counter()
        tokenized = [self.document_tokens(i, text) for i, text in enumerate(texts)]
        contexts = self.contexts(neighbours, tokenized, neighbours_from)
        report = WarmReport(documents=len(texts))
        errors_before = self.store.tier_errors
        work: list[Work] = []
        for tokens, (context, warmed_after) in zip(tokenized, contexts):
            doc_key = document_hash(self.keys.document, tokens)
            encode = functools.partial(self._encode_one, report, doc_key, tokens, context, warmed_after)
            work.append(([(tokens, doc_key)], encode))
        self._warm_all(work, report, wait=wait, pin=pin, serving=True)
        report.store_errors = self.store.tier_errors - errors_before
        report.seconds = time.perf_counter() - started
        return report

    def _encode_one(
        self,
        report: WarmReport,
        doc_key: bytes,
        tokens: np.ndarray,
        context: np.ndarray,
        warmed_after: WarmedAfter,
        taken: list[bool],
    ) -> None:
        report.chunks_stored += self.compute.run(self.encode_document, doc_key, tokens, context, warmed_after)
        report.tokens_encoded += len(context) + len(tokens)

    def _warm_all(self, work: list[Work], report: WarmReport, *, wait: bool, pin: bool, serving: bool) -> None:
        """Each item's members encoded where cold and claimed here (`serving`: an item's chunks never
        evict each other). Items another writer holds come last, when the rest are done, so writers
        on one corpus spread over it instead of queueing behind each other; they are then waited
        for, or without `wait` counted as deferred."""
        pending = []
        for members, encode in work:
            check_cancelled()  # between items: a caller that went away stops the rest
            remaining = [True] * len(members)
            with self.store.serving() if serving else contextlib.nullcontext():
                self._claimed(members, encode, report, False, remaining)
            if any(remaining):
                pending.append((members, encode, remaining))
            elif pin:
                self._pin(members)
        for members, encode, remaining in pending:
            with self.store.serving() if serving else contextlib.nullcontext():
                self._claimed(members, encode, report, wait, remaining)
            report.deferred_documents += sum(remaining)
            if pin:
                self._pin(members)

    def _pin(self, members: list[Member]) -> None:
        for _, key in members:
            self.store.pin_document(key)

    def _claimed(
        self,
        members: list[Member],
        encode: Callable[[list[bool]], None],
        report: WarmReport,
        wait: bool,
        remaining: list[bool],
    ) -> None:
        """Encode (`encode(taken)`) the `remaining` members that are cold and claimed here, then free
        their claims; those another writer holds stay `remaining`, waited for with `wait` (found
        warm, or taken once the claim lapses). Members found warm count as skipped."""
        owner = claimant()  # this call's: threads of one process are writers too
        while True:
            cold = [left and not self.is_warm(key, tokens, report) for (tokens, key), left in zip(members, remaining)]
            keys = [key for (_, key), is_cold in zip(members, cold) if is_cold]
            held = iter(self.store.claim(keys, owner, CLAIM_SECONDS))
            claimed = [is_cold and next(held) for is_cold in cold]
            # NOTE: another writer may have stored one between the look and the claim: look again
            cold = [
                is_cold and not (mine and self.is_warm(key, tokens, report))
                for (tokens, key), is_cold, mine in zip(members, cold, claimed)
            ]
            taken = [mine and is_cold for mine, is_cold in zip(claimed, cold)]
            try:
                if any(taken):
                    encode(taken)
            finally:
                self.store.release([key for (_, key), mine in zip(members, claimed) if mine], owner)
            for i, mine in enumerate(taken):
                if remaining[i] and (mine or not cold[i]):
                    remaining[i] = False
                    report.skipped_documents += not mine
            if not any(remaining) or not wait:
                return
            check_cancelled()
            time.sleep(CLAIM_POLL_SECONDS)

    def warm_together(
        self, groups: list[list[str]], *, pin: bool = False, neighbours_from: str = "", wait: bool = True
    ) -> WarmReport:
        """Each group of documents that are each other's neighbours, encoded in two passes: in
        its order, then reversed, a blank line between documents. Each member keeps its KV from
        the pass where more of the group stands before it, so it is warmed after half its group
        or more, for ~2x plain warming's work instead of (N + 1)x. A member's KV depends on its
        group alone, whatever else is warm: members already warm are not stored again but still
        stand in the passes that store others (a pass that stores none is not run), so workers
        warming one corpus at once, or a corpus warmed as it grows, store what one run would. A
        group passing the window loses its last members, which are warmed alone. `wait`: see the
        module."""
        started = time.perf_counter()
        texts = [text for group in groups for text in group]
        tokenized = iter([self.document_tokens(i, text) for i, text in enumerate(texts)])
        report = WarmReport(documents=len(texts))
        errors_before = self.store.tier_errors
        room = self.max_context - len(self.prefix_tokens)
        work: list[Work] = []
        for group in groups:
            members = [
                (tokens, document_hash(self.keys.document, tokens)) for tokens in [next(tokenized) for _ in group]
            ]
            encode = functools.partial(
                self._encode_group, members, report=report, room=room, neighbours_from=neighbours_from
            )
            work.append((members, encode))
        self._warm_all(work, report, wait=wait, pin=pin, serving=False)
        report.store_errors = self.store.tier_errors - errors_before
        report.seconds = time.perf_counter() - started
        return report

    def _encode_group(
        self, members: list[Member], taken: list[bool], report: WarmReport, room: int, neighbours_from: str
    ) -> None:
        """A group's passes, storing the members `taken` (cold, claimed here); members past the
        window are warmed alone."""
        members, taken = list(members), list(taken)
        while sum(len(tokens) + len(self.separator) for tokens, _ in members) > room:
            (tokens, key), mine = members.pop(), taken.pop()  # past the window: warmed alone
            if mine:
                report.chunks_stored += self.compute.run(self._encode_alone, key, tokens)
                report.tokens_encoded += len(tokens)
        if len(members) == 1 and taken[0]:
            report.chunks_stored += self.compute.run(self._encode_alone, *members[0][::-1])
            report.tokens_encoded += len(members[0][0])
        elif len(members) > 1:
            for order, keep in self._passes(len(members)):
                stored = [position for position in keep if taken[order[position]]]
                if stored:
                    passed = [members[j] for j in order]
                    report.chunks_stored += self.compute.run(self._encode_in_turn, passed, stored, neighbours_from)
                    report.tokens_encoded += sum(len(tokens) + len(self.separator) for tokens, _ in passed)

    @staticmethod
    def _passes(size: int) -> list[tuple[list[int], list[int]]]:
        """A group's two passes: its members' order, and the positions in that order whose KV the
        pass gives (those with half the group or more before them)."""
        middle = (size - 1) / 2
        forward = list(range(size))
        return [
            (forward, [j for j in forward if j >= middle]),
            (forward[::-1], [i for i in forward if size - 1 - i < middle]),
        ]

    def is_warm(self, doc_key: bytes, tokens: np.ndarray, report: WarmReport) -> bool:
        """Whether the document is stored in memory and every tier; one a tier lost is copied there
        from where it is held (counted in `report`), one held nowhere whole is to be encoded."""
        contents = tuple(self.writer.contents(tokens, self.boundaries(tokens)))
        state = self.store.complete_document(DocumentRecord(doc_key, self.keys.document, contents, len(tokens)))
        report.restored_documents += state == "restored"
        return state != "missing"

    def _encode_alone(self, doc_key: bytes, tokens: np.ndarray) -> int:
        with self.store.serving():
            return self.encode_document(doc_key, tokens)

    def _encode_in_turn(self, members: list[tuple[np.ndarray, bytes]], keep: list[int], neighbours_from: str) -> int:
        """One pass over `members` (tokens, key) in order, a blank line after each; the members at
        positions `keep` of this order are stored, after the ones before them."""
        pieces = [np.concatenate([tokens, self.separator]) for tokens, _ in members]
        keys, values, start = self.forward_after_prefix(np.concatenate(pieces))
        firsts = [self.first_chunk(tokens) for tokens, _ in members]
        stored, offset = 0, start
        for position, (tokens, doc_key) in enumerate(members):
            if position in keep:
                cuts = self.boundaries(tokens)
                kv = keys[:, :, offset : offset + len(tokens)], values[:, :, offset : offset + len(tokens)]
                contents = self.writer.contents(tokens, cuts)
                after = WarmedAfter(offset - start, tuple(firsts[:position]), neighbours_from)  # never the pass's first
                with self.store.serving():
                    stored += self.writer.write(doc_key, tokens, cuts, contents, kv, offset, None, warmed_after=after)
            offset += len(pieces[position])
        return stored

    def document_tokens(self, index: int, text: Any) -> np.ndarray:
        """The document's tokens, or an error naming it (`documents[index]`) before any model work."""
        name = f"document {index} (documents[{index}])"
        tokens = np.asarray(self.tokenizer(check_document(index, text), add_special_tokens=False).input_ids, np.int64)
        if len(tokens) == 0:
            raise ValueError(f"document {index} is empty: documents[{index}] gives no tokens")
        if len(tokens) > self.max_context:
            raise ValueError(f"{name} has {len(tokens)} tokens, over the context window of {self.max_context}")
        return tokens

    def contexts(
        self, neighbours: Neighbours | None, documents: list[np.ndarray], neighbours_from: str
    ) -> list[tuple[np.ndarray, WarmedAfter]]:
        """Each document's neighbours as tokens, each followed by the prompt's blank line, and
        their record; the farthest (first) are left out where they and the document would pass
        the window. Every neighbour is checked before any model work."""
        empty = np.zeros(0, np.int64)
        if neighbours is None:
            return [(empty, ALONE)] * len(documents)
        if isinstance(neighbours, (str, bytes)) or not isinstance(neighbours, Sequence):
            raise TypeError(f"neighbours must be a list of lists of texts, got {type(neighbours).__name__}")
        if len(neighbours) != len(documents):
            raise ValueError(f"neighbours has {len(neighbours)} lists for {len(documents)} documents: one each")
        room = self.max_context - len(self.prefix_tokens)
        contexts = []
        for i, (texts, tokens) in enumerate(zip(neighbours, documents)):
            if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
                raise TypeError(f"neighbours[{i}] must be a list of texts, got {type(texts).__name__}")
            parts, firsts = [], []
            for j, text in enumerate(texts):
                name = f"neighbours[{i}][{j}]"
                if not isinstance(text, str):
                    raise TypeError(f"{name} is a {type(text).__name__}, expected str")
                part = np.asarray(self.tokenizer(check_text(text, name), add_special_tokens=False).input_ids, np.int64)
                parts.append(np.concatenate([part, self.separator]))
                firsts.append(self.first_chunk(part))
            while parts and sum(map(len, parts)) + len(tokens) > room:
                parts.pop(0), firsts.pop(0)
            context = np.concatenate(parts) if parts else empty
            contexts.append((context, WarmedAfter(len(context), tuple(firsts), neighbours_from) if parts else ALONE))
        return contexts

    def first_chunk(self, tokens: np.ndarray) -> ContentHash:
        """The key of a document's first chunk: what names it in a prompt's plan."""
        return self.writer.contents(tokens, self.boundaries(tokens)[:2])[0]

    @functools.cached_property
    def separator(self) -> np.ndarray:
        """The tokens between two documents of a prompt (a blank line)."""
        return np.asarray(self.tokenizer("\n\n", add_special_tokens=False).input_ids, np.int64)

    def encode_document(
        self, doc_key: bytes, tokens: np.ndarray, context: np.ndarray | None = None, warmed_after: WarmedAfter = ALONE
    ) -> int:
        """One pass over the document after the warm prefix and its `context` (neighbours, which
        `warmed_after` records); only the document's KV is kept."""
        context = np.zeros(0, np.int64) if context is None else context
        keys, values, prefix_length = self.forward_after_prefix(np.concatenate([context, tokens]))
        start = prefix_length + len(context)
        cuts = self.boundaries(tokens)
        # NOTE: after a warm prefix or neighbours the chunks' context is not the document alone, so
        # they are APPROXIMATE candidates only; without, a prompt starting with the document hits EXACT.
        prefixes = chained_prefix_hashes(self.keys.stored_kv, tokens, cuts) if start == 0 else None
        kv = keys[:, :, start:], values[:, :, start:]
        contents = self.writer.contents(tokens, cuts)
        return self.writer.write(doc_key, tokens, cuts, contents, kv, start, prefixes, warmed_after=warmed_after)

    def forward_after_prefix(self, tokens: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, int]:
        """One pass over `tokens` after the warm prefix: every layer's K/V [L, H, n, D] of the
        prefix and the tokens, and where the tokens start (the prefix's length)."""
        prefix_keys, prefix_values = self.prefix_kv()
        start = prefix_keys.shape[2]
        cache = make_cache(prefix_keys, prefix_values)
        ids = torch.from_numpy(tokens).to(self.device)
        self.compute.run(
            forward_last_logits, self.model, ids, torch.arange(start, start + len(ids), device=self.device), cache
        )
        keys, values = stacked_kv(cache)
        return keys, values, start

    def prefix_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """KV of the warm prefix, computed once."""
        with self._prefix_lock:
            if self._prefix_kv is None:
                cache = make_cache()
                if len(self.prefix_tokens):
                    ids = torch.from_numpy(self.prefix_tokens).to(self.device)
                    positions = torch.arange(len(ids), device=self.device)
                    self.compute.run(forward_last_logits, self.model, ids, positions, cache)
                    self._prefix_kv = stacked_kv(cache)
                else:
                    layers, heads, head_dim = model_shape(self.model)
                    empty = torch.empty(layers, heads, 0, head_dim, dtype=self.dtype, device=self.device)
                    self._prefix_kv = (empty, empty)
            return self._prefix_kv
