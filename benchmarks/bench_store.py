"""The chunk store's tiers and KV formats: load time per chunk, bytes per token, accuracy.

For fp32, bf16, int8 and int4 chunks: the time to get one chunk ready from memory and from the
disk tier against recomputing it, bytes per token, and NQ-Open EM, first-token agreement and KL
against full prefill (the eval of `kvboost-rag eval`) of reuse with CacheBlend alone (nothing
recomputed after the prefill, so the format's own error shows) on the same prompts. int8 and
int4 chunks come from the bf16 model, fp32 ones from the fp32 model; --formats runs some only.

JSON: benchmarks/results/bench_store.json (or --out).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from kvboost_lab import harness
from kvboost_rag import ExactnessConfig, KVBoostRAG
from kvboost_rag.eval.runner import run_eval
from kvboost_rag.eval.variants import Variant
from kvboost_rag.hf.cache import forward_last_logits, make_cache
from kvboost_rag.store.disk import DiskStore

# chunk format -> (model dtype, KV quantization)
FORMATS = {
    "fp32": ("float32", None),
    "bf16": ("bfloat16", None),
    "int8": ("bfloat16", "int8"),
    "int4": ("bfloat16", "int4"),
}
TIMED_CHUNKS = 50


def median_ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1000


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def measure(
    base: KVBoostRAG, quantization: str | None, nq: harness.NQSample, args: argparse.Namespace
) -> dict[str, float]:
    """Warm the sample's documents into a fresh disk store in this format; time and evaluate it."""
    with tempfile.TemporaryDirectory() as folder:
        config = replace(base.config, kv_quantization=quantization, store=folder, memory_budget_bytes=8 * 1024**3)
        engine = KVBoostRAG(base.model, base.tokenizer, config, name=base.name)
        engine.warm(nq.all_documents())
        full_size = [e for e in engine.store if len(e) == config.chunk_size]
        entries = (full_size or list(engine.store))[:TIMED_CHUNKS]  # shorter ones only where none is full
        tokens = sum(len(e) for e in engine.store)
        memory_bytes = engine.store.stats().bytes
        disk_store = DiskStore(folder, config.match_window)  # its own: nothing cached from the warm
        memory, disk, recompute = [], [], []
        for entry in entries:
            ids = torch.from_numpy(entry.tokens).to(engine.device)
            positions = torch.arange(len(ids), device=engine.device)
            memory.append(timed(entry.dense_kv))
            disk.append(timed(lambda: disk_store.get(entry.content_hash).dense_kv()))  # read, checksum, dequantize
            recompute.append(timed(lambda: forward_last_logits(engine.model, ids, positions, make_cache())))
        disk_store.close()
        variants = [Variant("full", "full"), Variant("reuse", "reuse", engine.config.repair, ExactnessConfig.off())]
        quality = run_eval(
            engine, nq.examples, nq.passages_for, variants, seed=args.seed, max_new_tokens=args.max_new_tokens
        ).summary()
    return {
        "bytes_per_token": memory_bytes / tokens,
        "timed_chunk_tokens": statistics.median(len(e) for e in entries),
        "load_memory_ms_per_chunk": median_ms(memory),
        "load_disk_ms_per_chunk": median_ms(disk),
        "recompute_ms_per_chunk": median_ms(recompute),
        "em_full": quality["full"]["em"],
        "em_reuse": quality["reuse"]["em"],
        "first_token_agreement": quality["reuse"]["first_token_agreement"],
        "first_token_kl": quality["reuse"]["first_token_kl_mean"],
    }


def main() -> None:
    p = harness.parser(__doc__, questions=60, k=5, seed=3, out="bench_store.json", max_new_tokens=16, dtype=False)
    p.add_argument("--formats", nargs="+", choices=list(FORMATS), default=list(FORMATS))
    args = harness.parse(p)
    nq = harness.draw_nq(args.questions, args.k, args.seed)
    report: dict = {"questions": args.questions, "k": args.k, "formats": {}}
    models: dict[str, KVBoostRAG] = {}
    for name in args.formats:
        dtype, quantization = FORMATS[name]
        if dtype not in models:
            models[dtype] = harness.load_engine(args, dtype=dtype)
        report["formats"][name] = row = measure(models[dtype], quantization, nq, args)
        print(name, {key: round(value, 4) for key, value in row.items()})
    harness.write_json(args.out, report, indent=2)


if __name__ == "__main__":
    main()
