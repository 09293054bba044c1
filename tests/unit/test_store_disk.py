"""The disk tier on fake entries in tmp_path: round trips, checksums, index, documents, prune, meta."""

from __future__ import annotations

import sqlite3
import warnings
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from kvboost_rag.ops.quantization import QuantizedTensor, quantize_keys, quantize_values
from kvboost_rag.plan.keys import ContentHash, prefix_hash, window_keys
from kvboost_rag.store.disk import DiskStore
from kvboost_rag.store.disk.index import INDEX_SCHEMA_VERSION, DiskIndex, StoreVersionError
from kvboost_rag.store.entry import ALONE, DocumentRecord, WarmedAfter, value_norm
from kvboost_rag.store.settings import KeySettings


@pytest.fixture()
def disk(tmp_path: Path):
    store = DiskStore(tmp_path / "store", match_window=4)
    yield store
    store.close()


def sql(root: Path, statement: str, *params) -> list[tuple]:
    with closing(sqlite3.connect(root / "index.sqlite")) as db, db:
        return db.execute(statement, params).fetchall()


def chunk_file(store: DiskStore, entry) -> Path:
    name = entry.content_hash.hex()
    return store.root / "kv" / name[:2] / f"{name}.safetensors"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dense_entries_round_trip(fakes, disk, dtype) -> None:
    tokens = fakes.tokens(16, band=1)
    entry = replace(
        fakes.entry(tokens, base_position=32, prefix=prefix_hash(fakes.model_fp, None, tokens), importance=1.5),
        next_chunk=b"n" * 32,
        warmed_after=WarmedAfter(24, (ContentHash(b"a" * 32),), "all-MiniLM-L6-v2, 4 nearest"),
    )
    entry = replace(entry, keys=entry.keys.to(dtype), values=entry.values.to(dtype))
    assert disk.put(entry)
    assert not disk.put(entry), "there already"
    for loaded in (disk.get(entry.content_hash), disk.get_exact(entry.prefix_hash)):
        assert loaded is not None
        assert loaded.keys.dtype == dtype and torch.equal(loaded.keys, entry.keys)
        assert torch.equal(loaded.values, entry.values)
        assert loaded.tokens.dtype == np.int64 and np.array_equal(loaded.tokens, tokens)
        assert loaded.base_position == 32 and loaded.importance == 1.5
        assert loaded.warmed_after == entry.warmed_after
        assert (loaded.content_hash, loaded.prefix_hash, loaded.next_chunk) == (
            entry.content_hash,
            entry.prefix_hash,
            entry.next_chunk,
        )
        assert loaded.fingerprint == fakes.doc_fp
    assert disk.get(b"x" * 32) is None and disk.get_exact(b"y" * 32) is None


@pytest.mark.parametrize(("key_kind", "value_kind"), [("int8", "int8"), ("int4", "int4"), ("int8", "int4")])
def test_quantized_entries_round_trip(fakes, disk, key_kind, value_kind) -> None:
    tokens = fakes.tokens(15, band=1)
    dense = fakes.kv(15, dtype=torch.float16), fakes.kv(15, dtype=torch.float16)
    entry = replace(
        fakes.entry(tokens), keys=quantize_keys(dense[0], key_kind), values=quantize_values(dense[1], value_kind)
    )
    assert disk.put(entry)
    loaded = disk.get(entry.content_hash)
    assert loaded is not None
    for stored, original in ((loaded.keys, entry.keys), (loaded.values, entry.values)):
        assert isinstance(stored, QuantizedTensor)
        assert (stored.bits, stored.shape, stored.dtype) == (original.bits, original.shape, torch.float16)
        assert torch.equal(stored.codes, original.codes)
        assert torch.equal(stored.scale, original.scale) and torch.equal(stored.zero, original.zero)
    keys, values = loaded.dense_kv()
    assert torch.equal(keys, entry.keys.dequantize()) and torch.equal(values, entry.values.dequantize())
    assert keys.shape == dense[0].shape


def corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[-1] ^= 0xFF  # the last byte of tensor data: the header still parses
        path.write_bytes(bytes(data))
    elif how == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "delete":
        path.unlink()


@pytest.mark.parametrize("how", ["flip", "truncate", "delete"])
def test_a_corrupted_chunk_is_dropped_with_a_warning_and_never_served(fakes, disk, how) -> None:
    entry, neighbour = fakes.entry(fakes.tokens(16, band=1)), fakes.entry(fakes.tokens(16, band=2))
    disk.put(entry)
    disk.put(neighbour)
    corrupt(chunk_file(disk, entry), how)
    with pytest.warns(UserWarning, match="dropping corrupted chunk"):
        assert disk.get(entry.content_hash) is None
    assert not disk.contains(entry.content_hash)
    assert not chunk_file(disk, entry).exists()
    assert disk.window_hits(window_keys(fakes.doc_fp, entry.tokens, 4)) == [], "its windows are unindexed"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert disk.get(entry.content_hash) is None, "gone: no second warning"
        assert disk.get(neighbour.content_hash) is not None


def test_a_file_holding_another_chunk_is_rejected(fakes, disk) -> None:
    a, b = fakes.entry(fakes.tokens(16, band=1)), fakes.entry(fakes.tokens(16, band=2))
    disk.put(a)
    disk.put(b)
    chunk_file(disk, a).write_bytes(chunk_file(disk, b).read_bytes())
    with pytest.warns(UserWarning, match="not the chunk the index names"):
        assert disk.get(a.content_hash) is None
    assert disk.get(b.content_hash) is not None


def test_verify_drops_bad_chunks_and_removes_orphans(fakes, disk) -> None:
    good, bad = fakes.entry(fakes.tokens(16, band=1)), fakes.entry(fakes.tokens(16, band=2))
    disk.put(good)
    disk.put(bad)
    corrupt(chunk_file(disk, bad), "flip")
    orphan = disk.root / "kv" / "ab" / "orphan.safetensors"
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"partial")
    with pytest.warns(UserWarning):
        report = disk.verify(orphan_age_s=0)
    assert report.checked == 2 and report.dropped == [bad.content_hash.hex()]
    assert report.orphans_removed == 1 and not orphan.exists()
    assert disk.contains(good.content_hash) and chunk_file(disk, good).exists()


def test_window_hits_name_the_chunks_holding_the_windows(fakes, disk) -> None:
    a, b = fakes.document(40, band=1), fakes.document(20, band=2)
    for e in a.entries + b.entries:
        disk.put(e)
    keys = window_keys(fakes.doc_fp, a.tokens, 4)
    hits = disk.window_hits(keys)
    assert sorted(hits) == sorted(e.content_hash for e in a.entries)
    assert disk.window_hits(keys[1:4]) == [], "only windows at multiples of the match window are indexed"
    assert disk.window_hits(window_keys(fakes.doc_fp, b.tokens[16:20], 4)) == [b.entries[1].content_hash]
    assert disk.window_hits(window_keys(fakes.model_fp, a.tokens, 4)) == [], "another fingerprint"
    assert disk.window_hits([]) == []


def test_documents_are_complete_while_every_chunk_is_stored(fakes, disk) -> None:
    document = fakes.document(40, band=1)
    for e in document.entries:
        disk.put(e)
    key = document.record.doc_key
    assert not disk.has_document(key)
    disk.put_document(document.record)
    assert disk.has_document(key)
    disk.remove(document.entries[1].content_hash)
    assert not disk.has_document(key)
    assert not chunk_file(disk, document.entries[1]).exists()
    assert not disk.pin_document(b"unknown")


def test_prune_evicts_least_recently_used_unpinned_chunks_to_the_budget(fakes, disk) -> None:
    pinned = fakes.document(32, band=1)
    for e in pinned.entries:
        disk.put(e)
    disk.put_document(pinned.record)
    assert disk.pin_document(pinned.record.doc_key)
    others = [fakes.entry(fakes.tokens(16, band=i + 2)) for i in range(4)]
    for e in others:
        disk.put(e)
    disk.touch([others[0].content_hash])  # now the most recently used
    size = chunk_file(disk, others[1]).stat().st_size  # the four others' files are alike in size
    budget = disk.total_bytes() - 2 * size
    assert disk.prune(budget) == 2
    assert disk.total_bytes() <= budget
    assert [disk.contains(e.content_hash) for e in others] == [True, False, False, True]
    assert disk.has_document(pinned.record.doc_key)
    assert disk.prune(0) == 2, "every unpinned chunk goes; pinned ones stay"
    assert disk.has_document(pinned.record.doc_key) and disk.total_bytes() > 0
    stats = disk.stats()
    assert len(stats) == 1 and (stats[0].chunks, stats[0].pinned_chunks, stats[0].documents) == (2, 2, 1)


def test_a_budget_is_enforced_after_each_document(fakes, tmp_path) -> None:
    first = fakes.document(16, band=1)
    probe = DiskStore(tmp_path / "probe", match_window=4)
    probe.put(first.entries[0])
    size = probe.total_bytes()
    probe.close()
    store = DiskStore(tmp_path / "store", match_window=4, budget_bytes=3 * size)
    documents = [fakes.document(16, band=i + 1) for i in range(6)]
    for d in documents:
        store.put(d.entries[0])
        store.put_document(d.record)
        assert store.total_bytes() <= 3 * size
    assert store.has_document(documents[-1].record.doc_key)
    assert not store.has_document(documents[0].record.doc_key)
    store.close()


def test_schema_version_and_match_window_are_recorded(tmp_path) -> None:
    root = tmp_path / "store"
    store = DiskStore(root, match_window=8)
    assert store.match_window is None, "a new store"
    assert store.window == 8
    assert store.index.meta("schema_version") == str(INDEX_SCHEMA_VERSION)
    assert store.index.meta("match_window") == "8"
    store.close()
    assert dict(sql(root, "SELECT name, value FROM meta")) == {
        "schema_version": str(INDEX_SCHEMA_VERSION),
        "match_window": "8",
    }


def test_a_store_opened_with_another_window_keeps_its_recorded_one(fakes, tmp_path) -> None:
    root = tmp_path / "store"
    DiskStore(root, match_window=8).close()
    store = DiskStore(root, match_window=4)
    assert (store.match_window, store.window) == (8, 8)
    entry = fakes.entry(fakes.tokens(16, band=1))
    store.put(entry)
    assert store.window_hits(window_keys(fakes.doc_fp, entry.tokens, 8)) == [entry.content_hash]
    assert store.window_hits(window_keys(fakes.doc_fp, entry.tokens, 4)) == []
    store.close()
    reopened = DiskStore(root)
    assert (reopened.match_window, reopened.window) == (8, 8)
    reopened.close()


def test_a_new_store_without_a_window_gets_the_default(tmp_path) -> None:
    DiskStore(tmp_path / "s").close()
    store = DiskStore(tmp_path / "s")
    assert (store.match_window, store.window) == (16, 16)
    store.close()


def test_a_store_from_a_newer_schema_is_refused(tmp_path) -> None:
    root = tmp_path / "store"
    DiskStore(root).close()
    sql(root, "UPDATE meta SET value = ? WHERE name = 'schema_version'", str(INDEX_SCHEMA_VERSION + 1))
    with pytest.raises(StoreVersionError, match="upgrade"):
        DiskStore(root)


def test_a_v1_store_with_entries_is_read_with_the_window_of_16(fakes, tmp_path) -> None:
    root = tmp_path / "store"
    store = DiskStore(root, match_window=16)
    store.put(fakes.entry(fakes.tokens(16, band=1)))
    store.close()
    sql(root, "DELETE FROM meta")  # as a store from before the schema was recorded
    index = DiskIndex(root / "index.sqlite")
    assert (index.meta("schema_version"), index.meta("match_window")) == (str(INDEX_SCHEMA_VERSION), "16")
    index.close()
    store = DiskStore(root, match_window=4)
    assert store.window == 16
    store.close()


def test_an_empty_v1_store_takes_the_window_it_is_opened_with(tmp_path) -> None:
    root = tmp_path / "store"
    DiskStore(root, match_window=16).close()
    sql(root, "DELETE FROM meta")
    store = DiskStore(root, match_window=4)
    assert (store.match_window, store.window) == (None, 4)
    store.close()


def test_settings_are_recorded_per_model(fakes, disk) -> None:
    first = KeySettings("fixed", 128, 16, None, "")
    second = KeySettings("semantic", 64, 8, "int8", "Context:")
    assert disk.recorded_settings(fakes.model_fp) == []
    disk.record_settings(fakes.model_fp, first)
    disk.record_settings(fakes.model_fp, second)
    disk.record_settings(fakes.model_fp, first)
    assert disk.recorded_settings(fakes.model_fp) == [first, second]
    assert disk.recorded_settings(fakes.doc_fp) == []


def test_a_document_record_names_its_chunks_in_order(fakes, disk) -> None:
    document = fakes.document(50, band=1)
    disk.put_document(document.record)
    assert disk.index.document_chunks(document.record.doc_key) == list(document.record.chunks)
    replaced = DocumentRecord(document.record.doc_key, fakes.doc_fp, document.record.chunks[:1], 16)
    disk.put_document(replaced)
    assert disk.index.document_chunks(document.record.doc_key) == [document.record.chunks[0]]


def test_an_unset_importance_does_not_come_back_as_zero(fakes, disk) -> None:
    entry = fakes.entry(fakes.tokens(16, band=1), importance=None)
    disk.put(entry)
    loaded = disk.get(entry.content_hash)
    assert loaded.importance is None or loaded.importance == pytest.approx(value_norm(entry.values))


def test_a_chunk_written_before_warming_was_recorded_reads_as_warmed_alone(fakes, disk) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    entry = replace(fakes.entry(fakes.tokens(16, band=3)), warmed_after=WarmedAfter(40, (ContentHash(b"a" * 32),)))
    assert disk.put(entry)
    path = chunk_file(disk, entry)
    with safe_open(str(path), "pt") as handle:
        metadata = dict(handle.metadata())
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    for older, dropped, read_as in (
        ("named no neighbours", ("neighbours", "found_by"), WarmedAfter(40)),
        ("recorded no warming", ("context_tokens",), ALONE),
    ):
        for key in dropped:
            del metadata[key]  # as an older kvboost-rag wrote it
        save_file(tensors, str(path), metadata=metadata)
        loaded = disk.get(entry.content_hash)
        assert loaded is not None and loaded.warmed_after == read_as, older
    assert WarmedAfter(40).neighbour_in(set()), "neighbours not named: taken as present, as before"


def scanned(store: DiskStore) -> list[tuple]:
    """The totals as a scan of every row finds them (what `stats` read before it kept totals)."""
    return sorted((bytes(fp), *rest) for fp, *rest in store.index._scanned_totals())


def kept(store: DiskStore) -> list[tuple]:
    return sorted((bytes(fp), *rest) for fp, *rest in sql(store.root, "SELECT * FROM totals WHERE chunks OR documents"))


def test_stats_are_kept_totals_equal_to_a_scan_through_writes_pins_and_prunes(fakes, disk) -> None:
    documents = [fakes.document(40, band=i + 1) for i in range(4)]
    for d in documents:
        for e in d.entries:
            disk.put(e)
        disk.put_document(d.record)
    assert kept(disk) == scanned(disk) and disk.stats()[0].documents == 4
    disk.pin_document(documents[0].record.doc_key)
    disk.put_document(documents[1].record)  # recorded again: still one document
    disk.remove(documents[2].entries[0].content_hash)  # no longer whole
    assert kept(disk) == scanned(disk)
    stats = disk.stats()[0]
    assert stats.documents == 3 and stats.pinned_chunks == len(documents[0].entries)
    disk.prune(0)
    assert kept(disk) == scanned(disk) and disk.stats()[0].documents == 1, "the pinned one"
    assert disk.total_bytes() == disk.stats()[0].bytes == sum(row[2] for row in scanned(disk))


def test_an_index_of_schema_2_is_upgraded_once_to_the_same_totals(fakes, tmp_path) -> None:
    root = tmp_path / "store"
    store = DiskStore(root, match_window=4)
    documents = [fakes.document(40, band=i + 1) for i in range(3)]
    for d in documents:
        for e in d.entries:
            store.put(e)
        store.put_document(d.record)
    store.remove(documents[1].entries[0].content_hash)
    expected = store.stats()
    store.close()
    for statement in (
        "DROP TABLE totals",
        "DROP TABLE document_chunks",
        "UPDATE meta SET value = '2' WHERE name = 'schema_version'",
    ):
        sql(root, statement)  # as kvboost-rag wrote it before the totals
    read_only = DiskIndex(root / "index.sqlite", read_only=True)
    assert not read_only.has_totals and read_only.stats() == expected, "scanned where it cannot be upgraded"
    read_only.close()
    upgraded = DiskStore(root)
    assert upgraded.index.meta("schema_version") == str(INDEX_SCHEMA_VERSION)
    assert upgraded.stats() == expected and kept(upgraded) == scanned(upgraded)
    upgraded.close()


def test_verify_and_prune_walk_the_store_a_page_at_a_time(fakes, disk, monkeypatch) -> None:
    from kvboost_rag.store.disk import index as index_module

    monkeypatch.setattr(index_module, "PAGE", 2)
    entries = [fakes.entry(fakes.tokens(16, band=i + 1)) for i in range(5)]
    for e in entries:
        disk.put(e)
    pages = list(disk.index.key_pages())
    assert [len(p) for p in pages] == [2, 2, 1] and {k for p in pages for k in p} == {e.content_hash for e in entries}
    assert disk.verify(orphan_age_s=0).checked == 5
    assert disk.index.least_recently_used(3) == disk.index.least_recently_used(3)[:3]
    assert disk.prune(0) == 5 and disk.total_bytes() == 0
