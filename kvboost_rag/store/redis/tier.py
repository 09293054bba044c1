"""The Redis tier: one pre-warmed corpus shared by every worker that names the same URL.

A `ChunkTier` after disk (memory, then disk, then Redis, as LMCache orders its backends). Chunk
values are the chunk format of `format.py` (checksummed tensors, their tokens and row); keys,
hash tags and groups are `layout.py`'s; a chunk and its index entries are written by one
script. A value that fails its checksum, or whose tokens do not hash to its key, is dropped and
recomputed, never served. Memory is Redis' to bound: unpinned chunks carry a TTL, so under
`maxmemory-policy volatile-lru` Redis evicts the least recently used of them and keeps pinned
chunks and the index; a key evicted under us is a miss and a recompute. A lost server is a
`RedisUnavailable` (the memory tier serves without it) until it answers again.
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import redis
import torch
from redis.cluster import RedisCluster

from ...plan.keys import ContentHash, Fingerprint, PrefixHash, WindowKey, content_hash, indexed_window_keys
from ..entry import ChunkEntry, DocumentRecord
from ..format import load_chunk, serialize, to_device
from ..location import DEFAULT_SHARDS, RedisLocation
from ..settings import SCHEMA_VERSION, KeySettings, StoreSettingsError
from ..tier import ModelStats
from .guard import LOST, ConnectionGuard
from .layout import KeyLayout
from .scripts import PUT_CHUNK, REMOVE_CHUNK

T = TypeVar("T")


@dataclass(slots=True)
class RedisCounters:
    """What the tier saw, for reports and tests."""

    dropped: int = 0  # values that failed their checks: deleted, recomputed
    missing: int = 0  # chunks looked up and gone: evicted or expired (lookups follow index entries)


@dataclass(slots=True)
class RedisVerifyReport:
    checked: int = 0
    dropped: list[str] = field(default_factory=list)
    postings_removed: int = 0  # index entries naming chunks that are gone


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
        self._wanted_window = match_window
        self.guard = ConnectionGuard(f"Redis at {self.location.redacted()}", self.location.retry_after_s, self._claim)
        self._lock = threading.Lock()
        self._connection: redis.Redis | RedisCluster | None = None  # made on first use (a cluster asks its nodes)
        self._ready = False  # the manifest has been read (and claimed) on this server
        self._recorded_window: int | None = None
        self.window = match_window or 16
        self.layout = KeyLayout(self.location.namespace, self.location.shards or DEFAULT_SHARDS)
        try:
            self.guard.call(self._claim)
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
        if self._connection is not None:
            self._connection.close()

    @property
    def _client(self) -> redis.Redis | RedisCluster:
        with self._lock:
            if self._connection is None:
                self._connection = _client(self.location)
                self._put = self._connection.register_script(PUT_CHUNK)
                self._remove = self._connection.register_script(REMOVE_CHUNK)
            return self._connection

    def connect(self) -> None:
        """Reach the server now and read its manifest, raising what the connection raises: for
        maintenance commands, which fail loudly where a request would serve without the tier."""
        self.guard.call(self._claim)

    # how it was written ------------------------------------------------------------------
    def _claim(self) -> None:
        """Read the namespace's manifest, recording ours where it is new (HSETNX: the first
        worker's wins). Run at opening and whenever the server comes back (it may be a new one)."""
        manifest = self.layout.manifest
        window = self._wanted_window or 16
        shards = self.location.shards or DEFAULT_SHARDS
        pipe = self._client.pipeline(transaction=False)
        pipe.hget(manifest, "match_window")
        pipe.hsetnx(manifest, "schema_version", SCHEMA_VERSION)
        pipe.hsetnx(manifest, "match_window", window)
        pipe.hsetnx(manifest, "shards", shards)
        pipe.hgetall(manifest)
        recorded_window, *_, recorded = pipe.execute()
        recorded = {k.decode(): v.decode() for k, v in recorded.items()}
        if int(recorded.get("schema_version", SCHEMA_VERSION)) != SCHEMA_VERSION:
            raise StoreSettingsError(
                f"{self!r} was written by schema v{recorded['schema_version']}; this version reads v{SCHEMA_VERSION}. "
                "Use another namespace (?namespace=...)"
            )
        if self.location.shards is not None and int(recorded["shards"]) != self.location.shards:
            raise StoreSettingsError(
                f"{self!r} groups its keys in {recorded['shards']} shards; the URL asks for {self.location.shards}. "
                "Leave shards out to use the namespace's, or use another namespace"
            )
        with self._lock:
            self._recorded_window = int(recorded_window) if recorded_window is not None else None
            self.window = int(recorded["match_window"])
            self.layout = KeyLayout(self.location.namespace, int(recorded["shards"]))
            self._ready = True

    @property
    def match_window(self) -> int | None:
        return self._recorded_window

    def recorded_settings(self, model: Fingerprint) -> list[KeySettings]:
        members = self._call(lambda: self._client.smembers(self.layout.settings(model)))
        return sorted((KeySettings.from_json(m.decode()) for m in members), key=lambda s: s.to_json())

    def record_settings(self, model: Fingerprint, settings: KeySettings) -> None:
        self._call(lambda: self._client.sadd(self.layout.settings(model), settings.to_json()))

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
        )

    def _read(self, name: str) -> bytes | None:
        if self.location.ttl_s == 0:
            return self._client.get(name)
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
        args = [data, entry.content_hash, self.location.ttl_s, "1" if entry.prefix_hash is not None else "0"]
        return bool(self._call(lambda: self._put(keys=keys, args=args)))

    def remove(self, key: ContentHash) -> None:
        data = self._call(lambda: self._client.get(self.layout.chunk(key)))
        try:
            record = load_chunk(data, key)[0] if data is not None else None
        except ValueError:
            record = None  # unreadable: its index entries cannot be named; `verify` removes them
        if record is None:
            self._call(lambda: self._client.delete(self.layout.chunk(key)))
            return
        prefix = record.prefix_hash
        keys = self._index_keys(key, prefix, record.tokens, Fingerprint(record.fingerprint))
        self._call(lambda: self._remove(keys=keys, args=[key, "1" if prefix is not None else "0"]))

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
                return [self._client.sunion(keys) for keys in per_group]
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

    # maintenance (scans: never on a request's path) --------------------------------------
    def stats(self) -> list[ModelStats]:
        """Documents, chunks, bytes and pinned chunks per model, from the document records."""
        by_model: dict[str, tuple[int, set[bytes]]] = {}
        for key in self._scan("d"):
            text = self._call(lambda: self._client.get(key))
            if text is None:
                continue
            record = json.loads(text)
            documents, chunks = by_model.get(record["fingerprint"], (0, set()))
            by_model[record["fingerprint"]] = (documents + 1, chunks | {bytes.fromhex(c) for c in record["chunks"]})
        rows = []
        for fingerprint, (documents, chunks) in sorted(by_model.items()):
            sizes, ttls = self._sizes_and_ttls(chunks)
            present = [s for s in sizes if s]
            pinned = sum(1 for s, t in zip(sizes, ttls) if s and t == -1)
            rows.append(ModelStats(fingerprint[:16], documents, len(present), sum(present), pinned))
        return rows

    def total_bytes(self) -> int:
        return sum(self._sizes_and_ttls([self.layout.hex_of(k) for k in self._scan("c")])[0])

    def prune(self, budget_bytes: int) -> int:
        """Remove least recently used, unpinned chunks until their bytes fit the budget."""
        chunks = [self.layout.hex_of(k) for k in self._scan("c")]
        sizes, ttls = self._sizes_and_ttls(chunks)
        total = sum(sizes)

        def idle_times() -> list[int | None]:
            pipe = self._client.pipeline(transaction=False)
            for chunk in chunks:
                pipe.object("idletime", self.layout.chunk(chunk))
            return pipe.execute(raise_on_error=False)

        idle = self._call(idle_times)
        order = sorted(
            (i for i, ttl in enumerate(ttls) if ttl != -1 and sizes[i]),
            key=lambda i: -(idle[i] if isinstance(idle[i], int) else 0),
        )
        evicted = 0
        for i in order:
            if total <= budget_bytes:
                break
            self.remove(ContentHash(chunks[i]))
            total -= sizes[i]
            evicted += 1
        return evicted

    def verify(self) -> RedisVerifyReport:
        """Load every chunk (checksums), drop the bad ones, and remove index entries that name
        chunks no longer there (evicted or expired)."""
        report = RedisVerifyReport()
        for key in self._scan("c"):
            report.checked += 1
            content = ContentHash(self.layout.hex_of(key))
            if self.get(content) is None:
                report.dropped.append(content.hex())
        for key in self._scan("p"):
            content = self._call(lambda: self._client.get(key))
            if content is not None and not self._call(lambda: self._client.exists(self.layout.chunk(content))):
                self._call(lambda: self._client.delete(key))
                report.postings_removed += 1
        for key in self._scan("w"):
            members = self._call(lambda: self._client.smembers(key))
            gone = [m for m in members if not self._call(lambda m=m: self._client.exists(self.layout.chunk(m)))]
            if gone:
                self._call(lambda: self._client.srem(key, *gone))
                report.postings_removed += len(gone)
        return report

    def _scan(self, kind: str) -> list[bytes]:
        pattern = self.layout.pattern(kind)
        if isinstance(self._client, RedisCluster):
            return self._call(
                lambda: list(self._client.scan_iter(match=pattern, count=1000, target_nodes=RedisCluster.PRIMARIES))
            )
        return self._call(lambda: list(self._client.scan_iter(match=pattern, count=1000)))

    def _sizes_and_ttls(self, chunks: Iterable[bytes]) -> tuple[list[int], list[int]]:
        chunks = list(chunks)

        def query() -> list[int]:
            pipe = self._client.pipeline(transaction=False)
            for chunk in chunks:
                pipe.strlen(self.layout.chunk(chunk))
                pipe.ttl(self.layout.chunk(chunk))
            return pipe.execute()

        replies = self._call(query) if chunks else []
        return list(replies[0::2]), list(replies[1::2])

    def _call(self, operation: Callable[[], T]) -> T:
        """An operation on the server, after its manifest is read (a tier opened while Redis was
        down learns the namespace's layout before its first write)."""

        def ready_then() -> T:
            if not self._ready:
                self._claim()
            return operation()

        return self.guard.call(ready_then)


def _client(location: RedisLocation) -> redis.Redis | RedisCluster:
    extra = {"password": location.password} if location.password else {}
    if location.cluster:
        return RedisCluster.from_url(location.client_url, **extra)
    return redis.Redis.from_url(location.client_url, **extra)
