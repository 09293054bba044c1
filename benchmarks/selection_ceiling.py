"""How much better could CacheBlend's selection be? Its check-layer choice against oracles.

At the same rho, CacheBlend picks tokens by their K deviation at the check layer. The oracles
pick by each token's true deviation from full prefill's K (or V), summed over every layer, which
only a full prefill can know. If the oracles barely beat CacheBlend, the remaining error is not a
selection problem: it is the stale KV of the tokens no selection recomputes. First-token metrics
against full prefill, NQ-Open top-k prompts in the eval's order (README, "Eval").

JSON: benchmarks/results/selection_ceiling_k{k}.json (or --out).
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from kvboost_lab import harness
from kvboost_rag import RepairConfig
from kvboost_rag.hf.blend import SelectiveCache, selective_forward
from kvboost_rag.ops.logits import kl_divergence
from kvboost_rag.ops.selection import blend_candidates, select_for_recompute

NAMES = ("cacheblend", "oracle K", "oracle V", "oracle K+V relative")


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
    p = harness.parser(__doc__, questions=200, k=5, seed=0, out="selection_ceiling_k{k}.json")
    p.add_argument("--rho", type=float, default=0.15)
    args = harness.parse(p)
    nq = harness.draw_nq(args.questions, args.k, args.seed)
    engine = harness.load_engine(args)
    repair = RepairConfig(strategy="cacheblend", rho=args.rho, blend_boundary_tokens=0)  # CacheBlend's own choice
    kl: dict[str, list[float]] = {name: [] for name in NAMES}
    agree: dict[str, list[bool]] = {name: [] for name in NAMES}
    for i in tqdm(range(len(nq)), unit="q"):
        engine.warm(nq.passages_for(i))
        prompt = nq.prompt(i, args.seed)
        tokens = engine.tokenize_prompt(prompt)
        full_logits, true_keys, true_values = harness.full_prefill_kv(engine, tokens)
        plan = engine.plan(prompt, mode="reuse")
        moved, forced = blend_candidates(plan, engine.device)  # as the engine's CacheBlend

        logits = {"cacheblend": engine.next_token_logits(prompt, mode="reuse", repair=repair)[0]}
        for name in NAMES[1:]:
            keys, values, _ = harness.assemble_reused(engine, plan, in_position_order=True)
            if name == "oracle K":
                true, reused = [true_keys.float()], [keys.float()]
            elif name == "oracle V":
                true, reused = [true_values.float()], [values.float()]
            else:
                pairs = relative_to(true_keys.float(), keys.float()), relative_to(true_values.float(), values.float())
                true, reused = [pair[0] for pair in pairs], [pair[1] for pair in pairs]
            selection = oracle_selection(true, reused, moved, forced, args.rho)
            cache = SelectiveCache(keys, values, repair.check_layer, lambda *_, picked=selection: picked)
            logits[name] = selective_forward(engine.model, torch.from_numpy(tokens).to(engine.device), cache)
        for name in NAMES:
            kl[name].append(kl_divergence(full_logits, logits[name]))
            agree[name].append(bool(logits[name].argmax() == full_logits.argmax()))

    summary = harness.first_token_summary(kl, agree, f"k={args.k}, rho={args.rho}, {args.questions} questions")
    settings = {key: str(value) if key == "out" else value for key, value in vars(args).items()}
    harness.write_json(args.out, {"settings": settings, "summary": summary})


if __name__ == "__main__":
    main()
