"""The Redis tier's maintenance: stats, prune and verify, by scanning the namespace's keys.

Scans (SCAN on every primary of a cluster) are never on a request's path. A chunk's size and TTL
are read in one pipeline; a chunk without a TTL is pinned, so prune never takes it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from ...plan.keys import ContentHash
from ..tier import ModelStats
from .connection import NamespaceConnection, bytes_members, bytes_reply

if TYPE_CHECKING:
    from ..entry import ChunkEntry


@dataclass(slots=True)
class RedisVerifyReport:
    checked: int = 0
    dropped: list[str] = field(default_factory=list)
    postings_removed: int = 0  # index entries naming chunks that are gone


def model_stats(connection: NamespaceConnection) -> list[ModelStats]:
    """Documents (those whose chunks are all stored), chunks, bytes and pinned chunks per model,
    from the document records."""
    by_model: dict[str, list[set[bytes]]] = {}
    for key in connection.scan("d"):
        text = connection.call(lambda: connection.client.get(key))
        if text is None:
            continue
        record = json.loads(text)
        by_model.setdefault(record["fingerprint"], []).append({bytes.fromhex(c) for c in record["chunks"]})
    recorded = cast("dict[bytes, bytes]", connection.call(lambda: connection.client.hgetall(connection.layout.models)))
    names = {k.decode(): v.decode() for k, v in recorded.items()}
    rows = []
    for fingerprint, documents in sorted(by_model.items()):
        chunks = list(set().union(*documents))
        sizes, ttls = _sizes_and_ttls(connection, chunks)
        stored = {chunk for chunk, size in zip(chunks, sizes) if size}
        complete = sum(1 for document in documents if document <= stored)  # evicted chunks: not whole
        pinned = sum(1 for s, t in zip(sizes, ttls) if s and t == -1)
        name = names.get(fingerprint, "")
        rows.append(ModelStats(fingerprint[:16], complete, len(stored), sum(sizes), pinned, name))
    return rows


def total_bytes(connection: NamespaceConnection) -> int:
    return sum(_sizes_and_ttls(connection, [connection.layout.hex_of(k) for k in connection.scan("c")])[0])


def prune(connection: NamespaceConnection, budget_bytes: int, remove: Callable[[ContentHash], None]) -> int:
    """Remove (with `remove`: a chunk and its index entries) least recently used, unpinned chunks
    until their bytes fit the budget."""
    chunks = [connection.layout.hex_of(k) for k in connection.scan("c")]
    sizes, ttls = _sizes_and_ttls(connection, chunks)
    total = sum(sizes)

    def idle_times() -> list[int | None]:
        pipe = connection.client.pipeline(transaction=False)
        for chunk in chunks:
            pipe.object("idletime", connection.layout.chunk(chunk))
        return pipe.execute(raise_on_error=False)

    idle = [seconds if isinstance(seconds, int) else 0 for seconds in connection.call(idle_times)]
    order = sorted((i for i, ttl in enumerate(ttls) if ttl != -1 and sizes[i]), key=lambda i: -idle[i])
    evicted = 0
    for i in order:
        if total <= budget_bytes:
            break
        remove(ContentHash(chunks[i]))
        total -= sizes[i]
        evicted += 1
    return evicted


def verify(connection: NamespaceConnection, load: Callable[[ContentHash], ChunkEntry | None]) -> RedisVerifyReport:
    """Load every chunk with `load` (which checks and drops a bad one), and remove index entries
    that name chunks no longer there (evicted or expired)."""
    report = RedisVerifyReport()
    for key in connection.scan("c"):
        report.checked += 1
        content = ContentHash(connection.layout.hex_of(key))
        if load(content) is None:
            report.dropped.append(content.hex())
    for key in connection.scan("p"):
        posted = bytes_reply(connection.call(lambda: connection.client.get(key)))
        if posted is not None and not connection.call(lambda: _exists(connection, posted)):
            connection.call(lambda: connection.client.delete(key))
            report.postings_removed += 1
    for key in connection.scan("w"):
        members = bytes_members(connection.call(lambda: connection.client.smembers(key)))
        gone = [m for m in members if not _exists_now(connection, m)]
        if gone:
            connection.call(lambda: connection.client.srem(key, *gone))
            report.postings_removed += len(gone)
    return report


def _exists(connection: NamespaceConnection, content: bytes) -> bool:
    return bool(connection.client.exists(connection.layout.chunk(content)))


def _exists_now(connection: NamespaceConnection, content: bytes) -> bool:
    """`_exists`, as a guarded call."""
    return connection.call(lambda: _exists(connection, content))


def _sizes_and_ttls(connection: NamespaceConnection, chunks: Iterable[bytes]) -> tuple[list[int], list[int]]:
    chunks = list(chunks)

    def query() -> list[int]:
        pipe = connection.client.pipeline(transaction=False)
        for chunk in chunks:
            pipe.strlen(connection.layout.chunk(chunk))
            pipe.ttl(connection.layout.chunk(chunk))
        return pipe.execute()

    replies = connection.call(query) if chunks else []
    return list(replies[0::2]), list(replies[1::2])
