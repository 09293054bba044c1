"""Chunk keys: chained prefix hashes (EXACT) and content hashes (APPROXIMATE).

Two distinct types so one can never be passed where the other is meant; both are SHA-256 over
bytes (stable across processes) and seeded with the model fingerprint, so caches of different
models, tokenizers, dtypes or position encodings never mix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NewType

import numpy as np

PrefixHash = NewType("PrefixHash", bytes)
ContentHash = NewType("ContentHash", bytes)
WindowKey = NewType("WindowKey", bytes)
Fingerprint = NewType("Fingerprint", bytes)


def token_bytes(tokens: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(tokens, dtype=np.int64).tobytes()


def prefix_hash(fingerprint: Fingerprint, parent: PrefixHash | None, tokens: Sequence[int] | np.ndarray) -> PrefixHash:
    """Hash of a chunk and everything before it: equal hashes mean identical KV."""
    h = hashlib.sha256(b"prefix\0" + fingerprint)
    h.update(parent if parent is not None else b"root")
    h.update(token_bytes(tokens))
    return PrefixHash(h.digest())


def chained_prefix_hashes(
    fingerprint: Fingerprint, tokens: Sequence[int] | np.ndarray, boundaries: Sequence[int]
) -> list[PrefixHash]:
    """Prefix hash of every chunk [boundaries[i], boundaries[i+1])."""
    hashes: list[PrefixHash] = []
    parent: PrefixHash | None = None
    for start, end in zip(boundaries[:-1], boundaries[1:]):
        parent = prefix_hash(fingerprint, parent, tokens[start:end])
        hashes.append(parent)
    return hashes


def span_hashes(fingerprint: Fingerprint, tokens: Sequence[int] | np.ndarray, ends: Sequence[int]) -> list[PrefixHash]:
    """For each end, a hash of every token before it: the identity of KV computed in place.

    A token's KV depends on it and on all it follows, so a span whose hash (taken at the span's
    end) matches was computed after the very same tokens at the very same positions: its KV is
    what a full prefill would give there, at any cut, not only at chunk boundaries.
    """
    running = hashlib.sha256(b"span\0" + fingerprint)
    raw, done, hashes = np.asarray(tokens, dtype=np.int64), 0, []
    for end in ends:
        if end < done:
            raise ValueError("span ends must not decrease")
        running.update(raw[done:end].tobytes())
        done = end
        hashes.append(PrefixHash(running.copy().digest()))
    return hashes


def in_place_key(context: PrefixHash, content: ContentHash) -> PrefixHash:
    """The EXACT key of a chunk kept where it was computed: the span hash of every token before
    it, with its own content hash. A prompt whose tokens before the chunk hash the same, and
    that holds the chunk there, reads exact KV for any part of it."""
    return PrefixHash(hashlib.sha256(b"in-place\0" + context + content).digest())


def content_hash(fingerprint: Fingerprint, tokens: Sequence[int] | np.ndarray) -> ContentHash:
    """Hash of a chunk's tokens alone, wherever it stood."""
    return ContentHash(hashlib.sha256(b"content\0" + fingerprint + token_bytes(tokens)).digest())


def document_hash(fingerprint: Fingerprint, tokens: Sequence[int] | np.ndarray) -> bytes:
    return hashlib.sha256(b"document\0" + fingerprint + token_bytes(tokens)).digest()


def window_keys(fingerprint: Fingerprint, tokens: np.ndarray, window: int) -> list[WindowKey]:
    """Key of the window starting at every offset (len - window + 1 keys).

    Short 8-byte digests keep the index small; a hit is always confirmed by comparing tokens.
    """
    raw = np.ascontiguousarray(tokens, dtype=np.int64).tobytes()
    step = 8
    return [
        WindowKey(hashlib.blake2b(raw[i * step : (i + window) * step], digest_size=8, key=fingerprint).digest())
        for i in range(len(raw) // step - window + 1)
    ]


def indexed_window_keys(fingerprint: Fingerprint, tokens: np.ndarray, window: int) -> list[WindowKey]:
    """The keys a stored chunk is indexed by: the window starting every `window` tokens, the
    i-th at offset i * window (`window_keys(...)[::window]`, without hashing the others)."""
    raw = np.ascontiguousarray(tokens, dtype=np.int64).tobytes()
    step = 8
    return [
        WindowKey(hashlib.blake2b(raw[i * step : (i + window) * step], digest_size=8, key=fingerprint).digest())
        for i in range(0, len(raw) // step - window + 1, window)
    ]


def fingerprint_from_parts(parts: Sequence[str | bytes]) -> Fingerprint:
    h = hashlib.sha256(b"kvboost-rag-fingerprint-v1")
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return Fingerprint(h.digest())


@dataclass(slots=True, frozen=True)
class KeySpace:
    """The fingerprints that seed one engine's keys, so everything that changes stored KV is in
    every key: a chunk kept in int4 can never be served as EXACT to an engine that keeps bf16.

    `model`: model, weights, tokenizer, dtype and RoPE (prompt chunks carry it). `stored_kv`: the
    model plus how KV is kept (quantization): it seeds prefix hashes. `document`: that plus how
    documents are cut and encoded (chunking, warm prefix): it seeds content, window and document
    keys of warmed chunks.
    """

    model: Fingerprint
    stored_kv: Fingerprint
    document: Fingerprint

    @classmethod
    def derive(
        cls, model: Fingerprint, quantization: str | None, warm_prefix: bytes, chunking: str, namespace: str = ""
    ) -> KeySpace:
        """`namespace` ("": the shared one) is in every key, so two namespaces never find, count or
        list each other's chunks in any tier: a tenant's documents are another tenant's misses."""
        if namespace:
            model = fingerprint_from_parts([model, f"namespace:{namespace}"])
        stored_kv = fingerprint_from_parts([model, f"kv:{quantization or 'dense'}"])
        return cls(model, stored_kv, fingerprint_from_parts([stored_kv, warm_prefix, chunking]))

    @property
    def entry_fingerprints(self) -> tuple[Fingerprint, Fingerprint]:
        """The fingerprints its entries carry: kept prompt chunks the model's, warmed documents' the
        document's (what a store's stats are counted by)."""
        return self.model, self.document

    def accepts(self, fingerprint: Fingerprint) -> bool:
        """Whether an entry with this fingerprint was made the way this engine would make it."""
        return fingerprint in self.entry_fingerprints
