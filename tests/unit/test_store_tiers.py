"""Every persistent tier answers the whole `ChunkTier` protocol, maintenance (stats, prune)
included: the chunk store, the server and the CLI use any tier without probing what it can do."""

from __future__ import annotations

import inspect
from dataclasses import asdict
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from kvboost_rag.server import create_app
from kvboost_rag.store.chunk_store import ChunkStore
from kvboost_rag.store.disk import DiskStore
from kvboost_rag.store.tier import ChunkTier, ModelStats

WINDOW = 4
PROTOCOL = sorted(name for name in vars(ChunkTier) if not name.startswith("_"))


def tier_class(kind: str) -> type:
    if kind == "disk":
        return DiskStore
    pytest.importorskip("redis", reason="the Redis tier needs redis-py (the [redis] extra)")
    from kvboost_rag.store.redis import RedisStore

    return RedisStore


def test_the_protocol_holds_the_maintenance_calls() -> None:
    assert {"stats", "prune", "get", "put", "window_hits", "match_window"} <= set(PROTOCOL)


@pytest.mark.parametrize("kind", ["disk", "redis"])
def test_every_tier_answers_the_whole_protocol(kind: str) -> None:
    tier = tier_class(kind)
    for name in PROTOCOL:
        wanted = inspect.getattr_static(ChunkTier, name)
        found = inspect.getattr_static(tier, name, None)
        assert found is not None, f"{tier.__name__} lacks {name}"
        if isinstance(wanted, property):
            assert isinstance(found, property), f"{tier.__name__}.{name} is a property in the protocol"
            continue
        assert callable(found), f"{tier.__name__}.{name}"
        expected = list(inspect.signature(wanted).parameters)
        assert list(inspect.signature(found).parameters)[: len(expected)] == expected, f"{tier.__name__}.{name}"


def test_the_server_reports_and_prunes_a_disk_tier(fakes, tmp_path) -> None:
    """The store routes call every tier's stats and prune (no model: the app over a bare store)."""
    kept, dropped = fakes.document(32, band=1), fakes.document(48, band=2)
    disk = DiskStore(tmp_path, match_window=WINDOW)
    store = ChunkStore(1 << 20, WINDOW, tiers=[disk])
    for document in (kept, dropped):
        for entry in document.entries:
            assert store.put(entry)
        store.add_document(document.record)
    assert store.pin_document(kept.record.doc_key)
    fake = SimpleNamespace(name="fake", store=store, batcher=SimpleNamespace(listeners=[], running=0, max_running=8))
    client = TestClient(create_app(fake))  # type: ignore[arg-type]

    report = client.get("/kvboost/store")
    assert report.status_code == 200
    (tier,) = report.json()["persistent"]
    (model,) = tier["models"]
    assert tier["tier"] == "DiskStore" and (model["documents"], model["chunks"], model["pinned_chunks"]) == (2, 5, 2)
    assert tier["models"] == [asdict(s) for s in disk.stats()]

    pruned = client.post("/kvboost/store/prune", json={"budget_bytes": 0})
    assert pruned.status_code == 200 and pruned.json() == {"evicted_chunks": 3}, "pinned chunks stay"
    (after,) = disk.stats()
    assert isinstance(after, ModelStats) and (after.chunks, after.pinned_chunks) == (2, 2)
    assert disk.has_document(kept.record.doc_key) and not disk.has_document(dropped.record.doc_key)
    disk.close()
