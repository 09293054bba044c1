"""The persistent disk tier: an SQLite index beside one checksummed file per chunk.

`DiskStore` (which loads chunks, with torch) is imported on first use (`kvboost_rag/lazy.py`), so
`summary` reads a store's index without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports
from .index import ModelStats

if TYPE_CHECKING:
    from .tier import DiskStore, VerifyReport

__all__ = ["DiskStore", "ModelStats", "VerifyReport"]
__getattr__, __dir__ = lazy_exports(__name__, {"DiskStore": ".tier", "VerifyReport": ".tier"})
