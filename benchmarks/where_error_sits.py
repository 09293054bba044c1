"""Where reused KV deviates from full prefill: by layer, by a token's offset in its document run,
and by how far its document is from the question. Reuse without repair, NQ-Open top-k prompts.

Documents in reverse retrieval order (the best next to the question). This is the evidence
behind the repair defaults (README, "Repair").

JSON: benchmarks/results/where_error_sits.json (or --out).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from kvboost_lab import harness
from kvboost_rag.eval.prompt import rag_messages
from kvboost_rag.plan.repair import reused_runs

OFFSET_BINS = [(0, 1), (1, 4), (4, 16), (16, 64), (64, 10_000)]


def relative(full: torch.Tensor, reused: torch.Tensor) -> torch.Tensor:
    """Per layer and token: ||reused - full|| / ||full||, over heads and channels -> [L, n]."""
    diff = (reused.float() - full.float()).pow(2).sum(dim=(1, 3)).sqrt()
    return diff / full.float().pow(2).sum(dim=(1, 3)).sqrt().clamp_min(1e-6)


def main() -> None:
    p = harness.parser(__doc__, questions=30, k=5, seed=2, out="where_error_sits.json")
    p.set_defaults(dtype="float32")
    args = harness.parse(p)
    nq = harness.draw_nq(args.questions, args.k, args.seed)
    engine = harness.load_engine(args)

    by_layer: dict[str, list[torch.Tensor]] = defaultdict(list)
    by_offset: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    by_rank: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for i, example in enumerate(nq.examples):
        documents = nq.passages_for(i)
        engine.warm(documents)
        prompt = rag_messages(example.question, documents[::-1])
        plan = engine.plan(prompt, mode="reuse")
        keys, values, positions = harness.assemble_reused(engine, plan)
        _, full_keys, full_values = harness.full_prefill_kv(engine, engine.tokenize_prompt(prompt))
        runs = reused_runs(plan)
        for name, full, reused in (("key", full_keys, keys), ("value", full_values, values)):
            deviation = relative(full[:, :, positions], reused)  # [L, n_cached]
            by_layer[name].append(deviation.mean(dim=1))
            for column, position in enumerate(positions.tolist()):
                run = next((r for r in runs if r[0] <= position < r[1]), None)
                if run is None:
                    continue
                offset = position - run[0]
                label = next(f"{lo}-{hi - 1}" for lo, hi in OFFSET_BINS if lo <= offset < hi)
                by_offset[name][label].append(deviation[:, column].mean().item())
                rank = len(runs) - runs.index(run)  # 1: the document next to the question
                by_rank[name][rank].append(deviation[:, column].mean().item())

    report = {
        "questions": args.questions,
        "k": args.k,
        "dtype": str(engine.dtype),
        "by_layer": {n: torch.stack(v).mean(0).tolist() for n, v in by_layer.items()},
        "by_offset": {n: {b: sum(v) / len(v) for b, v in d.items()} for n, d in by_offset.items()},
        "by_document_rank": {n: {r: sum(v) / len(v) for r, v in sorted(d.items())} for n, d in by_rank.items()},
    }
    for name in ("key", "value"):
        layers = report["by_layer"][name]
        print(f"\n{name}: relative deviation from full prefill (mean over reused tokens)")
        print("  by layer:  " + " ".join(f"{x:.2f}" for x in layers))
        print("  by offset in run:  " + "  ".join(f"{b}: {x:.3f}" for b, x in report["by_offset"][name].items()))
        print(
            "  by document rank (1 = next to the question):  "
            + "  ".join(f"{r}: {x:.3f}" for r, x in report["by_document_rank"][name].items())
        )
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
