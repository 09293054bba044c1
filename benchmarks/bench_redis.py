"""The Redis tier on one machine: a corpus warmed by one process, answered by another.

1. `kvboost-rag warm --store redis://...` (a subprocess) warms the corpus: NQ passages (the
   top-k FAISS documents of the sampled questions, topped up with further gold passages).
2. This process, a fresh engine with an empty memory tier, answers the sampled questions (their
   documents shuffled) against full prefill, per prompt with a fresh memory tier so every chunk
   comes from Redis: TTFT and whole-answer time of the default, and of the same chunks already
   in memory; and, with no repair and no verification, how many warmed tokens were recomputed.
3. Per 128-token chunk: the time to get it ready from memory, disk, Redis on loopback, and to
   recompute it.
4. Warm throughput with 1, 2 and 4 worker processes splitting a corpus between them (each with
   its share of the cores), each into its own namespace, then checked (`verify`: one readable
   copy of every chunk).

JSON: benchmarks/results/bench_redis.json (or --out).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from kvboost_lab import harness
from kvboost_rag import ChunkStore, EngineConfig, ExactnessConfig, KVBoostRAG, RepairConfig
from kvboost_rag.eval.data import load_qa
from kvboost_rag.hf.cache import forward_last_logits, make_cache
from kvboost_rag.store.disk import DiskStore
from kvboost_rag.store.redis import RedisStore
from kvboost_rag.testing.redis_server import local_redis

AS_LOADED = ExactnessConfig(verify_margin=0.0, refresh=False)  # nothing recomputed after the prefill


def corpus_of(nq: harness.NQSample, size: int) -> list[str]:
    documents = nq.all_documents()
    for example in load_qa():
        if len(documents) >= size:
            break
        gold = example.passages[0].as_document()
        if gold not in documents:
            documents.append(gold)
    return documents[:size]


def cli_warm(documents: list[str], url: str, folder: Path, name: str, threads: int, args) -> subprocess.Popen:
    path = folder / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    command = [sys.executable, "-m", "kvboost_rag.cli", "warm", str(path), "--store", url]
    if args.model:
        command += ["--model", args.model]
    if args.dtype:
        command += ["--dtype", args.dtype]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen) -> str:
    out, err = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"kvboost-rag warm failed: {err[-2000:]}")
    return out.strip().splitlines()[-1]


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def answer_from_redis(base: KVBoostRAG, tier: RedisStore, nq: harness.NQSample, args) -> dict:
    """Per prompt, a fresh memory tier over the Redis tier: every chunk is read from Redis."""
    rows = []
    for i in range(min(args.prompts, len(nq))):
        prompt = nq.prompt(i, args.seed)
        store = ChunkStore(harness.MEMORY_BUDGET, tier.window, tiers=[tier])
        engine = KVBoostRAG(base.model, base.tokenizer, base.config, store=store, name=base.name)
        common = dict(max_new_tokens=args.max_new_tokens, store_prompt=False, stop=["\n"])
        full = engine.generate(prompt, mode="full", **common)
        cold = engine.generate(prompt, **common)  # the default, chunks read from Redis
        warm = engine.generate(prompt, **common)  # the default again: the chunks now in memory
        raw = engine.generate(
            prompt, repair=RepairConfig("none"), exactness=AS_LOADED, max_new_tokens=1, store_prompt=False
        )
        rows.append(
            {
                "prompt_tokens": full.prompt_tokens,
                "full_ttft_s": full.ttft_s,
                "full_total_s": full.total_s,
                "redis_ttft_s": cold.ttft_s,
                "redis_total_s": cold.total_s,
                "memory_ttft_s": warm.ttft_s,
                "memory_total_s": warm.total_s,
                "reused_share": (cold.reused_exact_tokens + cold.reused_approximate_tokens) / cold.prompt_tokens,
                "same_answer": cold.token_ids == full.token_ids,
                "unrepaired_reused_tokens": raw.reused_exact_tokens + raw.reused_approximate_tokens,
                "unrepaired_recomputed_tokens": raw.recomputed_tokens,
                "unrepaired_computed_tokens": raw.computed_tokens,
            }
        )
        print(f"prompt {i}: {rows[-1]}", flush=True)

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    return {
        "prompts": len(rows),
        "prompt_tokens_median": median("prompt_tokens"),
        "full_ttft_ms": median("full_ttft_s") * 1000,
        "redis_ttft_ms": median("redis_ttft_s") * 1000,
        "memory_ttft_ms": median("memory_ttft_s") * 1000,
        "redis_ttft_ratio": statistics.median(r["redis_ttft_s"] / r["full_ttft_s"] for r in rows),
        "memory_ttft_ratio": statistics.median(r["memory_ttft_s"] / r["full_ttft_s"] for r in rows),
        "full_total_ms": median("full_total_s") * 1000,
        "redis_total_ms": median("redis_total_s") * 1000,
        "redis_total_ratio": statistics.median(r["redis_total_s"] / r["full_total_s"] for r in rows),
        "reused_share_median": median("reused_share"),
        "same_answer_as_full": sum(r["same_answer"] for r in rows) / len(rows),
        "unrepaired_recomputed_tokens_total": sum(r["unrepaired_recomputed_tokens"] for r in rows),
        "unrepaired_computed_tokens_median": median("unrepaired_computed_tokens"),
        "rows": rows,
    }


def chunk_load_times(base: KVBoostRAG, tier: RedisStore, documents: list[str], chunks: int) -> dict:
    """One chunk made ready (dense KV on the model's device) from each place, and recomputed."""
    with tempfile.TemporaryDirectory() as folder:
        config = EngineConfig(store=folder, memory_budget_bytes=harness.MEMORY_BUDGET)
        engine = KVBoostRAG(base.model, base.tokenizer, config, name=base.name)
        engine.warm(documents)  # the same documents as in Redis: equal content hashes
        entries = [e for e in engine.store if len(e) == config.chunk_size][:chunks]
        disk = DiskStore(folder)  # its own: nothing cached from the warm
        times: dict[str, list[float]] = {"memory": [], "disk": [], "redis": [], "recompute": []}
        for entry in entries:
            ids = torch.from_numpy(entry.tokens).to(engine.device)
            positions = torch.arange(len(ids), device=engine.device)
            times["memory"].append(timed(entry.dense_kv))
            times["disk"].append(timed(lambda: disk.get(entry.content_hash).dense_kv()))
            times["redis"].append(timed(lambda: tier.get(entry.content_hash).dense_kv()))
            with torch.inference_mode():
                times["recompute"].append(
                    timed(lambda: forward_last_logits(engine.model, ids, positions, make_cache()))
                )
        disk.close()
    return {
        "chunks": len(entries),
        "chunk_tokens": config.chunk_size,
        **{f"{k}_ms": median_ms(v) for k, v in times.items()},
        "bytes_per_chunk": statistics.median(e.nbytes for e in entries),
    }


def warm_throughput(url: str, documents: list[str], folder: Path, workers: int, args, tokens: int) -> dict:
    namespace_url = f"{url}?namespace=w{workers}"
    threads = max(1, (os.cpu_count() or 2) // workers)
    started = time.perf_counter()
    parts = [documents[w::workers] for w in range(workers)]
    processes = [
        cli_warm(part, namespace_url, folder, f"w{workers}-{w}", threads, args) for w, part in enumerate(parts)
    ]
    lines = [finished(p) for p in processes]
    seconds = time.perf_counter() - started
    tier = RedisStore(namespace_url)
    report = tier.verify()
    stats = tier.stats()
    tier.close()
    return {
        "workers": workers,
        "threads_each": threads,
        "documents": len(documents),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "chunks_checked": report.checked,
        "chunks_dropped": len(report.dropped),
        "documents_stored": sum(s.documents for s in stats),
        "worker_reports": lines,
    }


def main() -> None:
    p = harness.parser(__doc__, questions=100, k=5, seed=0, out="bench_redis.json", max_new_tokens=16)
    p.add_argument("--corpus", type=int, default=500, help="passages warmed into Redis")
    p.add_argument("--prompts", type=int, default=20, help="questions answered by the fresh process")
    p.add_argument("--chunks", type=int, default=40, help="chunks timed per place")
    p.add_argument("--throughput-docs", type=int, default=96, help="passages warmed for each worker count")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    args = harness.parse(p)
    nq = harness.draw_nq(args.questions, args.k, args.seed)
    corpus = corpus_of(nq, args.corpus)
    report: dict = {"questions": args.questions, "k": args.k, "corpus_documents": len(corpus)}
    with local_redis() as server, tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        started = time.perf_counter()
        line = finished(cli_warm(corpus, server.url, folder, "corpus", os.cpu_count() or 2, args))
        report["warm"] = {
            "seconds": time.perf_counter() - started,
            "report": line,
            "redis_used_memory_bytes": server.client().info("memory")["used_memory"],
        }
        print("warmed:", report["warm"], flush=True)

        base = harness.load_engine(args)
        tier = RedisStore(server.url)
        base.generate("Warm-up.", max_new_tokens=1, mode="full")
        report["answers"] = answer_from_redis(base, tier, nq, args)
        summary = {k: v for k, v in report["answers"].items() if k != "rows"}
        print("answers:", summary, flush=True)
        tokens_per_doc = [len(base.tokenizer(d, add_special_tokens=False).input_ids) for d in corpus]
        report["corpus_tokens"] = sum(tokens_per_doc)
        report["chunk_load"] = chunk_load_times(base, tier, corpus[:40], args.chunks)
        print("chunk load:", report["chunk_load"], flush=True)
        tier.close()
        del base

        subset = corpus[: args.throughput_docs]
        subset_tokens = sum(tokens_per_doc[: args.throughput_docs])
        report["warm_throughput"] = []
        for workers in args.workers:
            row = warm_throughput(server.url, subset, folder, workers, args, subset_tokens)
            report["warm_throughput"].append(row)
            print("throughput:", {k: v for k, v in row.items() if k != "worker_reports"}, flush=True)
    harness.write_json(args.out, report, indent=1)


if __name__ == "__main__":
    main()
