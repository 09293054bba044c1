"""The chunk store as the corpus grows (issue 55): 1k, 10k, 100k documents on disk.

Only the store's and the engine's own work is measured: documents are synthetic (random words
through the default tokenizer, ~130 tokens each), their KV comes from a tiny random Llama with the
same tokenizer (2 layers, 2 KV heads of 16: ~0.3 KB a token), and the store is filled through the
engine's own writer (`DocumentWriter`, random KV: no model pass), so a size costs minutes, not
hours. At each size, on the same directory:
- fill: documents a second written by the writer (chunk files, index rows, document records);
- lookup: `engine.plan` of --prompts prompts of 5 stored documents (shuffled) and a question, each
  through a fresh engine's empty memory tier (so every chunk comes from disk): p50 and p99;
- warm: `engine.warm` of 50 documents already stored (a lookup each), and of 50 new ones (the tiny
  model's pass, the engine's and the store's work): ms a document;
- `kvboost-rag cache stats`, `cache verify` and `cache prune` (to 99% of the bytes held) as
  subprocesses: wall time and peak RSS;
- the index's and the chunk files' bytes.

JSON: benchmarks/results/issue55/bench_store_scale.json (or --out).
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvboost_lab import harness
from kvboost_lab.tiny_model import save_tiny_llama
from kvboost_rag import KVBoostRAG
from kvboost_rag.engine.documents import DocumentWriter
from kvboost_rag.plan.keys import document_hash

MEMORY_BUDGET = 16 * 2**20  # the memory tier holds little: lookups go to the disk


def words(tokenizer: Any) -> list[str]:
    """Whole lowercase words of the tokenizer's vocabulary."""
    vocabulary = [tokenizer.convert_tokens_to_string([t]).strip() for t in tokenizer.get_vocab()]
    return sorted({w for w in vocabulary if w.isalpha() and w.islower() and 3 <= len(w) <= 10})


def synthetic(rng: random.Random, vocabulary: list[str], count: int) -> list[str]:
    return [" ".join(rng.choices(vocabulary, k=100)) + "." for _ in range(count)]


def fill(engine: KVBoostRAG, texts: list[str]) -> float:
    """Write each document's chunks with random KV through the engine's writer; seconds."""
    writer = DocumentWriter(engine.store, engine.keys, engine.config.kv_quantization)
    model = engine.model.config
    layers, heads = model.num_hidden_layers, model.num_key_value_heads
    head_dim = model.hidden_size // model.num_attention_heads
    started = time.perf_counter()
    for text in texts:
        tokens = np.asarray(engine.tokenizer(text, add_special_tokens=False).input_ids, dtype=np.int64)
        cuts = engine.boundaries(tokens)
        kv = torch.randn(2, layers, heads, len(tokens), head_dim).to(engine.dtype)
        writer.write(
            document_hash(engine.keys.document, tokens),
            tokens,
            cuts,
            writer.contents(tokens, cuts),
            (kv[0], kv[1]),
            0,
            None,
        )
    return time.perf_counter() - started


def timed_command(*args: str) -> dict[str, Any]:
    """A `kvboost-rag` command in its own process: wall seconds, peak RSS, rc, its last line."""
    command = ["/usr/bin/time", "-f", "%e %M", sys.executable, "-m", "kvboost_rag.cli", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=7200)
    wall, peak_kb = done.stderr.strip().splitlines()[-1].split()
    lines = done.stdout.strip().splitlines()
    return {
        "s": float(wall),
        "peak_rss_bytes": int(peak_kb) * 1024,
        "rc": done.returncode,
        "said": lines[-1] if lines else "",
    }


def directory_bytes(root: Path) -> tuple[int, int]:
    """(bytes, files) under `root`."""
    files = [p for p in root.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def measure(
    model_dir: Path, store: Path, stored: list[str], rng: random.Random, vocabulary: list[str], prompts: int
) -> dict[str, Any]:
    engine = KVBoostRAG.from_pretrained(model_dir, store=str(store), memory_budget_bytes=MEMORY_BUDGET)
    lookups, reused = [], []
    for _ in range(prompts):
        fresh = KVBoostRAG(engine.model, engine.tokenizer, engine.config, store=None, name=engine.name)
        documents = rng.sample(stored, 5)
        prompt = "\n\n".join(documents) + "\n\nQuestion: which of these came first?"
        started = time.perf_counter()
        plan = fresh.plan(prompt)
        lookups.append(time.perf_counter() - started)
        reused.append(plan.tokens("approximate") + plan.tokens("exact"))
        fresh.store.close()
    again = rng.sample(stored, 50)
    started = time.perf_counter()
    report = engine.warm(again)
    rewarm_s = (time.perf_counter() - started) / len(again)
    assert report.skipped_documents == len(again), report
    new = synthetic(rng, vocabulary, 50)
    started = time.perf_counter()
    engine.warm(new)
    warm_new_s = (time.perf_counter() - started) / len(new)
    stored += new
    engine.store.close()
    index_bytes = sum(p.stat().st_size for p in store.glob("index.sqlite*"))
    kv_bytes, kv_files = directory_bytes(store / "kv")
    result = {
        "lookup_ms_p50": 1000 * statistics.median(lookups),
        "lookup_ms_p99": 1000 * float(np.percentile(lookups, 99)),
        "reused_tokens_median": statistics.median(reused),
        "rewarm_ms_per_document": 1000 * rewarm_s,
        "warm_new_ms_per_document": 1000 * warm_new_s,
        "index_bytes": index_bytes,
        "chunk_file_bytes": kv_bytes,
        "chunk_files": kv_files,
        "stats": timed_command("cache", "stats", "--store", str(store)),
        "verify": timed_command("cache", "verify", "--store", str(store)),
    }
    held = sum(p.stat().st_size for p in (store / "kv").rglob("*") if p.is_file())
    result["prune"] = timed_command("cache", "prune", "--budget", str(int(held * 0.99)), "--store", str(store))
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000], help="documents stored")
    p.add_argument("--prompts", type=int, default=50, help="lookups timed at each size")
    p.add_argument("--root", type=Path, default=None, help="where the store goes (default: a temporary folder)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=harness.RESULTS / "issue55" / "bench_store_scale.json")
    args = p.parse_args()
    from transformers import AutoTokenizer

    from kvboost_rag.hf.loader import default_model_dir

    rng = random.Random(args.seed)
    root = args.root or Path(tempfile.mkdtemp(prefix="kvboost-scale-"))
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    model_dir = save_tiny_llama(root / "tiny", tokenizer)
    vocabulary = words(tokenizer)
    store = root / "store"
    writer_engine = KVBoostRAG.from_pretrained(model_dir, store=str(store), memory_budget_bytes=MEMORY_BUDGET)
    stored: list[str] = []
    rows = []
    for size in args.sizes:
        texts = synthetic(rng, vocabulary, size - len(stored))
        seconds = fill(writer_engine, texts)
        stored += texts
        row = {"documents": len(stored), "fill_documents_per_s": len(texts) / seconds}
        writer_engine.store.close()
        row |= measure(model_dir, store, stored, rng, vocabulary, args.prompts)
        writer_engine = KVBoostRAG.from_pretrained(model_dir, store=str(store), memory_budget_bytes=MEMORY_BUDGET)
        rows.append(row)
        print({k: v for k, v in row.items()}, flush=True)
    report = {"store": "disk", "model": "tiny random Llama, the default tokenizer", "rows": rows}
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
