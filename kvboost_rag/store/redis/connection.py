"""The Redis tier's connection to its namespace: the client, the manifest, every call guarded.

The client is made on first use (a cluster asks its nodes then), with the chunk scripts of
`scripts.py` registered on it. Before the first call on a server the namespace's manifest is
read, ours recorded where it is new (HSETNX: the first worker's wins), and read again whenever
the server answers after an outage (it may be a new one). Every call goes through the
`ConnectionGuard`: a lost server is a `RedisUnavailable` until it answers again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar, cast

import redis
from redis.cluster import RedisCluster

from ..location import DEFAULT_SHARDS, RedisLocation
from ..settings import SCHEMA_VERSION, StoreSettingsError
from .guard import ConnectionGuard
from .layout import KeyLayout
from .scripts import CLAIM_DOCUMENT, PUT_CHUNK, RELEASE_DOCUMENT, REMOVE_CHUNK

T = TypeVar("T")

# NOTE: redis-py types a reply `bytes | str` (it cannot tell whether a client decodes responses);
# ours are made without decode_responses, so their replies are bytes. These only say so to mypy.


def bytes_reply(reply: bytes | str | None) -> bytes | None:
    return cast("bytes | None", reply)


def bytes_members(members: set[bytes | str]) -> set[bytes]:
    return cast("set[bytes]", members)


class NamespaceConnection:
    """One namespace on a Redis server or cluster, as its manifest records it. Thread-safe."""

    def __init__(self, location: RedisLocation, match_window: int | None, label: str) -> None:
        """`match_window` is recorded for a new namespace (16 when None); `label` names the tier
        in errors."""
        self.location = location
        self.label = label
        self._wanted_window = match_window
        self.guard = ConnectionGuard(f"Redis at {location.redacted()}", location.retry_after_s, self.claim)
        self._lock = threading.Lock()
        self._connection: redis.Redis | RedisCluster | None = None  # made on first use (a cluster asks its nodes)
        self._ready = False  # the manifest has been read (and claimed) on this server
        self.recorded_window: int | None = None  # the namespace's before we opened it; None for a new one
        self.window = match_window or 16
        self.layout = KeyLayout(location.namespace, location.shards or DEFAULT_SHARDS)

    @property
    def client(self) -> redis.Redis | RedisCluster:
        with self._lock:
            if self._connection is None:
                self._connection = _client(self.location)
                self.put_chunk = self._connection.register_script(PUT_CHUNK)
                self.remove_chunk = self._connection.register_script(REMOVE_CHUNK)
                self.claim_document = self._connection.register_script(CLAIM_DOCUMENT)
                self.release_document = self._connection.register_script(RELEASE_DOCUMENT)
            return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()

    def connect(self) -> None:
        """Reach the server now and read its manifest, raising what the connection raises."""
        self.guard.call(self.claim)

    def claim(self) -> None:
        """Read the namespace's manifest, recording ours where it is new. Run at opening and
        whenever the server comes back."""
        manifest = self.layout.manifest
        window = self._wanted_window or 16
        shards = self.location.shards or DEFAULT_SHARDS
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(manifest, "match_window")
        pipe.hsetnx(manifest, "schema_version", SCHEMA_VERSION)
        pipe.hsetnx(manifest, "match_window", window)
        pipe.hsetnx(manifest, "shards", shards)
        pipe.hgetall(manifest)
        recorded_window, *_, recorded = pipe.execute()
        recorded = {k.decode(): v.decode() for k, v in recorded.items()}
        if int(recorded.get("schema_version", SCHEMA_VERSION)) != SCHEMA_VERSION:
            raise StoreSettingsError(
                f"{self.label} was written by schema v{recorded['schema_version']}; this version reads "
                f"v{SCHEMA_VERSION}. Use another namespace (?namespace=...)"
            )
        if self.location.shards is not None and int(recorded["shards"]) != self.location.shards:
            raise StoreSettingsError(
                f"{self.label} groups its keys in {recorded['shards']} shards; the URL asks for "
                f"{self.location.shards}. Leave shards out to use the namespace's, or use another namespace"
            )
        with self._lock:
            self.recorded_window = int(recorded_window) if recorded_window is not None else None
            self.window = int(recorded["match_window"])
            self.layout = KeyLayout(self.location.namespace, int(recorded["shards"]))
            self._ready = True

    def call(self, operation: Callable[[], T]) -> T:
        """An operation on the server, after its manifest is read (a tier opened while Redis was
        down learns the namespace's layout before its first write)."""

        def ready_then() -> T:
            if not self._ready:
                self.claim()
            return operation()

        return self.guard.call(ready_then)

    def scan(self, kind: str) -> list[bytes]:
        """Every key of one kind in the namespace, on every primary of a cluster (maintenance only)."""
        pattern = self.layout.pattern(kind)
        client = self.client
        if isinstance(client, RedisCluster):
            return self.call(
                lambda: list(client.scan_iter(match=pattern, count=1000, target_nodes=RedisCluster.PRIMARIES))
            )
        return self.call(lambda: list(client.scan_iter(match=pattern, count=1000)))


def namespace_exists(location: RedisLocation) -> bool:
    """Whether anything was ever written in the namespace (it has a manifest), asked without
    claiming it: maintenance commands on a mistyped namespace create nothing."""
    client = _client(location)
    try:
        return bool(client.exists(KeyLayout(location.namespace, DEFAULT_SHARDS).manifest))
    finally:
        client.close()


def _client(location: RedisLocation) -> redis.Redis | RedisCluster:
    extra = {"password": location.password} if location.password else {}
    if location.cluster:
        return RedisCluster.from_url(location.client_url, **extra)
    return redis.Redis.from_url(location.client_url, **extra)
