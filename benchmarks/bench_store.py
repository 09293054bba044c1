"""The chunk store's tiers and KV formats: load time per chunk, bytes per token, accuracy.

For fp32, bf16, int8 and int4 chunks: the time to get one chunk ready from memory and from the
disk tier against recomputing it, bytes per token, and NQ-Open EM, first-token agreement and KL
against full prefill (the eval of `kvboost-rag eval`, default repair) on the same prompts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from kvboost_rag import EngineConfig, KVBoostRAG
from kvboost_rag.disk_store import DiskStore
from kvboost_rag.evaluation import Variant, run_eval
from kvboost_rag.kv_cache import forward_last_logits, make_cache
from kvboost_rag.retrieval import sample_nq

FORMATS = {
    "fp32": ("float32", None),
    "bf16": ("bfloat16", None),
    "int8": ("bfloat16", "int8"),
    "int4": ("bfloat16", "int4"),
}


def median_ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=60)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bench_store.json")
    args = parser.parse_args()
    chosen, retrieved = sample_nq(args.questions, args.k, seed=3)
    passages_for = lambda i: list(retrieved[i])  # noqa: E731

    report: dict = {"questions": args.questions, "k": args.k, "formats": {}}
    models: dict[str, KVBoostRAG] = {}
    for name, (dtype, quantization) in FORMATS.items():
        if dtype not in models:
            models[dtype] = KVBoostRAG.from_pretrained(dtype=dtype)
        base = models[dtype]
        with tempfile.TemporaryDirectory() as folder:
            config = EngineConfig(kv_quantization=quantization, cache_dir=folder, memory_budget_bytes=8 * 1024**3)
            engine = KVBoostRAG(base.model, base.tokenizer, config)
            documents = list(dict.fromkeys(d for i in range(len(chosen)) for d in passages_for(i)))
            engine.warm(documents)
            entries = [e for e in engine.store if len(e) == config.chunk_size][:50]
            tokens = sum(len(e) for e in engine.store)
            memory_bytes = engine.store.stats().bytes
            memory, disk, recompute = [], [], []
            disk_store = DiskStore(folder, config.match_window)
            for entry in entries:
                started = time.perf_counter()
                entry.dense_kv()
                memory.append(time.perf_counter() - started)
                started = time.perf_counter()
                disk_store.get(entry.content_hash).dense_kv()  # read, checksum, deserialize, dequantize
                disk.append(time.perf_counter() - started)
                ids = torch.from_numpy(entry.tokens)
                started = time.perf_counter()
                forward_last_logits(engine.model, ids, torch.arange(len(ids)), make_cache())
                recompute.append(time.perf_counter() - started)
            quality = run_eval(
                engine, chosen, passages_for, [Variant("full", "full"), Variant("reuse", "reuse")], max_new_tokens=16
            ).summary()
        report["formats"][name] = {
            "bytes_per_token": memory_bytes / tokens,
            "load_memory_ms_per_chunk": median_ms(memory),
            "load_disk_ms_per_chunk": median_ms(disk),
            "recompute_ms_per_chunk": median_ms(recompute),
            "em_full": quality["full"]["em"],
            "em_reuse": quality["reuse"]["em"],
            "first_token_agreement": quality["reuse"]["first_token_agreement"],
            "first_token_kl": quality["reuse"]["first_token_kl_mean"],
        }
        print(name, json.dumps({k: round(v, 4) for k, v in report["formats"][name].items()}))
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
