"""What warming costs: plain (each document alone) against neighbour-aware warming, in groups of
mutual neighbours (`warm_together`: two passes per group, as `kvboost-rag warm` does by default)
and each after its own N nearest (FusionRAG's way, `--no-together`), on the same NQ passages, in
one run.

Each way warms the same documents into a fresh memory store with the same model: wall clock
of `engine.warm` over the whole corpus, documents and document tokens per second (the corpus a
user gets warm per second), and tokens encoded per second (the model's work, neighbours
included). Finding the neighbours (embedding the corpus with the bundled MiniLM, a FAISS search)
is timed apart, as `kvboost-rag warm` does it once per run. Plain and grouped warming take turns
`--repeats` times; the medians are reported.

JSON: benchmarks/results/bench_warm.json (or --out).
"""

from __future__ import annotations

import statistics
import time

from kvboost_lab import harness
from kvboost_rag import KVBoostRAG
from kvboost_rag.neighbours import DEFAULT_NEIGHBOURS, bundled_embedder, embed, groups_among, nearest_others


def main() -> None:
    p = harness.parser(__doc__, questions=40, k=5, seed=0, out="bench_warm.json")
    p.add_argument("--neighbours", type=int, default=DEFAULT_NEIGHBOURS)
    p.add_argument("--repeats", type=int, default=3, help="runs of plain and grouped warming, taking turns")
    args = harness.parse(p)
    nq = harness.draw_nq(args.questions, args.k, args.seed)
    corpus = nq.all_documents()
    engine = harness.load_engine(args)
    engine.generate("Warm-up.", max_new_tokens=1, mode="full")
    tokens = sum(len(engine.tokenizer(d, add_special_tokens=False).input_ids) for d in corpus)

    started = time.perf_counter()
    nearest = nearest_others(embed(corpus, bundled_embedder()), args.neighbours)
    finding_s = time.perf_counter() - started
    neighbours = [[corpus[j] for j in others] for others in nearest]
    by_text = dict(zip(corpus, neighbours))
    groups = groups_among(corpus, by_text.__getitem__)  # as `kvboost-rag warm` groups them

    ways = {
        "plain": lambda e: e.warm(corpus),
        f"each after its {args.neighbours} nearest": lambda e: e.warm(corpus, neighbours=neighbours),
        f"default: groups of up to {args.neighbours + 1}": lambda e: e.warm_together(groups),
    }
    # plain and groups take turns, `--repeats` times each (the slow way runs once): their ratio is
    # taken from the medians, since one run's spread here (~1.2x) is as wide as the margin in question
    runs: dict[str, list[float]] = {name: [] for name in ways}
    encoded: dict[str, int] = {}
    for turn in range(args.repeats):
        for name, warm in ways.items():
            if turn and name.startswith("each after"):
                continue
            fresh = KVBoostRAG(engine.model, engine.tokenizer, engine.config, name=engine.name)  # a new memory store
            report = warm(fresh)
            runs[name].append(report.seconds)
            encoded[name] = report.tokens_encoded
            print(f"{name}: {report.seconds:.1f} s, {tokens / report.seconds:,.0f} document tokens/s")
    rows = {}
    for name, seconds in runs.items():
        median = statistics.median(seconds)
        rows[name] = {
            "seconds": median,
            "runs_s": seconds,
            "documents_per_s": len(corpus) / median,
            "document_tokens_per_s": tokens / median,
            "encoded_tokens_per_s": encoded[name] / median,
            "tokens_encoded": encoded[name],
        }
    plain, aware, together = rows.values()
    result = {
        "documents": len(corpus),
        "document_tokens": tokens,
        "neighbours": args.neighbours,
        "repeats": args.repeats,
        "finding_neighbours_s": finding_s,
        "rows": rows,
        "aware_x_plain_time": aware["seconds"] / plain["seconds"],
        "aware_with_finding_x_plain_time": (aware["seconds"] + finding_s) / plain["seconds"],
        "together_x_plain_time": together["seconds"] / plain["seconds"],
        "together_with_finding_x_plain_time": (together["seconds"] + finding_s) / plain["seconds"],
        "together_x_plain_time_by_turn": [g / p for g, p in zip(together["runs_s"], plain["runs_s"])],
        "together_x_plain_tokens": together["tokens_encoded"] / plain["tokens_encoded"],
        "groups": len(groups),
        "groups_of_one": sum(len(g) == 1 for g in groups),
        "dtype": str(engine.dtype),
    }
    print(
        f"each after its nearest / plain: {result['aware_x_plain_time']:.2f}x; groups (the default) / plain: "
        f"{result['together_x_plain_time']:.2f}x, median of {args.repeats} ({finding_s:.1f} s finding neighbours)"
    )
    harness.write_json(args.out, result)


if __name__ == "__main__":
    main()
