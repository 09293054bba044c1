"""The Redis tier: a chunk store shared by many workers (see `tier.py`)."""

from .location import RedisLocation, is_redis_url
from .tier import RedisStore

__all__ = ["RedisLocation", "RedisStore", "is_redis_url"]
