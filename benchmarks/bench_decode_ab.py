"""Decode speed of one checkout, for an A/B against another: run it under each in turn.

The default engine (its dtype, int4 weights): decode tokens/s of a full-prefill answer of
--max-new-tokens greedy tokens (`ignore_eos`) at each --lengths prompt length (NQ passages joined;
the best of --repeats, drafts on as by default), then NQ prompts with their top-k documents warmed:
tokens/s answering them one at a time and all together (`generate_batch`, --max-running), and how
many answers are equal both ways. For the commit before, run this file with that checkout first
on PYTHONPATH (`PYTHONPATH=/path/to/old python benchmarks/bench_decode_ab.py --out ...`), on the
same machine, back to back.

JSON: benchmarks/results/bench_decode_ab.json (or --out).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import kvboost_rag
from kvboost_lab import harness
from kvboost_rag.eval.data import load_qa


def checkout_commit() -> str | None:
    """The commit of the kvboost_rag imported here (which may not be this file's checkout)."""
    folder = Path(kvboost_rag.__file__).resolve().parent
    done = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or None


def main() -> None:
    p = harness.parser(__doc__, questions=8, k=5, seed=3, out="bench_decode_ab.json", max_new_tokens=128)
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 4000])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--answer-tokens", type=int, default=64, help="tokens of each NQ answer")
    p.add_argument("--max-running", type=int, default=8)
    args = harness.parse(p)
    engine = harness.load_engine(args, max_running=args.max_running)
    text = "\n\n".join(e.passages[0].as_document() for e in load_qa(limit=200))
    ids = engine.tokenizer(text, add_special_tokens=False).input_ids
    report: dict[str, object] = {"checkout": checkout_commit(), "dtype": str(engine.model.dtype), "decode": {}}
    for length in args.lengths:
        prompt = engine.tokenizer.decode(ids[:length])
        rates = []
        for _ in range(args.repeats):
            r = engine.generate(
                prompt, max_new_tokens=args.max_new_tokens, ignore_eos=True, store_prompt=False, mode="full"
            )
            rates.append((r.new_tokens - 1) / (r.total_s - r.ttft_s))
        report["decode"][str(length)] = max(rates)  # type: ignore[index]
        print(f"{length} prompt tokens: {max(rates):.1f} tokens/s")
    nq = harness.draw_nq(args.questions, args.k, args.seed)
    harness.warm(engine, nq)
    prompts = [nq.prompt(i, args.seed) for i in range(len(nq))]
    options = dict(max_new_tokens=args.answer_tokens, ignore_eos=True, store_prompt=False)
    alone, alone_s, together, together_s = harness.alone_and_together(engine, prompts, **options)
    tokens = len(prompts) * args.answer_tokens
    report.update(
        one_at_a_time_tokens_per_s=tokens / alone_s,
        together_tokens_per_s=tokens / together_s,
        equal_answers=sum(a.token_ids == b.token_ids for a, b in zip(alone, together)),
        prompts=len(prompts),
    )
    print(
        f"NQ k={args.k}: {tokens / alone_s:.1f} tokens/s one at a time, {tokens / together_s:.1f} together; "
        f"{report['equal_answers']} of {len(prompts)} answers equal"
    )
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
