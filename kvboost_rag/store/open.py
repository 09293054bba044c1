"""Opening the store an engine's settings name: memory only, or memory over a directory."""

from __future__ import annotations

import sqlite3
import warnings

import torch

from ..config import EngineConfig
from ..paths import default_store_dir
from ..plan.keys import Fingerprint
from .disk import DiskStore
from .memory import ChunkStore
from .settings import KeySettings, StoreSettingsError, reconcile


def open_store(config: EngineConfig, model: Fingerprint, device: torch.device) -> tuple[ChunkStore, EngineConfig]:
    """The store and the config to run with: a persistent store's recorded settings are adopted
    where the config left them at their defaults (see `settings.reconcile`)."""
    if config.memory_only:
        return ChunkStore(config.memory_budget_bytes, config.match_window), config
    root = config.store or str(default_store_dir())
    try:
        disk = DiskStore(root, config.match_window, device, config.disk_budget_bytes)
    except (OSError, sqlite3.DatabaseError) as error:
        # NOTE: the cache is optional: a store that cannot be opened costs reuse, never the engine.
        warnings.warn(
            f"kvboost-rag: chunk store {root} cannot be opened ({error}); chunks are kept in memory only. "
            "`kvboost-rag cache verify` checks and rebuilds it.",
            stacklevel=3,
        )
        return ChunkStore(config.memory_budget_bytes, config.match_window), config
    try:
        config = reconcile(config, disk.recorded_settings(model), disk.match_window, str(disk.root))
    except StoreSettingsError:
        disk.close()
        raise
    return ChunkStore(config.memory_budget_bytes, config.match_window, tiers=[disk]), config


def record_settings(store: ChunkStore, model: Fingerprint, config: EngineConfig) -> None:
    """Write down, in every persistent tier, the settings documents are about to be stored with."""
    settings = KeySettings.of(config)
    for tier in store.tiers:
        tier.record_settings(model, settings)
