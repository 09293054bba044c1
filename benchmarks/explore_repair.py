"""Where the error of moved chunks sits, and which repair settings fix it cheapest.

First-token metrics only (KL from full prefill, agreement, TTFT: wall clock from the call to
the first token) over many prefill repair settings on NQ-Open top-k prompts, each alone
(nothing recomputed after the prefill): the study behind the default RepairConfig (README,
"Repair").

JSON: benchmarks/results/explore_repair.json (or --out).
"""

from __future__ import annotations

import functools

from tqdm import tqdm

from kvboost_lab import harness
from kvboost_rag import ExactnessConfig, RepairConfig
from kvboost_rag.eval.report import format_table
from kvboost_rag.eval.runner import run_eval
from kvboost_rag.eval.variants import Variant

# CacheBlend as these settings were recorded: no first tokens forced unless a setting names them
CACHEBLEND = functools.partial(RepairConfig, "cacheblend", blend_boundary_tokens=0)
SETTINGS = {
    "none": RepairConfig(strategy="none"),
    "boundary R=1": RepairConfig(strategy="boundary", boundary_tokens=1),
    "boundary R=4": RepairConfig(strategy="boundary", boundary_tokens=4),
    "boundary R=16": RepairConfig(strategy="boundary", boundary_tokens=16),
    "blend .15 V c1": CACHEBLEND(rho=0.15, deviation="value", check_layer=1),
    "blend .15 K c1": CACHEBLEND(rho=0.15, deviation="key", check_layer=1),
    "blend .15 V c0": CACHEBLEND(rho=0.15, deviation="value", check_layer=0),
    "blend .15 V c3": CACHEBLEND(rho=0.15, deviation="value", check_layer=3),
    "blend .15 V c1 +R1": CACHEBLEND(rho=0.15, deviation="value", check_layer=1, blend_boundary_tokens=1),
    "blend .15 V c1 +R4": CACHEBLEND(rho=0.15, deviation="value", check_layer=1, blend_boundary_tokens=4),
    "blend .15 K c1 +R1": CACHEBLEND(rho=0.15, deviation="key", check_layer=1, blend_boundary_tokens=1),
    "blend .30 V c1": CACHEBLEND(rho=0.30, deviation="value", check_layer=1),
    "boundary R=16 T=16": RepairConfig(strategy="boundary", boundary_tokens=16, tail_tokens=16),
    "boundary R=8 T=8": RepairConfig(strategy="boundary", boundary_tokens=8, tail_tokens=8),
    "blend .10 K c1 +R8": CACHEBLEND(rho=0.10, deviation="key", check_layer=1, blend_boundary_tokens=8),
    "blend .05 K c1 +R16": CACHEBLEND(rho=0.05, deviation="key", check_layer=1, blend_boundary_tokens=16),
    "blend .10 K c2": CACHEBLEND(rho=0.10, deviation="key", check_layer=2),
}


def main() -> None:
    p = harness.parser(__doc__, questions=60, k=5, seed=1, out="explore_repair.json")
    p.add_argument("--only", nargs="*", default=None, choices=list(SETTINGS), help="names of SETTINGS to run")
    p.add_argument("--warm-prefix", default=None, help="EngineConfig.warm_prefix (default: the engine's)")
    args = harness.parse(p)
    nq = harness.draw_nq(args.questions, args.k, args.seed)
    engine = harness.load_engine(args, **({} if args.warm_prefix is None else {"warm_prefix": args.warm_prefix}))
    off = ExactnessConfig.off()
    variants = [Variant("full", "full")] + [Variant(n, "reuse", SETTINGS[n], off) for n in args.only or SETTINGS]
    report = run_eval(
        engine,
        nq.examples,
        nq.passages_for,
        variants,
        seed=args.seed,
        max_new_tokens=1,
        progress=lambda it: tqdm(it, unit="q"),
        settings={
            "questions": args.questions,
            "k": args.k,
            "seed": args.seed,
            "dtype": str(engine.dtype),
            "warm_prefix": engine.config.warm_prefix,
        },
    )
    print(format_table(report))
    harness.write_json(args.out, {"settings": report.settings, "summary": report.summary()})


if __name__ == "__main__":
    main()
