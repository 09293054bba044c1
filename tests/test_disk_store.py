"""The persistent store: shared by processes, atomic, checked on load, within budget."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import torch

from kvboost_rag import EngineConfig, KVBoostRAG
from kvboost_rag.plan.keys import ContentHash
from kvboost_rag.store.disk import DiskStore

CLI = [sys.executable, "-m", "kvboost_rag.cli"]


def corpus(passages: list[str], count: int) -> list[str]:
    documents = list(passages)
    while len(documents) < count:
        documents += [f"{p}\nCopy {len(documents)}." for p in passages]
    return documents[:count]


def write_jsonl(path: Path, documents: list[str]) -> Path:
    path.write_text("\n".join(json.dumps({"title": "", "text": d}) for d in documents))
    return path


def tiny_engine(model_dir: Path, cache: Path, **config: object) -> KVBoostRAG:
    return KVBoostRAG.from_pretrained(model_dir, dtype="float32", config=EngineConfig(store=str(cache), **config))


def warm_args(data: Path, cache: Path, model: Path) -> list[str]:
    store = ["--store", str(cache), "--neighbours", "0"]  # the store under test: no embedder to load
    return [*CLI, "warm", str(data), *store, "--model", str(model), "--dtype", "float32"]


def run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, **kwargs)  # type: ignore[call-overload]


def test_entries_round_trip_dense_and_quantized(tiny_model_dir: Path, tmp_path: Path, passages: list[str]) -> None:
    for quantization in (None, "int8", "int4"):
        cache = tmp_path / f"store-{quantization}"
        writer = tiny_engine(tiny_model_dir, cache, kv_quantization=quantization)
        writer.warm(passages[:3])
        stored = list(writer.store)
        reader = DiskStore(cache, match_window=16)
        for entry in stored:
            loaded = reader.get(entry.content_hash)
            assert loaded is not None and (loaded.tokens == entry.tokens).all()
            for a, b in zip(loaded.dense_kv(), entry.dense_kv()):
                assert (a == b).all()
            assert loaded.next_chunk == entry.next_chunk and loaded.base_position == entry.base_position


def test_fresh_process_reuses_with_zero_recompute(tiny_model_dir: Path, tmp_path: Path, passages: list[str]) -> None:
    documents = passages[:4]
    data = write_jsonl(tmp_path / "docs.jsonl", documents)
    cache = tmp_path / "store"
    warmed = run([*CLI, "warm", str(data), "--store", str(cache), "--model", str(tiny_model_dir), "--dtype", "float32"])
    assert warmed.returncode == 0, warmed.stderr
    assert "4 warmed" in warmed.stdout
    script = textwrap.dedent(f"""
        import json, sys
        from kvboost_rag import EngineConfig, KVBoostRAG
        engine = KVBoostRAG.from_pretrained({str(tiny_model_dir)!r}, dtype="float32",
                                            config=EngineConfig(store={str(cache)!r}))
        documents = json.loads(sys.stdin.read())
        report = engine.warm(documents)
        result = engine.generate("Context:\\n" + "\\n\\n".join(documents[::-1]) + "\\nQ?", max_new_tokens=1)
        print(json.dumps({{"encoded": report.tokens_encoded, "skipped": report.skipped_documents,
                           "reused": result.reused_approximate_tokens, "prompt": result.prompt_tokens}}))
    """)
    fresh = run([sys.executable, "-c", script], input=json.dumps(documents))
    assert fresh.returncode == 0, fresh.stderr
    numbers = json.loads(fresh.stdout.strip().splitlines()[-1])
    assert numbers["encoded"] == 0 and numbers["skipped"] == 4
    assert numbers["reused"] >= 0.85 * numbers["prompt"]


def test_corrupted_or_truncated_files_are_dropped_and_recomputed(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str]
) -> None:
    cache = tmp_path / "store"
    tiny_engine(tiny_model_dir, cache).warm(passages[:4])
    files = sorted((cache / "kv").rglob("*.safetensors"))
    assert len(files) >= 4
    data = bytearray(files[0].read_bytes())
    data[-100] ^= 0xFF  # one flipped bit pattern inside a tensor
    files[0].write_bytes(bytes(data))
    files[1].write_bytes(files[1].read_bytes()[: len(data) // 2])  # truncated
    fresh = tiny_engine(tiny_model_dir, cache)
    prompt = "\n\n".join(passages[:4]) + "\nQ?"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, plan = fresh.next_token_logits(prompt)  # loads every chunk the prompt holds
    assert any("corrupted" in str(w.message) for w in caught)
    assert plan.tokens("computed") > 0, "what was damaged is computed, never served"
    DiskStore(cache, 16).verify(orphan_age_s=0)  # finds what the prompt did not load
    report = fresh.warm(passages[:4])
    assert report.tokens_encoded > 0 and report.skipped_documents <= 3, "the damaged documents are recomputed"
    assert DiskStore(cache, 16).verify(orphan_age_s=0).dropped == []
    assert tiny_engine(tiny_model_dir, cache).warm(passages[:4]).tokens_encoded == 0


def test_sigkill_during_warm_leaves_nothing_half_written(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str]
) -> None:
    documents = corpus(passages, 400)
    data = write_jsonl(tmp_path / "docs.jsonl", documents)
    cache = tmp_path / "store"
    args = warm_args(data, cache, tiny_model_dir)
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and len(list((cache / "kv").rglob("*.safetensors"))) < 40:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    store = DiskStore(cache, 16)
    partial = store.stats()
    assert partial and 0 < partial[0].documents < len(documents), "killed midway"
    assert store.verify(orphan_age_s=0).dropped == [], "every indexed chunk is whole"
    resumed = run(args)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{partial[0].documents} already warm" in resumed.stdout
    assert DiskStore(cache, 16).stats()[0].documents == len(documents)


def test_two_processes_warming_at_once_end_consistent(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str]
) -> None:
    documents = corpus(passages, 60)
    data = write_jsonl(tmp_path / "docs.jsonl", documents)
    cache = tmp_path / "store"
    args = warm_args(data, cache, tiny_model_dir)
    processes = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for process in processes:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
    store = DiskStore(cache, 16)
    assert store.verify(orphan_age_s=0).dropped == []
    assert store.stats()[0].documents == len(documents)
    assert tiny_engine(tiny_model_dir, cache).warm(documents).tokens_encoded == 0


def test_prune_keeps_pinned_documents_and_the_budget(tiny_model_dir: Path, tmp_path: Path, passages: list[str]) -> None:
    cache = tmp_path / "store"
    engine = tiny_engine(tiny_model_dir, cache)
    engine.warm(passages[0], pin=True)
    engine.warm(passages[1:10])
    store = DiskStore(cache, 16)
    budget = store.total_bytes() // 3
    assert store.prune(budget) > 0
    assert store.total_bytes() <= budget
    fresh = tiny_engine(tiny_model_dir, cache)
    assert fresh.warm(passages[0]).tokens_encoded == 0, "pinned: still stored"
    assert fresh.warm(passages[1:10]).tokens_encoded > 0, "evicted ones are warmed again"


def test_cache_commands(tiny_model_dir: Path, tmp_path: Path, passages: list[str]) -> None:
    folder = tmp_path / "docs"
    (folder / "nested").mkdir(parents=True)
    (folder / "a.txt").write_text(passages[0])
    (folder / "nested" / "b.md").write_text(passages[1])
    write_jsonl(folder / "c.jsonl", passages[2:4])
    cache = tmp_path / "store"
    warmed = run([*CLI, "warm", str(folder), "--store", str(cache), "--model", str(tiny_model_dir)])
    assert warmed.returncode == 0 and "4 documents from 3 files: 4 warmed" in warmed.stdout, warmed.stderr
    stats = run([*CLI, "cache", "stats", "--store", str(cache)])
    assert stats.returncode == 0 and " 4 " in stats.stdout
    verify = run([*CLI, "cache", "verify", "--store", str(cache)])
    assert verify.returncode == 0 and "0 dropped" in verify.stdout
    prune = run([*CLI, "cache", "prune", "--budget", "0", "--store", str(cache)])
    assert prune.returncode == 0 and "0.0 MiB stored" in prune.stdout
    missing = run([*CLI, "warm", str(tmp_path / "nope.txt"), "--store", str(cache)])
    assert missing.returncode != 0 and "does not exist" in missing.stderr
    # --pin, from the command line: documents warm already are pinned too, and prune keeps them
    model = ["--store", str(cache), "--model", str(tiny_model_dir)]
    assert "1 warmed" in run([*CLI, "warm", str(folder / "a.txt"), *model]).stdout
    pinned = run([*CLI, "warm", str(folder / "a.txt"), "--pin", *model])
    assert pinned.returncode == 0 and "1 already warm" in pinned.stdout, pinned.stderr
    pinned = run([*CLI, "warm", str(folder / "c.jsonl"), "--pin", *model])
    assert pinned.returncode == 0, pinned.stderr
    kept = DiskStore(cache, 16)
    held = kept.total_bytes()
    kept.close()
    prune = run([*CLI, "cache", "prune", "--budget", "0", "--store", str(cache)])
    assert prune.returncode == 0, prune.stderr
    kept = DiskStore(cache, 16)
    assert 0 < kept.total_bytes() == held, "pinned documents are not pruned"
    rows = [line.split() for line in run([*CLI, "cache", "stats", "--store", str(cache)]).stdout.splitlines()]
    assert any(row[-1].isdigit() and int(row[-1]) > 0 for row in rows[2:3]), rows  # the pinned column


def test_disk_budget_holds_while_warming(tiny_model_dir: Path, tmp_path: Path, passages: list[str]) -> None:
    probe = tiny_engine(tiny_model_dir, tmp_path / "probe")
    probe.warm(passages[:5])
    five_documents = DiskStore(tmp_path / "probe", 16).total_bytes()
    cache = tmp_path / "store"
    engine = tiny_engine(tiny_model_dir, cache, disk_budget_bytes=five_documents)
    engine.warm(corpus(passages, 40))
    assert DiskStore(cache, 16).total_bytes() <= five_documents * 1.05  # at most one check interval over


def test_cli_warms_a_tenants_namespace(tiny_model_dir: Path, tmp_path: Path, passages: list[str]) -> None:
    """`kvboost-rag warm --namespace`: only that namespace finds them; `cache stats` names it."""
    folder, cache = tmp_path / "docs", tmp_path / "store"
    folder.mkdir()
    (folder / "a.txt").write_text(passages[0])
    model = ["--store", str(cache), "--model", str(tiny_model_dir), "--dtype", "float32"]
    warmed = run([*CLI, "warm", str(folder), "--namespace", "team-a", *model])
    assert warmed.returncode == 0 and "1 warmed" in warmed.stdout, warmed.stderr
    refused = run([*CLI, "warm", str(folder), "--namespace", "team a", *model])
    assert refused.returncode == 2 and "namespace 'team a' is not a name" in refused.stderr
    engine = tiny_engine(tiny_model_dir, cache)
    assert engine.warm(passages[0], namespace="team-a").tokens_encoded == 0
    assert engine.warm(passages[0]).tokens_encoded > 0, "the shared corpus did not have it"
    stats = run([*CLI, "cache", "stats", "--store", str(cache)])
    assert stats.returncode == 0 and f"{engine.name} [team-a]" in stats.stdout, stats.stdout


def test_cli_shards_warm_one_corpus_as_one_process_does(
    tiny_model_dir: Path, tmp_path: Path, passages: list[str]
) -> None:
    """`kvboost-rag warm --shard I/N` in N processes at once: every document once, in the groups one
    process makes, each chunk's KV equal to one process's."""
    write_jsonl(tmp_path / "corpus.jsonl", passages[:12])
    model = ["--model", str(tiny_model_dir), "--dtype", "float32", "--neighbours", "2"]
    one = run([*CLI, "warm", str(tmp_path / "corpus.jsonl"), "--store", str(tmp_path / "one"), *model])
    assert one.returncode == 0 and "12 warmed" in one.stdout, one.stderr
    command = [*CLI, "warm", str(tmp_path / "corpus.jsonl"), "--store", str(tmp_path / "sharded"), *model]
    shards = [subprocess.Popen([*command, "--shard", f"{i}/3"], stdout=subprocess.PIPE, text=True) for i in range(3)]
    said = [shard.communicate(timeout=300)[0] for shard in shards]
    assert all(shard.returncode == 0 for shard in shards), said
    counts = [int(text.split(" documents (shard")[0].rsplit("\n", 1)[-1]) for text in said]
    assert sum(counts) == 12 and all(f"(shard {i}/3)" in said[i] for i in range(3)), said
    whole, parts = DiskStore(tmp_path / "one"), DiskStore(tmp_path / "sharded")
    keys = {key for page in whole.index.key_pages() for key in page}
    assert keys == {key for page in parts.index.key_pages() for key in page}
    assert whole.stats()[0].documents == parts.stats()[0].documents == 12
    for key in keys:
        a, b = whole.get(ContentHash(key)), parts.get(ContentHash(key))
        assert a is not None and b is not None and all(map(torch.equal, a.dense_kv(), b.dense_kv()))
    refused = run([*command, "--shard", "3/3"])
    assert refused.returncode == 2 and "--shard takes I/N with 0 <= I < N" in refused.stderr
