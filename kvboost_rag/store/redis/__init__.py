"""The Redis tier: a chunk store shared by many workers (see `tier.py`)."""

from ..location import RedisLocation
from .tier import RedisStore

__all__ = ["RedisLocation", "RedisStore"]
