"""Opening the store an engine's settings name: memory only, or memory over a directory, a
Redis URL, or both (comma-separated), looked up in that order: memory, disk, Redis."""

from __future__ import annotations

import functools
import sqlite3
import warnings

import torch

from ..config import EngineConfig
from ..plan.keys import Fingerprint, KeySpace
from .chunk_store import ChunkStore
from .disk import DiskStore
from .location import StoreLocations
from .settings import KeySettings, StoreSettingsError, reconcile
from .tier import ChunkTier


def open_store(config: EngineConfig, model: Fingerprint, device: torch.device) -> tuple[ChunkStore, EngineConfig]:
    """The store and the config to run with: a persistent store's recorded settings are adopted
    where the config left them at their defaults (see `settings.reconcile`)."""
    locations = StoreLocations.parse(config.store)
    tiers: list[ChunkTier] = []
    try:
        # NOTE: each tier reconciled as it opens, so the next one is opened with the settings
        # (the match window) the ones before it hold.
        if locations.directory is not None:
            disk = _open_disk(locations.directory, config, device)
            if disk is not None:
                tiers.append(disk)
                config = reconcile(config, *_recorded(disk, model), str(disk))
        if locations.redis_url is not None:
            try:
                from .redis import RedisStore  # NOTE: redis-py is an extra; imported only where a URL asks for it
            except ImportError as error:
                raise ImportError(f"a Redis store needs: pip install 'kvboost-rag[redis]' ({error})") from None
            remote = RedisStore(locations.redis_url, config.match_window, device)
            tiers.append(remote)
            window = config.match_window
            config = reconcile(config, *_recorded(remote, model), str(remote))
            if config.match_window != window:
                raise StoreSettingsError(
                    f"{remote} indexes windows of {config.match_window} tokens, the directory {window}: "
                    "a store's tiers must share one match window (use another namespace)"
                )
    except (StoreSettingsError, ImportError):
        for tier in tiers:
            tier.close()
        raise
    return ChunkStore(config.memory_budget_bytes, config.match_window, tiers=tiers), config


def _recorded(tier: ChunkTier, model: Fingerprint) -> tuple[list[KeySettings], int | None]:
    """The tier's recorded settings and window; none where it cannot be read now (a Redis server
    down: the tier is tried again later, and serves nothing it cannot check)."""
    try:
        return tier.recorded_settings(model), tier.match_window
    except StoreSettingsError:
        raise
    except Exception as error:  # noqa: BLE001 - the cache is optional: an unreadable tier costs reuse only
        warnings.warn(f"kvboost-rag: the settings of {tier} cannot be read ({error}); opened with the engine's")
        return [], None


def _open_disk(root: str, config: EngineConfig, device: torch.device) -> DiskStore | None:
    try:
        return DiskStore(root, config.match_window, device, config.disk_budget_bytes)
    except (OSError, sqlite3.DatabaseError) as error:
        # NOTE: the cache is optional: a store that cannot be opened costs reuse, never the engine.
        warnings.warn(
            f"kvboost-rag: chunk store {root} cannot be opened ({error}); chunks are kept in memory only. "
            "`kvboost-rag cache verify` checks and rebuilds it.",
            stacklevel=4,
        )
        return None


def record_settings(
    store: ChunkStore, model: Fingerprint, keys: KeySpace, config: EngineConfig, name: str = ""
) -> bool:
    """Write down, in every persistent tier, the settings documents of `model` are about to be
    stored with, and `name` for the fingerprints chunks of `keys` carry (a namespace's), which
    `cache stats` shows; False where a tier could not be written (a warning; tried again at the
    next warm)."""
    settings = KeySettings.of(config)

    def write(tier: ChunkTier) -> bool:
        tier.record_settings(model, settings)
        if name:
            tier.record_names(keys.entry_fingerprints, name)
        return True

    return all(store.safely(t, "recording settings", functools.partial(write, t), False) for t in store.tiers)
