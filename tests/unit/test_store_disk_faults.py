"""The disk tier under a running process whose index is deleted or replaced, pins across a
rebuild, stray files, whole documents in stats, and a tier that lost a document memory holds."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from kvboost_rag.store.chunk_store import ChunkStore
from kvboost_rag.store.disk import DiskStore
from kvboost_rag.store.disk.recovery import verify_store


def put_document(store: DiskStore, document) -> None:
    for entry in document.entries:
        store.put(entry)
    store.put_document(document.record)


def index_files(root: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        (root / f"index.sqlite{suffix}").unlink(missing_ok=True)


def test_an_index_deleted_under_a_running_store_is_rebuilt_before_the_next_write(fakes, tmp_path: Path) -> None:
    root = tmp_path / "store"
    running = DiskStore(root, match_window=4)
    first, second = fakes.document(40, band=1), fakes.document(40, band=2)
    put_document(running, first)
    index_files(root)  # deleted by hand while the process runs
    with pytest.warns(UserWarning, match="index was deleted: rebuilt from the chunk files"):
        put_document(running, second)
    assert running.has_document(first.record.doc_key) and running.has_document(second.record.doc_key)
    running.close()
    fresh = DiskStore(root)
    assert fresh.has_document(first.record.doc_key) and fresh.has_document(second.record.doc_key), "nothing lost"
    assert fresh.stats()[0].documents == 2
    assert fresh.orphan_files() == 0
    fresh.close()


def test_an_index_rebuilt_by_verify_is_reopened_and_later_writes_are_not_strays(fakes, tmp_path: Path) -> None:
    root = tmp_path / "store"
    running = DiskStore(root, match_window=4)
    first, second = fakes.document(40, band=1), fakes.document(40, band=2)
    put_document(running, first)
    index_files(root)
    report = verify_store(root)  # `cache verify` in another process: a new index from the files
    assert report.index_damage == ["the index is missing"] and report.rebuilt_documents == 1
    with pytest.warns(UserWarning, match="index was replaced: reopened"):
        put_document(running, second)
    running.close()
    again = verify_store(root, orphan_age_s=0)
    assert again.verify.orphans_removed == 0 and again.verify.adopted == 0, "the running store wrote into it"
    fresh = DiskStore(root)
    assert fresh.has_document(second.record.doc_key)
    fresh.close()


def test_pins_survive_an_index_rebuild_and_prune_keeps_them(fakes, tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = DiskStore(root, match_window=4)
    pinned, other = fakes.document(48, band=1), fakes.document(48, band=2)
    put_document(store, pinned)
    put_document(store, other)
    assert store.pin_document(pinned.record.doc_key)
    store.close()
    index_files(root)
    assert verify_store(root).rebuilt_documents == 2
    store = DiskStore(root)
    assert store.stats()[0].pinned_chunks == len(pinned.entries)
    store.prune(0)
    assert store.has_document(pinned.record.doc_key) and not store.has_document(other.record.doc_key)
    store.close()


def test_stats_count_only_documents_whose_chunks_are_all_stored(fakes, tmp_path: Path) -> None:
    disk = DiskStore(tmp_path / "store", match_window=4)
    documents = [fakes.document(48, band=b) for b in (1, 2, 3)]
    for document in documents:
        put_document(disk, document)
    disk.remove(documents[0].entries[1].content_hash)  # as prune does
    stats = disk.stats()[0]
    assert stats.documents == 2 and stats.chunks == 3 * 3 - 1
    disk.close()


def test_verify_indexes_old_stray_chunks_again_and_keeps_young_files(fakes, tmp_path: Path) -> None:
    root = tmp_path / "store"
    source = DiskStore(tmp_path / "elsewhere", match_window=4)
    document = fakes.document(32, band=1)
    put_document(source, document)
    store = DiskStore(root, match_window=4)
    for entry in document.entries:  # chunk files a writer put here, indexed into an index since lost
        name = entry.content_hash.hex()
        target = root / "kv" / name[:2] / f"{name}.safetensors"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((source.root / "kv" / name[:2] / f"{name}.safetensors").read_bytes())
    shutil.copytree(source.root / "documents", root / "documents")  # the document's record beside them
    partial = root / "kv" / "zz" / ".abc.safetensors.999999999.1.tmp"
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(b"half")
    young = store.verify()  # default grace: every stray is young, nothing touched
    assert young.adopted == 0 and young.orphans_removed == 0 and partial.exists()
    old = time.time() - 3600
    for path in (root / "kv").rglob("*"):
        if path.is_file():
            os.utime(path, (old, old))
    report = store.verify()
    assert report.adopted == len(document.entries) and report.orphans_removed == 1 and not partial.exists()
    assert store.has_document(document.record.doc_key)
    store.close()
    source.close()


def test_a_document_memory_holds_is_written_again_to_a_tier_that_lost_it(fakes, tmp_path: Path) -> None:
    disk = DiskStore(tmp_path / "store", match_window=4)
    store = ChunkStore(2**30, 4, tiers=[disk])
    document = fakes.document(48, band=1)
    for entry in document.entries:
        store.memory.put(entry)  # as after a write that failed: memory only
    store.memory.add_document(document.record)
    assert not disk.has_document(document.record.doc_key)
    assert store.complete_document(document.record) == "restored"
    assert disk.has_document(document.record.doc_key)
    assert store.complete_document(document.record) == "warm"
    disk.close()
    empty = ChunkStore(2**30, 4, tiers=[DiskStore(tmp_path / "other", match_window=4)])
    assert empty.complete_document(document.record) == "missing"
