"""Writers warming one store at once claim documents, so none is encoded twice (issue 55): the
disk index's claims, the warmer waiting for or deferring documents another writer holds, threads
and processes warming one corpus with no shards."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from kvboost_rag import EngineConfig, KVBoostRAG
from kvboost_rag.engine import warming
from kvboost_rag.engine.warming import Warmer
from kvboost_rag.plan.keys import ContentHash, document_hash
from kvboost_rag.store.claims import claimant
from kvboost_rag.store.disk import DiskStore
from kvboost_rag.store.disk.index import DiskIndex

CLI = [sys.executable, "-m", "kvboost_rag.cli"]


def on_disk(tiny_model_dir: Path, store: Path) -> KVBoostRAG:
    return KVBoostRAG.from_pretrained(tiny_model_dir, dtype="float32", config=EngineConfig(store=str(store)))


def doc_key(engine: KVBoostRAG, text: str) -> bytes:
    return document_hash(engine.document_fingerprint, engine.tokenizer(text, add_special_tokens=False).input_ids)


def test_a_disk_claim_is_one_writers_until_released_or_lapsed(tmp_path: Path) -> None:
    index, other = DiskIndex(tmp_path / "index.sqlite"), DiskIndex(tmp_path / "index.sqlite")  # two processes
    assert index.claim([b"a", b"b"], "one", 60) == [True, True]
    assert other.claim([b"a", b"c"], "two", 60) == [False, True], "a stands; c is free"
    assert index.claim([b"a"], "one", 60) == [True], "renewed by its own writer"
    other.release([b"a"], "two")  # not its claim: nothing freed
    assert other.claim([b"a"], "two", 60) == [False]
    index.release([b"a"], "one")
    assert other.claim([b"a"], "two", 60) == [True]
    assert index.claim([b"b"], "one", -1) == [True]  # a claim already lapsed: a writer that died
    assert other.claim([b"b"], "two", 60) == [True], "a lapsed claim is taken"
    assert index.claim([b"d"], dead_writer(), 60) == [True]  # killed mid-warm, its claim fresh
    assert other.claim([b"d"], "two", 60) == [True], "a claim of a process of this host that ended is taken"
    assert index.claim([b"e"], claimant(), 60) == [True]
    assert other.claim([b"e"], "two", 60) == [False], "this process is alive"


def dead_writer() -> str:
    """The claim name of a process of this host that has ended."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return f"{socket.gethostname()}:{int(ended.stdout)}:0123abcd"


def test_a_document_another_writer_holds_is_deferred_or_waited_for(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str]
) -> None:
    engine = on_disk(tiny_model_dir, tmp_path / "store")
    held, free = passages[0], passages[1]
    engine.store.claim([doc_key(engine, held)], "another host:1:x", 60)
    report = engine.warm([held, free], wait=False)
    assert (report.deferred_documents, report.encoded_documents, report.skipped_documents) == (1, 1, 0)
    assert not engine.store.has_document(doc_key(engine, held)), "left to the writer holding it"
    report = engine.warm_together([[held, passages[2]]], wait=False)
    assert (report.deferred_documents, report.encoded_documents) == (1, 1), "the group's free member is stored"
    # the other writer finishes (or dies: its claim lapses) while this one waits
    timer = threading.Timer(0.3, lambda: engine.store.release([doc_key(engine, held)], "another host:1:x"))
    timer.start()
    started = time.perf_counter()
    report = engine.warm([held, free])
    assert time.perf_counter() - started >= 0.25, "waited for the claim"
    assert (report.encoded_documents, report.skipped_documents, report.deferred_documents) == (1, 1, 0)
    assert engine.store.has_document(doc_key(engine, held))


def test_threads_warming_one_corpus_encode_each_document_once(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three writers on one disk store, each warming every group at once (model passes slowed, so
    they collide): every document encoded once, the work spread (a group another writer holds is
    come back to at the end, not queued behind), the store equal to one writer's."""
    groups = [passages[i : i + 3] for i in range(0, 18, 3)]
    alone = on_disk(tiny_model_dir, tmp_path / "one")
    alone.warm_together(groups)
    encode_in_turn = Warmer._encode_in_turn

    def slow(self: Warmer, *args: object) -> int:
        time.sleep(0.05)
        return encode_in_turn(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Warmer, "_encode_in_turn", slow)
    monkeypatch.setattr(warming, "CLAIM_POLL_SECONDS", 0.02)
    writers = [on_disk(tiny_model_dir, tmp_path / "shared") for _ in range(3)]
    reports = [None] * 3

    def warm(i: int) -> None:
        reports[i] = writers[i].warm_together(groups)  # type: ignore[call-overload]

    threads = [threading.Thread(target=warm, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sum(r.encoded_documents for r in reports) == 18, [r.encoded_documents for r in reports]  # type: ignore[attr-defined]
    assert all(r.encoded_documents < 18 for r in reports), "the work was shared"  # type: ignore[attr-defined]
    one, shared = DiskStore(tmp_path / "one"), DiskStore(tmp_path / "shared")
    keys = {key for page in one.index.key_pages() for key in page}
    assert keys == {key for page in shared.index.key_pages() for key in page}
    for key in keys:
        a, b = one.get(ContentHash(key)), shared.get(ContentHash(key))
        assert a is not None and b is not None and torch.equal(a.dense_kv()[0], b.dense_kv()[0])


def test_cli_processes_warming_one_corpus_without_shards_encode_each_document_once(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str]
) -> None:
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps({"title": "", "text": p}) for p in passages[:24]))
    model = ["--model", str(tiny_model_dir), "--dtype", "float32", "--neighbours", "2"]
    command = [*CLI, "warm", str(tmp_path / "corpus.jsonl"), "--store", str(tmp_path / "shared"), *model]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    said = [process.communicate(timeout=300) for process in runs]
    assert all(process.returncode == 0 for process in runs), said
    warmed = [int(out.split(" warmed (")[0].rsplit(" ", 1)[-1]) for out, _ in said]
    assert sum(warmed) == 24, said
    assert "tokens/s" in said[0][1], "the progress bar shows the model's tokens a second"
    stats = DiskStore(tmp_path / "shared").stats()
    assert [row.documents for row in stats] == [24], stats
