"""What a `store` value names: a directory, a Redis URL, or one of each (memory, then disk, then
Redis); and a Redis URL's parts.

A Redis tier's URL is redis-py's own (`redis://`, `rediss://` for TLS, `unix://`) with our
options in its query string, so one string names the tier everywhere (`store=`, `--store`).

Our options: `namespace` (key prefix, default "kvboost"), `shards` (hash-tag groups of a new
namespace, default 16), `ttl` (seconds an unpinned, unused chunk lives, default 7 days; 0 keeps
it until Redis evicts it), `cluster` (true: a Redis Cluster), `retry_after` (seconds a lost
server is left alone before the next try, default 5). Every other query option is redis-py's
(`socket_timeout`, ...). The password is the URL's or, where it has none, the
KVBOOST_RAG_REDIS_PASSWORD environment variable's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

SCHEMES = ("redis", "rediss", "unix")
PASSWORD_ENV = "KVBOOST_RAG_REDIS_PASSWORD"
DEFAULT_SHARDS = 16
DEFAULT_TTL_S = 7 * 24 * 3600
# NOTE: short, so a dead server costs a request one timeout, not many; redis-py's default waits forever.
DEFAULT_TIMEOUTS = {"socket_timeout": "2", "socket_connect_timeout": "1"}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_Default = TypeVar("_Default", int, None)  # what _integer gives when the option is absent


def is_redis_url(location: str) -> bool:
    return urlsplit(location).scheme in SCHEMES and "://" in location


@dataclass(slots=True, frozen=True)
class RedisLocation:
    client_url: str  # what redis-py is given: our options removed, timeouts defaulted
    namespace: str = "kvboost"
    shards: int | None = None  # None: the namespace's recorded count (DEFAULT_SHARDS for a new one)
    ttl_s: int = DEFAULT_TTL_S
    cluster: bool = False
    retry_after_s: float = 5.0
    password: str | None = None  # from the environment, when the URL has none

    @classmethod
    def parse(cls, url: str) -> RedisLocation:
        """The location a URL names; ValueError naming the part that is wrong."""
        parts = urlsplit(url)
        if parts.scheme not in SCHEMES:
            raise ValueError(f"a Redis store URL starts with redis://, rediss:// or unix://, got {url!r}")
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        ours: dict[str, str] = {
            name: query.pop(name) for name in ("namespace", "shards", "ttl", "cluster", "retry_after") if name in query
        }
        namespace = ours.get("namespace", "kvboost")
        if not namespace or any(c in namespace for c in "{}*?[]\\: "):
            raise ValueError(
                f"namespace must be non-empty, without braces, colons, spaces or glob characters: {namespace!r}"
            )
        shards = _integer(ours, "shards", None, minimum=1)
        ttl = _integer(ours, "ttl", DEFAULT_TTL_S, minimum=0)
        retry = float(ours.get("retry_after", 5.0))
        cluster = ours.get("cluster", "false").lower()
        if cluster not in _TRUE + _FALSE:
            raise ValueError(f"cluster must be true or false, got {ours['cluster']!r}")
        if parts.scheme != "unix" and not parts.hostname:
            raise ValueError(f"a Redis store URL names a host: {url!r}")
        client_query = urlencode({**DEFAULT_TIMEOUTS, **query})
        password = None if parts.password else os.environ.get(PASSWORD_ENV) or None
        return cls(
            urlunsplit(parts._replace(query=client_query)),
            namespace,
            shards,
            ttl,
            cluster in _TRUE,
            retry,
            password,
        )

    def redacted(self) -> str:
        """The URL without its password, for messages."""
        parts = urlsplit(self.client_url)
        if parts.password is None:
            return urlunsplit(parts._replace(query=""))
        host = parts.netloc.rsplit("@", 1)[1]
        user = parts.username or ""
        return urlunsplit(parts._replace(netloc=f"{user}:***@{host}", query=""))


@dataclass(slots=True, frozen=True)
class StoreLocations:
    """What `EngineConfig.store` names: a directory, a Redis URL, or one of each."""

    directory: str | None
    redis_url: str | None

    @classmethod
    def parse(cls, store: str | None) -> StoreLocations:
        """None is the user cache directory's store; ValueError for two of one kind or a bad URL."""
        from ..config import MEMORY_ONLY
        from ..paths import default_store_dir

        if store is None:
            return cls(str(default_store_dir()), None)
        parts = [part.strip() for part in store.split(",") if part.strip()] if store != MEMORY_ONLY else []
        urls = [part for part in parts if is_redis_url(part)]
        directories = [part for part in parts if not is_redis_url(part)]
        if len(urls) > 1 or len(directories) > 1:
            raise ValueError(f"store names at most one directory and one Redis URL, got {store!r}")
        for url in urls:
            RedisLocation.parse(url)  # its options checked before anything is opened
        if directories and "://" in directories[0]:
            raise ValueError(f"store {directories[0]!r} is neither a directory nor a redis:// or rediss:// URL")
        return cls(directories[0] if directories else None, urls[0] if urls else None)


def _integer(options: dict[str, str], name: str, default: _Default, minimum: int) -> int | _Default:
    if name not in options:
        return default
    try:
        value = int(options[name])
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {options[name]!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value
