"""Which reading of the question's attention picks the moved tokens to recompute best?

The query-guided repair (RepairConfig(strategy="query")) computes the prompt's uncached tokens
over the reused KV and ranks the moved tokens by the attention the question pays them. This
script records that attention per layer and head once a prompt, and ranks the moved tokens
several ways: by layer (the last, the last few, every layer, a middle band), by aggregation
(summed probabilities, each layer normalized, the most attentive head), beside CacheBlend's K
deviation at its check layer, hybrids of both, and an oracle (each token's true K/V deviation
from full prefill over every layer, which only a full prefill knows). Each ranking's top share is
then recomputed with the uncached tokens, as the engine's second pass does, and the first
token's logits compared with full prefill's (KL, agreement). Documents are warmed as
`kvboost-rag warm` warms them (groups of mutual neighbours).

JSON: benchmarks/results/query_choice_k{k}.json (or --out).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from tqdm import tqdm

from kvboost_lab import harness
from kvboost_rag import RepairConfig
from kvboost_rag.eval.data import load_qa
from kvboost_rag.eval.retrieval import corpus_index
from kvboost_rag.hf.blend import SelectiveCache, selective_forward
from kvboost_rag.neighbours import DEFAULT_NEIGHBOURS, groups_among
from kvboost_rag.ops.attention_received import last_rows_attention
from kvboost_rag.ops.logits import kl_divergence
from kvboost_rag.ops.selection import blend_candidates, deviation, top_share
from kvboost_rag.plan.repair import reused_runs


class PerHead:
    """The attention the question's rows pay each key, kept per layer and head: [L, H, slots]."""

    def __init__(self, rows: int, slots: int) -> None:
        self.rows, self.slots = rows, slots
        self.layers: dict[int, torch.Tensor] = {}

    def observe(
        self, layer: int | None, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scale: float
    ) -> None:
        assert layer is not None
        attention = last_rows_attention(query, key, mask, scale, self.rows)  # [H, rows, n]
        self.layers[layer] = attention.sum(dim=1)[:, : self.slots]


def rankings(attention: torch.Tensor) -> dict[str, torch.Tensor]:
    """Scores [slots] from per-layer, per-head attention [L, H, slots]."""
    layers = attention.shape[0]
    # each layer's and head's attention over the cached keys made to sum to 1 (the question's own
    # keys take the rest): layers whose question reads its own tokens weigh as much as the others
    normalized = attention / attention.sum(dim=-1, keepdim=True).clamp_min(1e-9)
    return {
        "query: last layer": attention[-1].sum(0),
        "query: last 2": attention[-2:].sum((0, 1)),
        "query: last 4": attention[-4:].sum((0, 1)),
        "query: last 8": attention[-8:].sum((0, 1)),
        "query: every layer": attention.sum((0, 1)),
        "query: middle third": attention[layers // 3 : 2 * layers // 3].sum((0, 1)),
        "query: first third": attention[: layers // 3].sum((0, 1)),
        "query: every layer, max head": attention.amax(1).sum(0),
        "query: last layer, max head": attention[-1].amax(0),
        "query: every layer, each normalized": normalized.sum((0, 1)),
    }


def main() -> None:
    p = harness.parser(__doc__, questions=60, k=5, seed=1, out="query_choice_k{k}.json")
    p.add_argument("--rho", type=float, default=0.15)
    args = harness.parse(p)
    nq = harness.draw_nq(args.questions, args.k, args.seed)
    engine = harness.load_engine(args)
    runner = engine._prefill  # noqa: SLF001 - a study of the engine's own passes
    examples = load_qa()
    nearest = corpus_index(examples).neighbours(DEFAULT_NEIGHBOURS)
    groups = groups_among(nq.all_documents(), lambda d: nearest.get(d, []))
    engine.warm_together([list(g) for g in groups])
    harness.warm(engine, nq)  # already warm in groups: the template head, and the first calls
    blend = RepairConfig(strategy="cacheblend", rho=args.rho, rho_after_neighbours=None, rho_among_strangers=None)
    kl: dict[str, list[float]] = {}
    agree: dict[str, list[bool]] = {}
    for i in tqdm(range(len(nq)), unit="q"):
        prompt = nq.prompt(i, args.seed)
        tokens = engine.tokenize_prompt(prompt)
        full_logits, true_keys, true_values = harness.full_prefill_kv(engine, tokens)
        plan = engine.plan(prompt, mode="reuse")
        if not plan.tokens("approximate"):
            continue
        moved, _ = blend_candidates(plan, engine.device)

        def compare(name: str, logits: torch.Tensor) -> None:
            kl.setdefault(name, []).append(kl_divergence(full_logits, logits))
            agree.setdefault(name, []).append(bool(logits.argmax() == full_logits.argmax()))

        none = torch.zeros_like(moved)
        keys, values, cached_positions = runner.assemble(plan)
        computed = torch.cat([torch.arange(s.start, s.end) for s in plan.segments if s.kind == "computed"])
        last_moved = max(s.end for s in plan.segments if s.kind == "approximate")
        recorder = PerHead(int((computed >= last_moved).sum()), len(cached_positions))
        runner._pass(tokens, keys, values, cached_positions, computed, recorder)  # noqa: SLF001
        attention = torch.stack([recorder.layers[layer] for layer in sorted(recorder.layers)])
        n = len(tokens)

        def by_position(slot_scores: torch.Tensor) -> torch.Tensor:
            scores = torch.zeros(n)
            scores[cached_positions] = slot_scores
            return scores

        scores = {name: by_position(s) for name, s in rankings(attention).items()}
        # CacheBlend's K deviation at its check layer, for the same tokens
        mixed_keys, mixed_values, _ = runner.assemble(plan, in_position_order=True)
        seen: dict[str, torch.Tensor] = {}

        def record(layer: int, fresh_keys: torch.Tensor, fresh_values: torch.Tensor) -> torch.Tensor:
            seen["deviation"] = deviation(fresh_keys, mixed_keys[layer])
            return torch.arange(n)

        selective_forward(
            engine.model, torch.from_numpy(tokens), SelectiveCache(mixed_keys, mixed_values, blend.check_layer, record)
        )
        scores["deviation (CacheBlend)"] = seen["deviation"]
        true_dev = (true_keys.float() - mixed_keys.float()).pow(2).sum((0, 1, 3)) + (
            true_values.float() - mixed_values.float()
        ).pow(2).sum((0, 1, 3))
        scores["oracle (true K+V deviation)"] = true_dev

        def rank(s: torch.Tensor) -> torch.Tensor:
            return torch.argsort(torch.argsort(s)).float() / n  # rank in [0, 1): scale-free

        query_best = scores["query: every layer"]
        scores["hybrid: rank(query) + rank(deviation)"] = rank(query_best) + rank(seen["deviation"])
        scores["hybrid: query x deviation"] = query_best * seen["deviation"]
        count = math.ceil(args.rho * int(moved.sum()))
        limit = 32 * len(reused_runs(plan))
        half: Callable[[str], torch.Tensor] = lambda name: top_share(scores[name], moved, none, args.rho / 2)  # noqa: E731
        selections = {name: top_share(s, moved, none, args.rho, limit) for name, s in scores.items()}
        union = torch.unique(torch.cat([half("query: every layer"), half("deviation (CacheBlend)")]))
        selections["hybrid: half each"] = union
        # EPIC's sinks: each moved run's first 4 tokens, then the ranking's top tokens to the same count
        sinks = torch.tensor(sorted({p for a, b in reused_runs(plan) for p in range(a, min(a + 4, b))}))
        rest = moved & ~torch.isin(torch.arange(n), sinks)
        for name in (
            "query: last layer",
            "query: last 4",
            "query: last 8",
            "query: every layer",
            "deviation (CacheBlend)",
        ):
            top = torch.topk(torch.where(rest, scores[name], -math.inf), max(0, min(count, limit) - len(sinks))).indices
            selections[f"{name} + sinks"] = torch.cat([sinks, top]).unique()
        for name, selected in selections.items():
            kept = torch.ones(n, dtype=torch.bool)
            kept[selected] = False
            slots = kept[cached_positions]
            recomputed = torch.cat([selected, computed]).unique().sort().values
            logits = runner._pass(  # noqa: SLF001
                tokens, keys[:, :, slots], values[:, :, slots], cached_positions[slots], recomputed
            ).logits
            compare(name, logits)
        compare("CacheBlend as the engine runs it", engine.next_token_logits(prompt, mode="reuse", repair=blend)[0])

    questions = len(kl["oracle (true K+V deviation)"])
    title = f"k={args.k}, rho={args.rho}, {questions} questions, seed {args.seed}"
    summary = harness.first_token_summary(kl, agree, title)
    settings = {key: str(value) if key == "out" else value for key, value in vars(args).items()}
    harness.write_json(args.out, {"settings": settings, "summary": summary})


if __name__ == "__main__":
    main()
