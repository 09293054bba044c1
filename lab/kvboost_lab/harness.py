"""What every script in benchmarks/ shares: its arguments, the engine, NQ prompts, JSON out.

A benchmark states its question and its measurement; loading the model, drawing questions,
retrieving and warming their documents, the prompt and the record of where and how it ran
are the same everywhere, so they live here once.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvboost_rag.engine import GenerationResult, KVBoostRAG, Prompt, WarmReport
from kvboost_rag.engine.compute import process_compute
from kvboost_rag.engine.prefill import PrefillRunner
from kvboost_rag.eval.data import QAExample, load_qa
from kvboost_rag.eval.prompt import rag_messages
from kvboost_rag.eval.retrieval import corpus_index, retrieve_documents, sample_nq
from kvboost_rag.eval.run import run_info
from kvboost_rag.eval.runner import warm_template_head
from kvboost_rag.eval.variants import Variant
from kvboost_rag.hf.cache import forward_last_logits, make_cache, stacked_kv
from kvboost_rag.hf.model import rotary_module
from kvboost_rag.plan.matching import ReusePlan

REPO = Path(__file__).resolve().parents[2]  # lab/kvboost_lab/harness.py
RESULTS = REPO / "benchmarks" / "results"
MEMORY_BUDGET = 12 * 1024**3
EVAL_QUESTIONS = 500  # the eval's sample (seed 0): studies that choose a setting draw outside it


def parser(
    doc: str | None,
    *,
    questions: int,
    k: int | list[int],
    seed: int,
    out: str,
    max_new_tokens: int | None = None,
    dtype: bool = True,
) -> argparse.ArgumentParser:
    """The shared options with a script's defaults. `out` is a name under benchmarks/results and
    may hold `{k}`; `k` as a list takes one or more values; `max_new_tokens=None` leaves the
    option out, for scripts that only prefill, and `dtype=False` --dtype, for scripts that
    choose their dtypes. --dtype defaults to the engine's choice (bfloat16 on CUDA and CPUs
    with native bf16, float32 elsewhere, where bf16 is emulated and ~4x slower)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--questions", type=int, default=questions, help="NQ-Open questions")
    many = isinstance(k, list)
    p.add_argument("--k", type=int, nargs="+" if many else None, default=k, help="retrieved passages per prompt")
    if dtype:
        p.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: the engine's for this machine)")
    p.add_argument("--model", default=None, help="HF name, folder or GGUF file (default: the embedded model)")
    p.add_argument("--seed", type=int, default=seed, help="draws the questions and shuffles their documents")
    p.add_argument("--out", type=Path, default=None, help=f"JSON path (default: benchmarks/results/{out})")
    if max_new_tokens is not None:
        p.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help="answer length limit")
    p.set_defaults(out_name=out, dtype=None)
    return p


def parse(p: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parsed arguments, with `out` resolved from the script's default name where not given."""
    args = p.parse_args(argv)
    if args.out is None:
        first_k = args.k[0] if isinstance(args.k, list) else args.k
        args.out = RESULTS / args.out_name.format(k=first_k)
    del args.out_name
    return args


def load_engine(args: argparse.Namespace, **options: Any) -> KVBoostRAG:
    """The engine a benchmark measures: chunks in memory only, so a run never fills or reads
    the user's persistent store, under a budget that holds a whole sample (fp32 chunks take
    46 KB a token). `options` are `EngineConfig` fields (and `dtype`)."""
    options.setdefault("dtype", args.dtype)
    options.setdefault("memory_budget_bytes", MEMORY_BUDGET)
    return KVBoostRAG.from_pretrained(args.model, store="memory", **options)


@dataclass(slots=True)
class NQSample:
    """Questions and their retrieved documents (best first); prompts shuffle them as the eval does."""

    examples: list[QAExample]
    documents: list[list[str]]

    def __len__(self) -> int:
        return len(self.examples)

    def passages_for(self, i: int, k: int | None = None) -> list[str]:
        """Question i's top-k documents, a fresh list (callers shuffle it)."""
        return list(self.documents[i][:k])

    def prompt(self, i: int, seed: int, k: int | None = None) -> list[dict[str, str]]:
        """Question i's chat prompt, its documents in the eval's order for (seed, i)."""
        documents = self.passages_for(i, k)
        random.Random(f"{seed}:{i}").shuffle(documents)
        return rag_messages(self.examples[i].question, documents)

    def all_documents(self, k: int | None = None) -> list[str]:
        return list(dict.fromkeys(d for i in range(len(self)) for d in self.passages_for(i, k)))


def draw_nq(count: int, k: int, seed: int, *, outside_eval: bool = False) -> NQSample:
    """`count` NQ-Open questions with their top-k FAISS documents; `outside_eval` draws only
    from questions the eval's 500 do not hold, so a setting is not chosen on its test set."""
    if not outside_eval:
        return NQSample(*sample_nq(count, k, seed))
    examples = load_qa()
    in_eval = {e.question for e in random.Random(0).sample(examples, EVAL_QUESTIONS)}
    chosen = random.Random(seed).sample([e for e in examples if e.question not in in_eval], count)
    return NQSample(chosen, retrieve_documents(corpus_index(examples), chosen, k))


def warm(engine: KVBoostRAG, nq: NQSample, k: int | None = None) -> WarmReport:
    """Warm every retrieved document once, then run one untimed answer (first-call costs) and
    one request that caches the prompt template's head, as a user's first request does."""
    report = engine.warm(nq.all_documents(k))
    print(f"warmed {report.documents} passages, {report.tokens_encoded} tokens, in {report.seconds:.1f} s")
    if engine.store.stats().evictions:
        print(f"warning: {engine.store.stats().evictions} chunks evicted; raise memory_budget_bytes", file=sys.stderr)
    engine.generate("Warm-up.", max_new_tokens=1, mode="full")
    if len(nq):
        warm_template_head(engine, nq.passages_for(0, k)[0])
    return report


def answer(
    engine: KVBoostRAG, prompt: Prompt, variant: Variant, max_new_tokens: int, **options: Any
) -> GenerationResult:
    """A variant's greedy answer, ending at a newline as the eval's do. `options` go to
    `generate` (observer, store_prompt: off unless given, so each variant sees the warmed
    documents alone)."""
    options.setdefault("store_prompt", False)
    mode, repair, exactness = variant.mode, variant.repair, variant.exactness
    return engine.generate(
        prompt, mode=mode, repair=repair, exactness=exactness, max_new_tokens=max_new_tokens, stop=["\n"], **options
    )


def assemble_reused(
    engine: KVBoostRAG, plan: ReusePlan, in_position_order: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A plan's cached K/V moved to their new positions, as the engine's prefill assembles them."""
    return PrefillRunner(engine.model, rotary_module(engine.model), process_compute()).assemble(plan, in_position_order)


def full_prefill_kv(engine: KVBoostRAG, tokens: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Full prefill of a prompt's tokens: its last logits and every layer's K/V [L, H, n, D]."""
    cache = make_cache()
    ids, positions = torch.from_numpy(tokens).to(engine.device), torch.arange(len(tokens), device=engine.device)
    logits = forward_last_logits(engine.model, ids, positions, cache)
    return (logits, *stacked_kv(cache))


def first_token_summary(
    kl: dict[str, list[float]], agree: dict[str, list[bool]], title: str
) -> dict[str, dict[str, float]]:
    """Each named choice's mean first-token KL from full prefill and its agreement with full
    prefill's first token, printed under `title`, lowest KL first (the selection studies' table)."""
    summary = {
        name: {
            "first_token_kl_mean": statistics.fmean(kl[name]),
            "first_token_agreement": statistics.fmean(agree[name]),
        }
        for name in kl
    }
    print(title)
    width = max(map(len, summary), default=0)
    for name, row in sorted(summary.items(), key=lambda item: item[1]["first_token_kl_mean"]):
        print(f"  {name:<{width}}  KL {row['first_token_kl_mean']:.4f}  agreement {row['first_token_agreement']:.1%}")
    return summary


def alone_and_together(
    engine: KVBoostRAG, prompts: list[Prompt], **options: Any
) -> tuple[list[GenerationResult], float, list[GenerationResult], float]:
    """Each prompt answered alone, one after another, then all through `generate_batch` (the
    engine's `max_running` at once): both results and both wall times (seconds)."""
    started = time.perf_counter()
    alone = [engine.generate(prompt, **options) for prompt in prompts]
    alone_s = time.perf_counter() - started
    started = time.perf_counter()
    together = engine.generate_batch(prompts, **options)
    return alone, alone_s, together, time.perf_counter() - started


def summarize(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "mean": statistics.fmean(values)}


def write_json(path: Path, report: dict[str, Any], indent: int | None = 1) -> Path:
    """The report with `run` (run_info) added, written to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**report, "run": run_info()}, indent=indent, ensure_ascii=False))
    print(f"wrote {path}")
    return path
