"""How much better could CacheBlend's selection be? Its check-layer choice against oracles.

At the same rho, CacheBlend picks tokens by their K deviation at the check layer. The oracles
pick by each token's true deviation from full prefill's K (or V), summed over every layer, which
only a full prefill can know. If the oracles barely beat CacheBlend, the remaining error is not a
selection problem: it is the stale KV of the tokens no selection recomputes. First-token metrics
against full prefill, NQ-Open top-k prompts (README, "Eval").
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

import torch
from tqdm import tqdm

from kvboost_rag import KVBoostRAG
from kvboost_rag.config import RepairConfig
from kvboost_rag.evaluation import DEFAULT_TEMPLATE, build_messages, first_token_kl
from kvboost_rag.kv_cache import SelectiveCache, selective_forward, stacked_kv
from kvboost_rag.repair import blend_candidates, select_for_recompute
from kvboost_rag.result import StageTimings
from kvboost_rag.retrieval import sample_nq


def oracle_selection(
    true: list[torch.Tensor], reused: list[torch.Tensor], moved: torch.Tensor, forced: torch.Tensor, rho: float
) -> torch.Tensor:
    """The top `rho` of moved tokens by deviation from full prefill, summed over every layer and
    head of the given K/V tensors [L, H, n, D]."""
    n, dim = moved.numel(), true[0].shape[-1]
    return select_for_recompute(
        torch.cat([t.reshape(-1, n, dim) for t in true]),
        torch.cat([r.reshape(-1, n, dim) for r in reused]),
        moved,
        forced,
        rho,
    )


def relative_to(true: torch.Tensor, reused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both scaled by the true vector's norm: their deviation becomes relative, per layer and head."""
    norm = true.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    return true / norm, reused / norm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--rho", type=float, default=0.15)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(__file__).parent / "results" / f"selection_ceiling_k{args.k}.json"
    chosen, retrieved = sample_nq(args.questions, args.k, seed=0)
    engine = KVBoostRAG.from_pretrained()
    repair = RepairConfig(rho=args.rho)
    names = ("cacheblend", "oracle K", "oracle V", "oracle K+V relative")
    kl: dict[str, list[float]] = {name: [] for name in names}
    agree: dict[str, list[bool]] = {name: [] for name in names}
    for i in tqdm(range(len(chosen)), unit="q"):
        documents = list(retrieved[i])
        engine.warm(documents)
        random.Random(f"0:{i}").shuffle(documents)  # the eval's order for question i
        prompt = build_messages(chosen[i].question, documents, DEFAULT_TEMPLATE, chat=True)
        tokens = engine.tokenize_prompt(prompt)
        boundaries = engine._boundaries(tokens)
        full = engine._prefill.run(tokens, engine._plan(tokens, boundaries, "full"), StageTimings(), repair)
        true_keys, true_values = stacked_kv(full.cache)
        plan = engine._plan(tokens, boundaries, "reuse")
        moved, forced = blend_candidates(plan, engine.device)  # as the engine's CacheBlend

        logits = {"cacheblend": engine.next_token_logits(prompt, mode="reuse", repair=repair)[0]}
        for name in names[1:]:
            keys, values, _ = engine._prefill.assemble(plan, in_position_order=True)
            if name == "oracle K":
                true, reused = [true_keys.float()], [keys.float()]
            elif name == "oracle V":
                true, reused = [true_values.float()], [values.float()]
            else:
                pairs = relative_to(true_keys.float(), keys.float()), relative_to(true_values.float(), values.float())
                true, reused = [p[0] for p in pairs], [p[1] for p in pairs]
            selection = oracle_selection(true, reused, moved, forced, args.rho)
            cache = SelectiveCache(keys, values, repair.check_layer, lambda *_, picked=selection: picked)
            with engine._model_lock:
                logits[name] = selective_forward(engine.model, torch.from_numpy(tokens).to(engine.device), cache)
        for name in names:
            kl[name].append(first_token_kl(full.logits, logits[name]))
            agree[name].append(bool(logits[name].argmax() == full.logits.argmax()))

    summary = {
        name: {
            "first_token_kl_mean": statistics.fmean(kl[name]),
            "first_token_agreement": statistics.fmean(agree[name]),
        }
        for name in names
    }
    print(f"k={args.k}, rho={args.rho}, {args.questions} questions")
    for name, row in summary.items():
        print(f"  {name:<10}  KL {row['first_token_kl_mean']:.4f}  agreement {row['first_token_agreement']:.1%}")
    out.write_text(json.dumps({"settings": vars(args) | {"out": str(out)}, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
