"""The Redis tier: a chunk store shared by many workers (see `tier.py`).

`RedisStore` (which loads chunks, with torch) is imported on first use (`kvboost_rag/lazy.py`), so
`cache stats` reads a namespace's records (`maintenance.model_stats`) without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports
from ..location import RedisLocation

if TYPE_CHECKING:
    from .tier import RedisStore

__all__ = ["RedisLocation", "RedisStore"]
__getattr__, __dir__ = lazy_exports(__name__, {"RedisStore": ".tier"})
