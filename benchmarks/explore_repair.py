"""Where the error of moved chunks sits, and which repair settings fix it cheapest.

First-token metrics only (KL from full prefill, agreement, TTFT) over many repair settings on
NQ-Open top-k prompts: the study behind the default RepairConfig (README, "Repair").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tqdm import tqdm

from kvboost_rag import KVBoostRAG
from kvboost_rag.config import RepairConfig
from kvboost_rag.eval_report import format_table
from kvboost_rag.evaluation import Variant, run_eval
from kvboost_rag.retrieval import sample_nq

SETTINGS = {
    "none": RepairConfig(strategy="none"),
    "boundary R=1": RepairConfig(strategy="boundary", boundary_tokens=1),
    "boundary R=4": RepairConfig(strategy="boundary", boundary_tokens=4),
    "boundary R=16": RepairConfig(strategy="boundary", boundary_tokens=16),
    "blend .15 V c1": RepairConfig(rho=0.15, deviation="value", check_layer=1),
    "blend .15 K c1": RepairConfig(rho=0.15, deviation="key", check_layer=1),
    "blend .15 V c0": RepairConfig(rho=0.15, deviation="value", check_layer=0),
    "blend .15 V c3": RepairConfig(rho=0.15, deviation="value", check_layer=3),
    "blend .15 V c1 +R1": RepairConfig(rho=0.15, check_layer=1, blend_boundary_tokens=1),
    "blend .15 V c1 +R4": RepairConfig(rho=0.15, check_layer=1, blend_boundary_tokens=4),
    "blend .15 K c1 +R1": RepairConfig(rho=0.15, deviation="key", check_layer=1, blend_boundary_tokens=1),
    "blend .30 V c1": RepairConfig(rho=0.30, check_layer=1),
    "boundary R=16 T=16": RepairConfig(strategy="boundary", boundary_tokens=16, tail_tokens=16),
    "boundary R=8 T=8": RepairConfig(strategy="boundary", boundary_tokens=8, tail_tokens=8),
    "blend .10 K c1 +R8": RepairConfig(rho=0.10, deviation="key", check_layer=1, blend_boundary_tokens=8),
    "blend .05 K c1 +R16": RepairConfig(rho=0.05, deviation="key", check_layer=1, blend_boundary_tokens=16),
    "blend .10 K c2": RepairConfig(rho=0.10, deviation="key", check_layer=2),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=60)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=None, help="names of SETTINGS to run")
    parser.add_argument("--warm-prefix", default=None, help="EngineConfig.warm_prefix (default: the engine's)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "explore_repair.json")
    args = parser.parse_args()
    chosen, retrieved = sample_nq(args.questions, args.k, seed=1)
    engine = KVBoostRAG.from_pretrained(**({} if args.warm_prefix is None else {"warm_prefix": args.warm_prefix}))
    names = args.only or list(SETTINGS)
    variants = [Variant("full", "full")] + [Variant(n, "reuse", SETTINGS[n]) for n in names]
    report = run_eval(
        engine,
        chosen,
        lambda i: list(retrieved[i]),
        variants,
        max_new_tokens=1,
        progress=lambda it: tqdm(it, unit="q"),
        settings={"questions": args.questions, "k": args.k, "warm_prefix": engine.config.warm_prefix},
    )
    print(format_table(report))
    args.out.write_text(json.dumps({"settings": report.settings, "summary": report.summary()}, indent=1))


if __name__ == "__main__":
    main()
