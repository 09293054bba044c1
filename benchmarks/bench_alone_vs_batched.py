"""Does a greedy answer depend on concurrency? NQ prompts answered alone, then together.

The default engine (its dtype and int4 weights on this host), NQ questions with their top-k FAISS
documents warmed first (so prompts reuse them, as a RAG server's do), greedy answers of exactly
--max-new-tokens (`ignore_eos`). Each prompt is answered alone, one after another; then all at
once through `generate_batch` on an engine of --max-running. Reports how many answers are equal
whole, where the first differing token sits, both wall times (tokens/s of the batch against one at
a time), and what drafts gave the answers alone (--draft-tokens): tokens taken a forward pass.
Run it under `make test-as-avx2`'s environment variables for the other host kind.

JSON: benchmarks/results/bench_alone_vs_batched.json (or --out).
"""

from __future__ import annotations

from kvboost_lab import harness


def main() -> None:
    p = harness.parser(__doc__, questions=24, k=5, seed=2, out="bench_alone_vs_batched.json", max_new_tokens=64)
    p.add_argument("--max-running", type=int, default=8, help="requests decoding together")
    p.add_argument("--draft-tokens", type=int, default=None, help="tokens drafted a pass (default: the engine's)")
    args = harness.parse(p)
    drafts = {} if args.draft_tokens is None else {"draft_tokens": args.draft_tokens}
    engine = harness.load_engine(args, max_running=args.max_running, **drafts)
    nq = harness.draw_nq(args.questions, args.k, args.seed)
    harness.warm(engine, nq)
    prompts = [nq.prompt(i, args.seed) for i in range(len(nq))]
    options = dict(max_new_tokens=args.max_new_tokens, ignore_eos=True, store_prompt=False)
    alone, alone_s, together, together_s = harness.alone_and_together(engine, prompts, **options)
    firsts = []
    for a, b in zip(alone, together):
        parted = [i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y]
        firsts.append(parted[0] if parted else None)
    equal = sum(first is None for first in firsts)
    tokens = sum(r.new_tokens for r in together)
    report = {
        "prompts": len(prompts),
        "k": args.k,
        "max_new_tokens": args.max_new_tokens,
        "max_running": args.max_running,
        "dtype": str(engine.model.dtype),
        "equal_answers": equal,
        "first_differing_token": firsts,
        "alone_s": alone_s,
        "together_s": together_s,
        "alone_tokens_per_s": sum(r.new_tokens for r in alone) / alone_s,
        "together_tokens_per_s": tokens / together_s,
        "draft_tokens": engine.config.draft_tokens,
        "alone_drafted_tokens": sum(r.drafted_tokens for r in alone),
        "alone_accepted_tokens": sum(r.accepted_tokens for r in alone),
        # tokens an answer alone took a forward pass (each accepted drafted token is a pass saved)
        "alone_tokens_per_pass": sum(r.new_tokens for r in alone)
        / max(1, sum(r.new_tokens - r.accepted_tokens for r in alone)),
    }
    print(
        f"{equal} of {len(prompts)} answers equal alone and {args.max_running} at a time; "
        f"{report['alone_tokens_per_s']:.1f} tokens/s one at a time, {report['together_tokens_per_s']:.1f} together"
    )
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
