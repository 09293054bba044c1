"""Faults in the store never break a request nor serve wrong KV: each answer equals full prefill's."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvboost_rag import ChunkStore, EngineConfig, ExactnessConfig, KVBoostRAG
from kvboost_rag.store.disk import DiskStore


def tiny(model_dir: Path, store: str | Path, **options: object) -> KVBoostRAG:
    return KVBoostRAG.from_pretrained(model_dir, dtype="float32", store=str(store), **options)


def prompt_of(documents: list[str]) -> str:
    return "\n\n".join(reversed(documents)) + "\n\nQuestion: what do these say?\nAnswer:"


# Every token read from moved KV verified on exact KV: whatever the store serves or fails to
# serve, the answer must be full prefill's to the token.
VERIFIED = ExactnessConfig(verify_margin=1.0, refresh=False)


def assert_answers_as_full_prefill(engine: KVBoostRAG, prompt: str) -> None:
    full = engine.generate(prompt, mode="full", max_new_tokens=6, store_prompt=False)
    served = engine.generate(prompt, exactness=VERIFIED, max_new_tokens=6)
    assert served.token_ids == full.token_ids


@contextlib.contextmanager
def mounted(*args: str) -> Iterator[None]:
    """A mount for the test's duration; skipped where this process may not mount (not root)."""
    target = args[-1]
    if subprocess.run(["mount", *args], capture_output=True).returncode != 0:
        pytest.skip("mount is not permitted here")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", target], capture_output=True)


def overwrite_middle(index: Path) -> None:
    """4 KB of the index file overwritten, where its pages of rows and keys are."""
    data = bytearray(index.read_bytes())
    assert len(data) > 12 * 1024, "the index holds enough pages to damage one in the middle"
    middle = len(data) // 2
    data[middle : middle + 4096] = b"\xff" * 4096
    index.write_bytes(bytes(data))


def test_int4_chunks_are_never_exact_hits_of_an_unquantized_engine(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str]
) -> None:
    """Prefix hashes hold the quantization: a prompt that starts with an int4-warmed document
    finds no chunk in an engine that keeps dense KV, even on the very same store; the int4
    engine finds its own as APPROXIMATE (quantized KV is not what full prefill computes)."""
    disk = DiskStore(tmp_path / "store")
    shared = ChunkStore(2**30, 16, tiers=[disk])
    quantized = KVBoostRAG.from_pretrained(tiny_model_dir, dtype="float32", store="memory", kv_quantization="int4")
    int4 = KVBoostRAG(quantized.model, quantized.tokenizer, EngineConfig(kv_quantization="int4"), store=shared)
    int4.warm(passages[:2])
    plain = KVBoostRAG(quantized.model, quantized.tokenizer, EngineConfig(), store=shared)
    prompt = passages[0] + "\n\nQuestion: who?"
    result = plain.generate(prompt, max_new_tokens=4, store_prompt=False)
    assert result.reused_exact_tokens == 0 and result.reused_approximate_tokens == 0
    own = int4.generate(prompt, max_new_tokens=1, store_prompt=False)
    assert own.reused_exact_tokens == 0 < own.reused_approximate_tokens, "its own are found, never as EXACT"
    full = plain.generate(prompt, mode="full", max_new_tokens=4, store_prompt=False)
    assert result.token_ids == full.token_ids


def test_a_read_only_store_serves_lookups(tiny_model_dir: Path, tmp_path: Path, passages: list[str]) -> None:
    source, view = tmp_path / "store", tmp_path / "read-only"
    writer = tiny(tiny_model_dir, source)
    writer.warm(passages[:3])
    writer.store.close()  # as a pre-built store is: its writer gone, its index checkpointed
    view.mkdir()
    with mounted("--bind", str(source), str(view)), mounted("-o", "remount,bind,ro", str(view)):
        with pytest.warns(UserWarning, match="read-only"):
            engine = tiny(tiny_model_dir, view)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no store error: writes are skipped, not attempted
            result = engine.generate(prompt_of(passages[:3]), max_new_tokens=4)
            assert result.reused_approximate_tokens > 0
            assert engine.warm(passages[3:5]).documents == 2  # encoded, kept in memory only
        stats = subprocess.run(
            [sys.executable, "-m", "kvboost_rag.cli", "cache", "stats", "--store", str(view)],
            capture_output=True,
            text=True,
        )
        assert stats.returncode == 0 and "(empty)" not in stats.stdout


def test_a_full_disk_is_logged_and_leaves_no_partial_file(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "small"
    store.mkdir()
    with mounted("-t", "tmpfs", "-o", "size=400k", "tmpfs", str(store)):
        engine = tiny(tiny_model_dir, store)
        with caplog.at_level("WARNING", logger="kvboost_rag.store"):
            report = engine.warm(passages[:12])  # far more than 400 KB of chunks
        assert report.documents == 12 and report.store_errors > 0
        failed = [r.getMessage() for r in caplog.records if r.name == "kvboost_rag.store"]
        assert failed and all("failed" in line and "served without it" in line for line in failed), failed
        assert not list(store.rglob("*.tmp")), "a failed write removes its temporary file"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the index's LRU updates may fail too: warnings only
            assert_answers_as_full_prefill(engine, prompt_of(passages[:4]))
            fresh = tiny(tiny_model_dir, store)
            assert_answers_as_full_prefill(fresh, prompt_of(passages[:4]))
        verify = cli("cache", "verify", "--store", str(store))
        assert verify.returncode == 0 and "0 dropped" in verify.stdout, verify.stdout + verify.stderr


def test_a_corrupted_index_never_fails_a_request(tiny_model_dir: Path, tmp_path: Path, passages: list[str]) -> None:
    store = tmp_path / "store"
    writer = tiny(tiny_model_dir, store)
    writer.warm(passages[:6])
    writer.store.tiers[0].close()
    reader = tiny(tiny_model_dir, store)
    overwrite_middle(store / "index.sqlite")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(3):
            assert_answers_as_full_prefill(reader, prompt_of(passages[i : i + 3]))


def test_the_disk_budget_holds_chunk_by_chunk(tiny_model_dir: Path, tmp_path: Path, passages: list[str]) -> None:
    probe = tiny(tiny_model_dir, tmp_path / "probe")
    probe.warm(passages[:2])
    two_documents = DiskStore(tmp_path / "probe").total_bytes()
    engine = tiny(tiny_model_dir, tmp_path / "store", disk_budget_bytes=two_documents)
    engine.warm(passages[:10])
    assert DiskStore(tmp_path / "store").total_bytes() <= two_documents


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvboost_rag.cli", *args], capture_output=True, text=True)


@pytest.mark.parametrize("damage", ["overwritten", "deleted"])
def test_cache_verify_rebuilds_a_damaged_index(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str], damage: str
) -> None:
    store = tmp_path / "store"
    writer = tiny(tiny_model_dir, store, chunk_size=64)
    writer.warm(passages[:6])
    writer.store.tiers[0].close()  # the last connection checkpoints the WAL into the index file
    chunks = DiskStore(store).stats()[0].chunks
    if damage == "deleted":
        for suffix in ("", "-wal", "-shm"):
            (store / f"index.sqlite{suffix}").unlink(missing_ok=True)
    else:
        overwrite_middle(store / "index.sqlite")
    verify = cli("cache", "verify", "--store", str(store))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert f"rebuilt {chunks} chunks and 6 documents" in verify.stdout
    assert "0 dropped" in verify.stdout and "Traceback" not in verify.stderr
    reader = tiny(tiny_model_dir, store)  # the rebuilt store keeps its settings: chunk_size adopted
    assert reader.config.chunk_size == 64
    assert reader.warm(passages[:6]).skipped_documents == 6, "every document is known again"
    assert_answers_as_full_prefill(reader, prompt_of(passages[:3]))
    assert cli("cache", "stats", "--store", str(store)).returncode == 0


def test_cache_commands_on_a_damaged_index_say_so_without_a_traceback(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str]
) -> None:
    store = tmp_path / "store"
    writer = tiny(tiny_model_dir, store)
    writer.warm(passages[:6])
    writer.store.close()
    overwrite_middle(store / "index.sqlite")
    for command in (["stats"], ["prune", "--budget", "0"]):
        done = cli("cache", *command, "--store", str(store))
        assert "Traceback" not in done.stderr, done.stderr
        assert done.returncode == 0 or "cache verify" in done.stderr
    assert cli("cache", "verify", "--store", str(store)).returncode == 0


@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_at_a_random_point_then_verify_and_resume(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str], seed: int
) -> None:
    """A warm killed anywhere: nothing half-written is served, `cache verify` finds the store
    whole, answers equal full prefill's, and warming again completes it."""
    documents = [f"{p}\nCopy {i}." for i in range(4) for p in passages[:30]]
    data = tmp_path / "docs.jsonl"
    data.write_text("\n".join(json.dumps({"title": "", "text": d}) for d in documents))
    store = tmp_path / "store"
    args = ["warm", str(data), "--store", str(store), "--model", str(tiny_model_dir), "--dtype", "float32"]
    args += ["--neighbours", "0"]  # the store under faults: no embedder to load
    process = subprocess.Popen([sys.executable, "-m", "kvboost_rag.cli", *args], stderr=subprocess.DEVNULL)
    kill_after = random.Random(seed).randint(1, 150)  # chunk files written before the kill
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if len(list((store / "kv").rglob("*.safetensors"))) >= kill_after:
            break
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    verify = cli("cache", "verify", "--store", str(store))
    assert verify.returncode == 0 and "0 dropped" in verify.stdout, verify.stdout + verify.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_answers_as_full_prefill(tiny(tiny_model_dir, store), prompt_of(documents[:3]))
    resumed = cli(*args)
    assert resumed.returncode == 0, resumed.stderr
    assert DiskStore(store).stats()[0].documents == len(set(documents))


def test_rewarming_restores_what_redis_lost_from_memory_without_a_model_pass(
    tiny_model_dir: Path, passages: list[str]
) -> None:
    """Memory saying "warm" is not enough: a document Redis lost (a restart without persistence,
    FLUSHALL) is written there again from the memory tier's KV when it is warmed again."""
    from kvboost_rag.testing.redis_server import local_redis

    with local_redis() as server:
        engine = tiny(tiny_model_dir, server.url)
        assert engine.warm(passages[:3]).encoded_documents == 3
        server.client().flushall()
        report = engine.warm(passages[:3])
        assert report.restored_documents == 3 and report.tokens_encoded == 0, report
        fresh = tiny(tiny_model_dir, server.url)  # another worker: finds them in Redis again
        again = fresh.warm(passages[:3])
        assert again.skipped_documents == 3 and again.restored_documents == 0 and again.tokens_encoded == 0
        assert_answers_as_full_prefill(fresh, prompt_of(passages[:3]))
