"""The Redis tier: one pre-warmed corpus shared by every worker that names the same URL.

A `ChunkTier` after disk (memory, then disk, then Redis, as LMCache orders its backends). Chunk
values are the chunk format of `format.py` (checksummed tensors, their tokens and row); keys,
hash tags and groups are `layout.py`'s; a chunk and its index entries are written by one
script. A value that fails its checksum, or whose tokens do not hash to its key, is dropped and
recomputed, never served. Memory is Redis' to bound: unpinned chunks carry a TTL, so under
`maxmemory-policy volatile-lru` Redis evicts the least recently used of them and keeps pinned
chunks and the index; a key evicted under us is a miss and a recompute. The client, the
namespace's manifest and the guard against a lost server are `connection.py`'s: a lost server is
a `RedisUnavailable` (the chunk store serves without it) until it answers again.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import redis
import torch
from redis.cluster import RedisCluster

from ...plan.keys import ContentHash, Fingerprint, PrefixHash, WindowKey, content_hash, indexed_window_keys
from ..claims import holder_gone
from ..entry import ChunkEntry, DocumentRecord
from ..format import load_chunk, serialize, to_device
from ..location import RedisLocation
from ..settings import KeySettings
from ..tier import ModelStats
from . import maintenance
from .connection import NamespaceConnection, bytes_members, bytes_reply
from .guard import LOST, ConnectionGuard
from .layout import KeyLayout
from .maintenance import RedisVerifyReport

T = TypeVar("T")


@dataclass(slots=True)
class RedisCounters:
    """What the tier saw, for reports and tests."""

    dropped: int = 0  # values that failed their checks: deleted, recomputed
    missing: int = 0  # chunks looked up and gone: evicted or expired (lookups follow index entries)


class RedisStore:
    """A `ChunkTier` on a Redis server or cluster. Thread-safe (redis-py's pool)."""

    def __init__(
        self, url: str | RedisLocation, match_window: int | None = None, device: str | torch.device = "cpu"
    ) -> None:
        """`match_window` is recorded for a new namespace; None reads the recorded one (16 for a
        new one). A server that cannot be reached now is a warning: the tier is tried again later."""
        self.location = url if isinstance(url, RedisLocation) else RedisLocation.parse(url)
        self.device = torch.device(device)
        self.counters = RedisCounters()
        self.connection = NamespaceConnection(self.location, match_window, repr(self))
        try:
            self.connection.connect()
        except LOST as error:
            warnings.warn(
                f"kvboost-rag: {self.guard.name} cannot be reached ({error}); serving without it until it answers",
                stacklevel=2,
            )

    def __repr__(self) -> str:
        return f"RedisStore({self.location.redacted()}, namespace={self.location.namespace!r})"

    def __str__(self) -> str:
        return f"{self.location.redacted()} (namespace {self.location.namespace})"

    def close(self) -> None:
        self.connection.close()

    def connect(self) -> None:
        """Reach the server now and read its manifest, raising what the connection raises: for
        maintenance commands, which fail loudly where a request would serve without the tier."""
        self.connection.connect()

    @property
    def guard(self) -> ConnectionGuard:
        return self.connection.guard

    @property
    def layout(self) -> KeyLayout:
        return self.connection.layout

    @property
    def window(self) -> int:
        """The match window the namespace's index is built with."""
        return self.connection.window

    @property
    def _client(self) -> redis.Redis | RedisCluster:
        return self.connection.client

    # how it was written ------------------------------------------------------------------
    @property
    def match_window(self) -> int | None:
        return self.connection.recorded_window

    def recorded_settings(self, model: Fingerprint) -> list[KeySettings]:
        members = bytes_members(self._call(lambda: self._client.smembers(self.layout.settings(model))))
        return sorted((KeySettings.from_json(m.decode()) for m in members), key=lambda s: s.to_json())

    def record_settings(self, model: Fingerprint, settings: KeySettings) -> None:
        self._call(lambda: self._client.sadd(self.layout.settings(model), settings.to_json()))

    def record_names(self, fingerprints: Iterable[Fingerprint], name: str) -> None:
        self._call(lambda: self._client.hset(self.layout.models, mapping={f.hex(): name for f in fingerprints}))

    # chunks ------------------------------------------------------------------------------
    def contains(self, key: ContentHash) -> bool:
        return bool(self._call(lambda: self._client.exists(self.layout.chunk(key))))

    def get(self, key: ContentHash) -> ChunkEntry | None:
        """The chunk, its TTL renewed (a read is a use; pinned chunks keep none)."""
        data = self._call(lambda: self._read(self.layout.chunk(key)))
        if data is None:
            self.counters.missing += 1
            return None
        try:
            record, keys, values = load_chunk(data, key)
            if content_hash(Fingerprint(record.fingerprint), record.tokens) != key:
                raise ValueError("its tokens do not hash to its key")
        except ValueError as error:
            self.counters.dropped += 1
            warnings.warn(
                f"kvboost-rag: dropping corrupted chunk {key.hex()[:16]} from {self!r} ({error}); it will be recomputed"
            )
            self._call(lambda: self._client.delete(self.layout.chunk(key)))
            return None
        return ChunkEntry(
            tokens=record.tokens,
            keys=to_device(keys, self.device),
            values=to_device(values, self.device),
            base_position=record.base_position,
            fingerprint=Fingerprint(record.fingerprint),
            content_hash=key,
            prefix_hash=PrefixHash(record.prefix_hash) if record.prefix_hash is not None else None,
            next_chunk=ContentHash(record.next_chunk) if record.next_chunk is not None else None,
            importance=record.importance,
            warmed_after=record.warmed_after,
        )

    def _read(self, name: str) -> bytes | None:
        if self.location.ttl_s == 0:
            return bytes_reply(self._client.get(name))
        pipe = self._client.pipeline(transaction=False)
        pipe.get(name)
        pipe.expire(name, self.location.ttl_s, xx=True)
        return pipe.execute()[0]

    def get_exact(self, key: PrefixHash) -> ChunkEntry | None:
        def lookup() -> list[bytes | None]:
            pipe = self._client.pipeline(transaction=False)
            for group in self.layout.groups():
                pipe.get(self.layout.prefix(group, key))
            return pipe.execute()

        content = next((c for c in self._call(lookup) if c is not None), None)
        if content is None:
            return None
        entry = self.get(ContentHash(content))
        return entry if entry is not None and entry.prefix_hash == key else None

    def put(self, entry: ChunkEntry) -> bool:
        """Store a document chunk with its index entries; False when it was there already."""
        if self.contains(entry.content_hash):
            return False
        importance = entry.value_importance()
        data = serialize(entry, importance)
        keys = self._index_keys(entry.content_hash, entry.prefix_hash, entry.tokens, entry.fingerprint)
        exact = "1" if entry.prefix_hash is not None else "0"
        args: list[bytes | int | str] = [data, entry.content_hash, self.location.ttl_s, exact]
        return bool(self._call(lambda: self.connection.put_chunk(keys=keys, args=args)))

    def remove(self, key: ContentHash) -> None:
        data = bytes_reply(self._call(lambda: self._client.get(self.layout.chunk(key))))
        try:
            record = load_chunk(data, key)[0] if data is not None else None
        except ValueError:
            record = None  # unreadable: its index entries cannot be named; `verify` removes them
        if record is None:
            self._call(lambda: self._client.delete(self.layout.chunk(key)))
            return
        prefix = record.prefix_hash
        keys = self._index_keys(key, prefix, record.tokens, Fingerprint(record.fingerprint))
        self._call(lambda: self.connection.remove_chunk(keys=keys, args=[key, "1" if prefix is not None else "0"]))

    def _index_keys(
        self, content: bytes, prefix: bytes | None, tokens: np.ndarray, fingerprint: Fingerprint
    ) -> list[str]:
        group = self.layout.group_of(content)
        windows = indexed_window_keys(fingerprint, tokens, self.window)
        keys = [self.layout.chunk(content)]
        if prefix is not None:
            keys.append(self.layout.prefix(group, prefix))
        return keys + [self.layout.window(group, w) for w in dict.fromkeys(windows)]

    # index and documents -----------------------------------------------------------------
    def window_hits(self, keys: Iterable[WindowKey]) -> list[ContentHash]:
        windows = list(dict.fromkeys(keys))
        if not windows:
            return []

        def lookup() -> list[set[bytes]]:
            per_group = [[self.layout.window(group, w) for w in windows] for group in self.layout.groups()]
            if isinstance(self._client, RedisCluster):  # NOTE: its pipelines refuse multi-key commands
                return [bytes_members(self._client.sunion(keys)) for keys in per_group]
            pipe = self._client.pipeline(transaction=False)
            for keys in per_group:
                pipe.sunion(keys)
            return pipe.execute()

        return [ContentHash(c) for members in self._call(lookup) for c in sorted(members)]

    def touch(self, keys: Iterable[ContentHash]) -> None:
        """Renew the TTL of used chunks; pinned ones (no TTL) stay pinned (EXPIRE ... XX)."""
        if self.location.ttl_s == 0:
            return

        def renew() -> None:
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.expire(self.layout.chunk(key), self.location.ttl_s, xx=True)
            pipe.execute()

        self._call(renew)

    def put_document(self, record: DocumentRecord) -> None:
        text = json.dumps(
            {
                "fingerprint": record.fingerprint.hex(),
                "chunks": [c.hex() for c in record.chunks],
                "tokens": record.tokens,
            }
        )
        self._call(lambda: self._client.set(self.layout.document(record.doc_key), text))

    def claim(self, doc_keys: Sequence[bytes], owner: str, seconds: float) -> list[bool]:
        """One script a document (each its own hash slot on a cluster)."""
        life = max(1, int(seconds * 1000))

        def take(key: bytes) -> bool:
            name = self.layout.claim(key)
            reply = self.connection.claim_document(keys=[name], args=[owner, life, ""])
            if isinstance(reply, bytes) and holder_gone(reply.decode()):  # its writer died on this host
                reply = self.connection.claim_document(keys=[name], args=[owner, life, reply])
            return reply == 1

        return self._call(lambda: [take(key) for key in doc_keys])

    def release(self, doc_keys: Sequence[bytes], owner: str) -> None:
        def free() -> None:
            for key in doc_keys:
                self.connection.release_document(keys=[self.layout.claim(key)], args=[owner])

        self._call(free)

    def _document_chunks(self, doc_key: bytes) -> list[ContentHash] | None:
        text = self._call(lambda: self._client.get(self.layout.document(doc_key)))
        return None if text is None else [ContentHash(bytes.fromhex(c)) for c in json.loads(text)["chunks"]]

    def has_document(self, doc_key: bytes) -> bool:
        chunks = self._document_chunks(doc_key)
        if chunks is None:
            return False

        def present() -> list[int]:
            pipe = self._client.pipeline(transaction=False)
            for chunk in chunks:
                pipe.exists(self.layout.chunk(chunk))
            return pipe.execute()

        return all(self._call(present))

    def pin_document(self, doc_key: bytes, pinned: bool = True) -> bool:
        """Pinned chunks carry no TTL, so volatile-* eviction never takes them."""
        chunks = self._document_chunks(doc_key)
        if chunks is None:
            return False

        def pin() -> None:
            pipe = self._client.pipeline(transaction=False)
            for chunk in chunks:
                if pinned or self.location.ttl_s == 0:
                    pipe.persist(self.layout.chunk(chunk))
                else:
                    pipe.expire(self.layout.chunk(chunk), self.location.ttl_s)
            pipe.execute()

        self._call(pin)
        return True

    # maintenance (scans: never on a request's path; see `maintenance.py`) ----------------
    def stats(self) -> list[ModelStats]:
        """Documents, chunks, bytes and pinned chunks per model, from the document records."""
        return maintenance.model_stats(self.connection)

    def total_bytes(self) -> int:
        return maintenance.total_bytes(self.connection)

    def prune(self, budget_bytes: int) -> int:
        """Remove least recently used, unpinned chunks until their bytes fit the budget."""
        return maintenance.prune(self.connection, budget_bytes, self.remove)

    def verify(self) -> RedisVerifyReport:
        """Load every chunk (checksums), drop the bad ones, and remove index entries that name
        chunks no longer there (evicted or expired)."""
        return maintenance.verify(self.connection, self.get)

    def _call(self, operation: Callable[[], T]) -> T:
        return self.connection.call(operation)
