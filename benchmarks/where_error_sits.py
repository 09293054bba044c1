"""Where reused KV deviates from full prefill: by layer, by a token's offset in its document run,
and by how far its document is from the question. Reuse without repair, NQ-Open top-k prompts.

This is the evidence behind the repair defaults (README, "Repair").
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from kvboost_rag import KVBoostRAG
from kvboost_rag.kv_cache import forward_last_logits, make_cache, stacked_kv
from kvboost_rag.matching import plan_reuse
from kvboost_rag.prompting import rag_messages
from kvboost_rag.repair import reused_runs
from kvboost_rag.retrieval import sample_nq

OFFSET_BINS = [(0, 1), (1, 4), (4, 16), (16, 64), (64, 10_000)]


def relative(full: torch.Tensor, reused: torch.Tensor) -> torch.Tensor:
    """Per layer and token: ||reused - full|| / ||full||, over heads and channels -> [L, n]."""
    diff = (reused.float() - full.float()).pow(2).sum(dim=(1, 3)).sqrt()
    return diff / full.float().pow(2).sum(dim=(1, 3)).sqrt().clamp_min(1e-6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=30)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "where_error_sits.json")
    args = parser.parse_args()
    chosen, retrieved = sample_nq(args.questions, args.k, seed=2)
    engine = KVBoostRAG.from_pretrained(dtype="float32")

    by_layer: dict[str, list[torch.Tensor]] = defaultdict(list)
    by_offset: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    by_rank: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for example, passages in zip(chosen, retrieved):
        documents = list(passages)
        engine.warm(documents)
        tokens = engine.tokenize_prompt(rag_messages(example.question, documents[::-1]))
        plan = plan_reuse(
            tokens, engine._boundaries(tokens), engine.store, engine.fingerprint, engine.document_fingerprint, "reuse"
        )
        keys, values, positions = engine._prefill.assemble(plan)
        cache = make_cache()
        forward_last_logits(engine.model, torch.from_numpy(tokens), torch.arange(len(tokens)), cache)
        full_keys, full_values = stacked_kv(cache)
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
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
