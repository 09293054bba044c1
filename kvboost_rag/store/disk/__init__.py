"""The persistent disk tier: an SQLite index beside one checksummed file per chunk."""

from .index import ModelStats
from .tier import DiskStore, VerifyReport

__all__ = ["DiskStore", "ModelStats", "VerifyReport"]
