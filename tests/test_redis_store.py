"""The Redis tier, proven on a real redis-server: shared by workers, atomic, checked, and never a
failed request when Redis fails (killed, restarted, corrupted, evicted), also on a real cluster."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from kvboost_rag import EngineConfig, ExactnessConfig, KVBoostRAG
from kvboost_rag.engine.inputs import can_be_neighbour
from kvboost_rag.neighbours import DEFAULT_NEIGHBOURS, groups_among, nearest_texts
from kvboost_rag.plan.keys import ContentHash, Fingerprint, content_hash, document_hash, window_keys
from kvboost_rag.store.entry import ALONE, ChunkEntry, DocumentRecord, WarmedAfter
from kvboost_rag.store.location import StoreLocations
from kvboost_rag.store.redis import RedisLocation, RedisStore
from kvboost_rag.store.redis.guard import RedisUnavailable
from kvboost_rag.store.redis.layout import KeyLayout
from kvboost_rag.store.settings import StoreSettingsError
from kvboost_rag.testing.redis_server import LocalRedis, local_cluster, local_redis

VERIFIED = ExactnessConfig(verify_margin=1.0, refresh=False)  # every moved token checked: full prefill's answer
AS_LOADED = ExactnessConfig(verify_margin=0.0, refresh=False)  # nothing recomputed: what the tier served, used


@pytest.fixture()
def server() -> Iterator[LocalRedis]:
    with local_redis() as running:
        yield running


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir: Path) -> KVBoostRAG:
    return KVBoostRAG.from_pretrained(tiny_model_dir, dtype="float32", store="memory")


def worker(tiny_engine: KVBoostRAG, store: str, **options: object) -> KVBoostRAG:
    """A worker with an empty memory tier on `store` (the tiny model's weights, shared)."""
    config = EngineConfig.from_options(store=store, **options)
    return KVBoostRAG(tiny_engine.model, tiny_engine.tokenizer, config, name=tiny_engine.name)


def prompt_of(documents: list[str]) -> str:
    return "Read these.\n\n" + "\n\n".join(reversed(documents)) + "\n\nQuestion: what do these say?\nAnswer:"


def reader_key(engine: KVBoostRAG, text: str) -> bytes:
    """The document key `warm` stores a text under."""
    return document_hash(engine.document_fingerprint, engine.tokenizer(text, add_special_tokens=False).input_ids)


def chunk_keys(server: LocalRedis) -> list[bytes]:
    return sorted(server.client().scan_iter(match="{kvboost:*}:c:*"))


def entry_of(tokens: list[int], fingerprint: bytes = b"m" * 8, **fields: object) -> ChunkEntry:
    import torch

    n = len(tokens)
    keys = torch.arange(2 * 2 * n * 4, dtype=torch.float32).reshape(2, 2, n, 4)
    return ChunkEntry(
        tokens=np.asarray(tokens, np.int64),
        keys=keys,
        values=keys + 1,
        base_position=0,
        fingerprint=Fingerprint(fingerprint),
        content_hash=content_hash(Fingerprint(fingerprint), tokens),
        prefix_hash=None,
        **fields,  # type: ignore[arg-type]
    )


# the URL and the layout ------------------------------------------------------------------------
def test_a_url_names_the_tier_and_bad_ones_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    location = RedisLocation.parse("rediss://worker:s3cret@cache.internal:6380/2?namespace=rag&ttl=0&shards=4")
    assert (location.namespace, location.ttl_s, location.shards, location.cluster) == ("rag", 0, 4, False)
    assert "s3cret" not in location.redacted() and "cache.internal:6380/2" in location.redacted()
    assert "namespace" not in location.client_url and "socket_timeout=2" in location.client_url
    monkeypatch.setenv("KVBOOST_RAG_REDIS_PASSWORD", "from-env")
    assert RedisLocation.parse("redis://localhost:6379/0").password == "from-env"
    assert RedisLocation.parse("redis://:inline@localhost:6379/0").password is None, "the URL's wins"
    for bad, named in [
        ("redis://localhost/0?shards=0", "shards"),
        ("redis://localhost/0?ttl=soon", "ttl"),
        ("redis://localhost/0?namespace={x}", "namespace"),
        ("redis://localhost/0?cluster=maybe", "cluster"),
        ("http://localhost:6379", "redis://"),
    ]:
        with pytest.raises(ValueError, match=named):
            RedisLocation.parse(bad)
    assert StoreLocations.parse("/data/kv, redis://h:1/0") == StoreLocations("/data/kv", "redis://h:1/0")
    with pytest.raises(ValueError, match="at most one"):
        StoreLocations.parse("redis://a:1/0,redis://b:1/0")


def test_a_chunk_and_its_index_entries_share_one_hash_slot() -> None:
    from redis.crc import key_slot

    layout = KeyLayout("kvboost", 16)
    content, window, prefix = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
    group = layout.group_of(content)
    slots = {
        key_slot(k.encode())
        for k in (layout.chunk(content), layout.window(group, window), layout.prefix(group, prefix))
    }
    assert len(slots) == 1
    assert len({key_slot(layout.chunk(bytes([i]) * 32).encode()) for i in range(64)}) > 8, "groups spread over slots"


# the tier itself ----------------------------------------------------------------------------------
def test_chunks_round_trip_with_their_index_in_every_format(server: LocalRedis) -> None:
    import torch

    from kvboost_rag.ops.quantization import quantize_keys, quantize_values

    tier = RedisStore(server.url, match_window=4)
    for i, kind in enumerate([None, "int8", "int4", "bf16"]):
        warmed = WarmedAfter(7 * i, (ContentHash(bytes([i]) * 32),), f"nearest {i}") if i else ALONE
        entry = entry_of(list(range(10 * i, 10 * i + 12)), warmed_after=warmed)
        if kind == "bf16":
            entry = entry_of(list(range(10 * i, 10 * i + 12)))
            entry.keys, entry.values = entry.keys.to(torch.bfloat16), entry.values.to(torch.bfloat16)
        elif kind:
            entry.keys, entry.values = quantize_keys(entry.keys, kind), quantize_values(entry.values, kind)
        assert tier.put(entry) and not tier.put(entry), "a second put finds it there"
        loaded = tier.get(entry.content_hash)
        assert loaded is not None and np.array_equal(loaded.tokens, entry.tokens)
        assert loaded.warmed_after == entry.warmed_after, "how it was warmed travels with it"
        assert torch.equal(loaded.dense_kv()[0], entry.dense_kv()[0])
        windows = window_keys(entry.fingerprint, entry.tokens, 4)
        assert tier.window_hits([windows[4]]) == [entry.content_hash], "found by a window at any offset"
    assert tier.window_hits([]) == [] and tier.get(ContentHash(b"\0" * 32)) is None


def test_documents_pins_and_the_namespace_manifest(server: LocalRedis) -> None:
    tier = RedisStore(server.url + "?ttl=3600", match_window=8)
    entries = [entry_of(list(range(k, k + 16))) for k in (0, 100)]
    for entry in entries:
        tier.put(entry)
    record = DocumentRecord(b"d" * 32, entries[0].fingerprint, tuple(e.content_hash for e in entries), 32)
    tier.put_document(record)
    assert tier.has_document(record.doc_key) and not tier.has_document(b"x" * 32)
    client = server.client()
    chunk = tier.layout.chunk(entries[0].content_hash)
    assert 0 < client.ttl(chunk) <= 3600
    tier.pin_document(record.doc_key)
    assert client.ttl(chunk) == -1, "pinned: no TTL, so volatile-lru never evicts it"
    tier.touch([entries[0].content_hash])
    assert client.ttl(chunk) == -1, "use renews TTLs, never unpins"
    tier.pin_document(record.doc_key, pinned=False)
    assert client.ttl(chunk) > 0
    (stats,) = tier.stats()
    assert (stats.documents, stats.chunks) == (1, 2) and stats.bytes > 0
    client.delete(chunk)
    assert not tier.has_document(record.doc_key), "a document is complete only while all its chunks are"
    again = RedisStore(server.url)
    assert (again.match_window, again.window) == (8, 8), "the first worker's window is the namespace's"
    with pytest.raises(StoreSettingsError, match="shards"):
        RedisStore(server.url + "?shards=3")


# workers sharing one corpus -------------------------------------------------------------------------
def test_a_fresh_worker_reuses_a_corpus_another_warmed(
    tiny_engine: KVBoostRAG, server: LocalRedis, passages: list[str]
) -> None:
    writer = worker(tiny_engine, server.url)
    report = writer.warm(passages[:4])
    assert report.store_errors == 0 and len(chunk_keys(server)) == report.chunks_stored > 0
    reader = worker(tiny_engine, server.url, repair="none")
    assert reader.store.stats().entries == 0, "an empty memory tier"
    shuffled = [passages[2], passages[0], passages[3], passages[1]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = reader.generate(prompt_of(shuffled), max_new_tokens=4, store_prompt=False, exactness=AS_LOADED)
    document_tokens = sum(len(tiny_engine.tokenizer(p, add_special_tokens=False).input_ids) for p in shuffled)
    # every warmed token read from Redis (at its new offset); only the text around them computed
    assert result.reused_approximate_tokens >= document_tokens - 4 * 2
    assert result.missed_chunks == 0 and result.recomputed_tokens == 0
    served = reader.generate(prompt_of(shuffled), exactness=VERIFIED, max_new_tokens=6, store_prompt=False)
    full = reader.generate(prompt_of(shuffled), mode="full", max_new_tokens=6, store_prompt=False)
    assert served.token_ids == full.token_ids


def test_two_processes_and_four_concurrent_warmers_keep_one_copy(
    tiny_model_dir: Path, tiny_engine: KVBoostRAG, server: LocalRedis, passages: list[str], tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": p}) + "\n" for p in passages[:12]))
    command = [sys.executable, "-m", "kvboost_rag.cli", "warm", str(corpus), "--store", server.url]
    command += ["--model", str(tiny_model_dir), "--dtype", "float32"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    warmers = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)
    ]
    outputs = [w.communicate(timeout=300) for w in warmers]
    assert all(w.returncode == 0 for w in warmers), [o[1][-500:] for o in outputs]
    warmed = [int(out.split(" warmed (")[0].rsplit(" ", 1)[-1]) for out, _ in outputs]
    assert sum(warmed) == 12, f"each document encoded once, by the writer that claimed it: {warmed}"
    tier = RedisStore(server.url)
    in_process = worker(tiny_engine, "memory", repair="none")
    # as `kvboost-rag warm` does by default: groups of mutual neighbours of the corpus
    nearest = dict(zip(passages[:12], nearest_texts(passages[:12], DEFAULT_NEIGHBOURS, can_be_neighbour)))
    in_process.warm_together(groups_among(passages[:12], nearest.__getitem__))
    expected = {entry.content_hash for entry in in_process.store}
    assert {ContentHash(KeyLayout.hex_of(k)) for k in chunk_keys(server)} == expected, "one copy of each chunk"
    assert tier.verify().dropped == [] and tier.verify().postings_removed == 0
    (stats,) = tier.stats()
    assert stats.documents == 12
    reader = worker(tiny_engine, server.url, repair="none")
    prompt = prompt_of([passages[5], passages[1], passages[9]])
    result = reader.generate(prompt, max_new_tokens=3, store_prompt=False, exactness=AS_LOADED)
    local = in_process.generate(prompt, max_new_tokens=3, store_prompt=False, exactness=AS_LOADED)
    assert result.reused_approximate_tokens == local.reused_approximate_tokens > 0, "as if warmed in this process"
    assert {e.warmed_after.context_tokens for e in in_process.store} != {0}, (
        "four workers warmed it as one would, neighbours and all"
    )
    assert result.recomputed_tokens == 0 and result.token_ids == local.token_ids


# faults ----------------------------------------------------------------------------------------------
def test_a_corrupted_truncated_or_misfiled_value_is_dropped_never_served(
    tiny_engine: KVBoostRAG, server: LocalRedis, passages: list[str]
) -> None:
    worker(tiny_engine, server.url).warm(passages[:3])
    client = server.client()
    keys = chunk_keys(server)
    assert len(keys) >= 3
    value = client.get(keys[0])
    client.setrange(keys[0], len(value) // 2, b"\xff" * 64)  # bytes flipped inside the tensors
    client.set(keys[1], client.get(keys[1])[:-1000])  # truncated
    client.set(keys[2], client.get(keys[-1]))  # another chunk's value under this key
    reader = worker(tiny_engine, server.url)
    prompt = prompt_of(passages[:3])
    with pytest.warns(UserWarning, match="corrupted"):
        served = reader.generate(prompt, exactness=VERIFIED, max_new_tokens=6, store_prompt=False)
    full = reader.generate(prompt, mode="full", max_new_tokens=6, store_prompt=False)
    assert served.token_ids == full.token_ids
    redis_tier = reader.store.tiers[0]
    assert isinstance(redis_tier, RedisStore) and redis_tier.counters.dropped == 3
    assert all(client.get(k) is None for k in keys[:3]), "dropped from Redis, to be warmed again"


def test_evicted_keys_are_recomputed_under_maxmemory(tiny_engine: KVBoostRAG, passages: list[str]) -> None:
    with local_redis("--maxmemory", "3mb", "--maxmemory-policy", "volatile-lru") as small:
        engine = worker(tiny_engine, small.url, kv_quantization="dense")  # the bytes the 3 MB are sized for
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # writes refused when only pinned or index keys are left
            report = engine.warm(passages[:30])  # far more than 3 MB of chunks
        assert report.documents == 30
        info = small.client().info("stats")
        assert info["evicted_keys"] > 0, "Redis bounded the memory by evicting chunks"
        tier = RedisStore(small.url)
        evicted = [p for p in passages[:30] if not tier.has_document(reader_key(engine, p))]
        assert len(evicted) >= 3, "some documents lost a chunk to eviction"
        prompt = prompt_of(evicted[:3])
        reader = worker(tiny_engine, small.url)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            served = reader.generate(prompt, exactness=VERIFIED, max_new_tokens=6, store_prompt=False)
        full = reader.generate(prompt, mode="full", max_new_tokens=6, store_prompt=False)
        assert served.token_ids == full.token_ids
        in_process = worker(tiny_engine, "memory")
        in_process.warm(evicted[:3])
        warm = in_process.generate(prompt, max_new_tokens=1, store_prompt=False, exactness=AS_LOADED)
        assert served.reused_approximate_tokens < warm.reused_approximate_tokens, "what was evicted was recomputed"
        redis_tier = reader.store.tiers[0]
        assert isinstance(redis_tier, RedisStore) and redis_tier.counters.missing > 0, "counted"
        assert tier.verify().postings_removed > 0, "index entries of evicted chunks are cleaned up"


def test_redis_killed_mid_warm_and_mid_request_then_back(
    tiny_engine: KVBoostRAG, passages: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    server = LocalRedis()
    server.start()
    try:
        engine = worker(tiny_engine, server.url + "?retry_after=0.2")
        tier = engine.store.tiers[0]
        assert isinstance(tier, RedisStore)
        engine.warm(passages[:2])
        with warnings.catch_warnings(), caplog.at_level("WARNING", logger="kvboost_rag.store"):
            warnings.simplefilter("ignore")  # the tier's own (it is down); its failures are logged
            reports = []
            for i, passage in enumerate(passages[2:12]):
                if i == 4:
                    server.stop()  # Redis dies part way through the warm
                reports.append(engine.warm(passage))
            assert all(r.documents == 1 for r in reports) and sum(r.store_errors for r in reports[4:]) >= 6
            assert engine.store.stats().documents == 12, "warming went on in memory"
            fresh = worker(tiny_engine, server.url + "?retry_after=0.2")  # opened while Redis is down
            prompt = prompt_of(passages[:3])
            answered = fresh.generate(prompt, exactness=VERIFIED, max_new_tokens=6, store_prompt=False)
            assert (
                answered.token_ids
                == fresh.generate(prompt, mode="full", max_new_tokens=6, store_prompt=False).token_ids
            )
            assert fresh.store.tier_errors > 0 and tier.guard.outages == 1
        assert any("failed" in r.getMessage() for r in caplog.records if r.name == "kvboost_rag.store")
        with pytest.raises(redis.ConnectionError):
            tier.contains(ContentHash(b"\0" * 32))
        with pytest.raises(RedisUnavailable):  # not tried again for retry_after: no request waits on timeouts
            tier.contains(ContentHash(b"\0" * 32))
        server.start()  # back, empty (no persistence): the tier reconnects and refills
        time.sleep(0.3)
        with pytest.warns(UserWarning, match="answers again"):
            again = engine.warm(passages[20:22])
        assert again.store_errors == 0 and len(chunk_keys(server)) == again.chunks_stored > 0
        assert server.client().hget("{kvboost:meta}:manifest", "match_window") == b"16", "re-claimed"
    finally:
        server.stop()


# a real Redis Cluster --------------------------------------------------------------------------------
def test_a_three_node_cluster_holds_the_tier(tiny_engine: KVBoostRAG, passages: list[str]) -> None:
    with local_cluster(3) as nodes:
        url = f"redis://127.0.0.1:{nodes[0].port}/0?cluster=true"
        report = worker(tiny_engine, url).warm(passages[:8])
        assert report.store_errors == 0 and report.chunks_stored > 0
        chunks_per_node = [len(list(n.client().scan_iter(match="{kvboost:*}:c:*"))) for n in nodes]
        assert sum(chunks_per_node) == report.chunks_stored and sum(c > 0 for c in chunks_per_node) >= 2
        reader = worker(tiny_engine, url, repair="none")
        shuffled = [passages[6], passages[2], passages[4]]
        result = reader.generate(prompt_of(shuffled), max_new_tokens=3, store_prompt=False, exactness=AS_LOADED)
        assert result.missed_chunks == 0 and result.reused_approximate_tokens > 0 and result.recomputed_tokens == 0
        tier = reader.store.tiers[0]
        assert isinstance(tier, RedisStore) and tier.verify().dropped == []
        assert tier.stats()[0].documents == 8
        documents = [bytes([i]) * 32 for i in range(8)]  # in several hash slots
        assert tier.claim(documents, "one", 60) == [True] * 8
        assert tier.claim(documents[:2], "two", 60) == [False, False]


def test_a_claim_is_one_writers_until_released_or_lapsed(server: LocalRedis) -> None:
    tier, other = RedisStore(server.url), RedisStore(server.url)  # two workers
    assert tier.claim([b"a" * 32, b"b" * 32], "one", 60) == [True, True]
    assert other.claim([b"a" * 32, b"c" * 32], "two", 60) == [False, True], "a stands; c is free"
    assert tier.claim([b"a" * 32], "one", 60) == [True], "renewed by its own writer"
    other.release([b"a" * 32], "two")  # not its claim: nothing freed
    assert other.claim([b"a" * 32], "two", 60) == [False]
    tier.release([b"a" * 32], "one")
    assert other.claim([b"a" * 32], "two", 60) == [True]
    assert tier.claim([b"b" * 32], "one", 0.05) == [True]
    time.sleep(0.1)  # a writer that died: its claim lapses
    assert other.claim([b"b" * 32], "two", 60) == [True], "a lapsed claim is taken"
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert tier.claim([b"d" * 32], f"{socket.gethostname()}:{int(ended.stdout)}:x", 60) == [True]
    assert other.claim([b"d" * 32], "two", 60) == [True], "a claim of a process of this host that ended is taken"
    assert tier.stats() == [], "claims are not documents"


def test_memory_then_disk_then_redis(
    tiny_engine: KVBoostRAG, server: LocalRedis, passages: list[str], tmp_path: Path
) -> None:
    both = worker(tiny_engine, f"{tmp_path / 'kv'},{server.url}")
    assert [type(t).__name__ for t in both.store.tiers] == ["DiskStore", "RedisStore"]
    both.warm(passages[:2])
    assert len(chunk_keys(server)) > 0 and (tmp_path / "kv" / "index.sqlite").exists()
    for location in (str(tmp_path / "kv"), server.url):  # each tier alone holds the corpus
        alone = worker(tiny_engine, location, repair="none")
        result = alone.generate(prompt_of(passages[1::-1]), max_new_tokens=2, store_prompt=False, exactness=AS_LOADED)
        assert result.missed_chunks == 0 and result.reused_approximate_tokens > 0
    cli = subprocess.run(
        [sys.executable, "-m", "kvboost_rag.cli", "cache", "stats", "--store", server.url],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0 and "namespace kvboost" in cli.stdout and "(empty)" not in cli.stdout


def test_a_redis_that_stops_answering_costs_one_timeout_not_one_per_call(
    tiny_engine: KVBoostRAG, passages: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    with local_redis() as server:
        url = server.url + "?socket_timeout=0.3&retry_after=60"
        worker(tiny_engine, url).warm(passages[:3])
        reader = worker(tiny_engine, url)
        prompt = prompt_of(passages[:3])
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)  # alive, silent: a network partition
        try:
            with warnings.catch_warnings(), caplog.at_level("WARNING", logger="kvboost_rag.store"):
                warnings.simplefilter("ignore")  # the tier's own (it is unreachable)
                served = reader.generate(prompt, exactness=VERIFIED, max_new_tokens=6, store_prompt=False)
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        full = reader.generate(prompt, mode="full", max_new_tokens=6, store_prompt=False)
        assert served.token_ids == full.token_ids
        failures = [r.getMessage() for r in caplog.records if r.name == "kvboost_rag.store"]
        assert sum("Timeout" in m for m in failures) == 1 and len(failures) > 1, failures
        assert all("Timeout" in m or "unreachable" in m for m in failures)
        assert reader.store.tier_errors >= len(failures), "every failure counted, the lines held back"


def test_a_password_from_the_environment_and_a_wrong_one(
    tiny_engine: KVBoostRAG, passages: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with local_redis("--requirepass", "s3cret") as server:
        monkeypatch.setenv("KVBOOST_RAG_REDIS_PASSWORD", "s3cret")
        report = worker(tiny_engine, server.url).warm(passages[:2])
        assert report.store_errors == 0 and report.chunks_stored > 0
        monkeypatch.setenv("KVBOOST_RAG_REDIS_PASSWORD", "wrong")
        with pytest.warns(UserWarning, match="cannot be reached|invalid|WRONGPASS"):
            refused = worker(tiny_engine, server.url)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = refused.generate(prompt_of(passages[:2]), max_new_tokens=2, store_prompt=False)
        assert result.new_tokens == 2 and result.reused_approximate_tokens == 0, "answered without the tier"


def test_the_tiers_share_one_match_window(
    tiny_engine: KVBoostRAG, server: LocalRedis, passages: list[str], tmp_path: Path
) -> None:
    folder = tmp_path / "kv"
    worker(tiny_engine, str(folder), match_window=32).warm(passages[:1])
    both = worker(tiny_engine, f"{folder},{server.url}")
    remote = both.store.tiers[1]
    assert both.config.match_window == 32 and isinstance(remote, RedisStore) and remote.window == 32
    other = server.url + "?namespace=other"
    RedisStore(other)  # a namespace that recorded the default window, 16
    with pytest.raises(StoreSettingsError, match="windows of 16 tokens"):
        worker(tiny_engine, f"{folder},{other}")


def test_a_cluster_that_cannot_be_reached_is_a_warning(tiny_engine: KVBoostRAG, passages: list[str]) -> None:
    from kvboost_rag.testing.redis_server import free_port

    with pytest.warns(UserWarning, match="cannot be reached"):
        engine = worker(tiny_engine, f"redis://127.0.0.1:{free_port()}/0?cluster=true&retry_after=60")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = engine.generate(prompt_of(passages[:2]), max_new_tokens=2, store_prompt=False)
        assert engine.warm(passages[:1]).documents == 1
    assert result.new_tokens == 2
