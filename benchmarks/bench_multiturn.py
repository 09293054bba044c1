"""Multi-turn chat: does the next turn reuse the conversation so far?

Conversations of --turns turns built from NQ-Open, each turn a new question, in two shapes:
plain chat (the history grows at the end of the prompt) and conversational RAG (each turn's
retrieved passages sit in the system message at the head, so the whole history moves every
turn and prefix caching loses it). The conversation goes on with the default's answers; at
every turn the same prompt is also answered by full prefill and by prefix caching (an engine of
its own that keeps only its prompts' exact chunks), so the figures are paired. Per turn: TTFT,
whole-answer time, reuse share (of the whole prompt, and of the history: the tokens before the
new message, which is all a cache can hold), and agreement with full prefill. With --repeats R,
every request is answered R times and its median kept: the first R-1 answers store nothing, so
each repeat meets the same cache (the last one stores the turn, as a user's request would), and
a slow moment of a shared host moves one repeat, not the turn's figure.

JSON: benchmarks/results/bench_multiturn.json (or --out), plot beside it.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvboost_lab import harness
from kvboost_rag import GenerationResult, KVBoostRAG
from kvboost_rag.eval.prompt import SYSTEM

SHAPES = ("plain", "rag")
RAG_SYSTEM = SYSTEM + "\n\nDocuments:\n\n{documents}"
PLAIN_SYSTEM = "You are a helpful assistant. Reply with a short answer only."


def conversation_prompt(shape: str, history: list[dict[str, str]], question: str, documents: list[str]) -> list:
    system = RAG_SYSTEM.format(documents="\n\n".join(documents)) if shape == "rag" else PLAIN_SYSTEM
    return [{"role": "system", "content": system}, *history, {"role": "user", "content": question}]


def history_tokens(engine: KVBoostRAG, prompt: list[dict[str, str]]) -> int:
    """How many of the prompt's tokens come before its new user message: the tokens the prompt
    shares with the conversation rendered without that message (a template may render the
    earlier turns otherwise once a message follows, so only the common part counts)."""
    whole = engine.tokenize_prompt(prompt)
    text = engine.tokenizer.apply_chat_template(prompt[:-1], tokenize=False)
    before = np.asarray(engine.tokenizer(text, add_special_tokens=False).input_ids, dtype=np.int64)
    n = min(len(whole), len(before))
    differs = np.flatnonzero(whole[:n] != before[:n])
    return int(differs[0]) if differs.size else n


def main() -> None:
    p = harness.parser(__doc__, questions=2, k=3, seed=0, out="bench_multiturn.json", max_new_tokens=24)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--repeats", type=int, default=1, help="answers per request; the median time is kept")
    args = harness.parse(p)
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    nq = harness.draw_nq(args.questions * args.turns, args.k, args.seed, outside_eval=True)
    engine = harness.load_engine(args)
    prefix_engine = KVBoostRAG(engine.model, engine.tokenizer, replace(engine.config), name=engine.name)
    harness.warm(engine, nq)  # the RAG shape's passages, pre-warmed as a corpus would be
    records: list[dict[str, Any]] = []
    for shape in SHAPES:
        for c in range(args.questions):
            history: list[dict[str, str]] = []
            for turn in range(args.turns):
                i = c * args.turns + turn
                documents = nq.passages_for(i)
                random.Random(f"{args.seed}:{i}").shuffle(documents)
                prompt = conversation_prompt(shape, history, nq.examples[i].question, documents)
                answers = {
                    "default": repeated(engine, prompt, "reuse", args),
                    "full": repeated(engine, prompt, "full", args),
                    "prefix": repeated(prefix_engine, prompt, "prefix", args),
                }
                full = answers["full"]
                before_new = history_tokens(engine, prompt)
                for name, result in answers.items():
                    records.append(
                        {
                            "shape": shape,
                            "conversation": c,
                            "turn": turn + 1,
                            "variant": name,
                            "prompt_tokens": result.prompt_tokens,
                            "ttft_s": result.ttft_s,
                            "total_s": result.total_s,
                            "ttft_repeats_s": result.ttft_repeats_s,
                            "reuse_share": result.reuse_share,
                            # the share of what came before the new message: all a cache can hold
                            "history_reuse_share": result.reused_tokens / before_new,
                            "first_token_agrees": result.token_ids[:1] == full.token_ids[:1],
                            "answer_agrees": result.text.strip() == full.text.strip(),
                        }
                    )
                print(
                    f"{shape} conversation {c} turn {turn + 1}: {full.prompt_tokens} tokens; "
                    + ", ".join(f"{n} {r.ttft_s * 1000:,.0f} ms ({r.reuse_share:.0%})" for n, r in answers.items())
                )
                history += [
                    {"role": "user", "content": nq.examples[i].question},
                    {"role": "assistant", "content": answers["default"].text},
                ]
    summary = summarize(records, args.turns)
    path = harness.write_json(args.out, {"settings": vars_of(args), "summary": summary, "records": records})
    plot(summary, path.with_suffix(".png"))


@dataclass(slots=True)
class Repeated:
    """One request answered `--repeats` times: the last answer, with the median times."""

    result: GenerationResult
    ttft_s: float
    total_s: float
    ttft_repeats_s: list[float]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.result, name)


def repeated(engine: KVBoostRAG, prompt: list[dict[str, str]], mode: str, args: Any) -> Repeated:
    """The request answered --repeats times; only the last stores its turn, so every repeat
    meets the same cache and the conversation goes on as with one answer."""
    runs = [
        engine.generate(prompt, mode=mode, max_new_tokens=args.max_new_tokens, store_prompt=last)
        for last in [False] * (args.repeats - 1) + [True]
    ]
    if any(run.token_ids != runs[-1].token_ids for run in runs):
        raise RuntimeError("a repeated request answered otherwise: the cache it met was not the same")
    ttfts = [run.ttft_s for run in runs]
    return Repeated(runs[-1], statistics.median(ttfts), statistics.median(r.total_s for r in runs), ttfts)


def summarize(records: list[dict[str, Any]], turns: int) -> dict[str, Any]:
    """Medians per shape, turn and variant."""
    table: dict[str, Any] = {}
    for shape in SHAPES:
        for variant in ("full", "prefix", "default"):
            rows = []
            for turn in range(1, turns + 1):
                mine = [r for r in records if (r["shape"], r["variant"], r["turn"]) == (shape, variant, turn)]
                rows.append(
                    {
                        "turn": turn,
                        "prompt_tokens": statistics.median(r["prompt_tokens"] for r in mine),
                        "ttft_s": statistics.median(r["ttft_s"] for r in mine),
                        "total_s": statistics.median(r["total_s"] for r in mine),
                        "reuse_share": statistics.fmean(r["reuse_share"] for r in mine),
                        "history_reuse_share": statistics.fmean(r["history_reuse_share"] for r in mine),
                        "first_token_agreement": statistics.fmean(r["first_token_agrees"] for r in mine),
                        "answer_agreement": statistics.fmean(r["answer_agrees"] for r in mine),
                    }
                )
            table[f"{shape}/{variant}"] = rows
    return table


def vars_of(args: Any) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=False)
    for axis, shape in zip(axes, SHAPES):
        for variant in ("full", "prefix", "default"):
            rows = summary[f"{shape}/{variant}"]
            axis.plot([r["turn"] for r in rows], [r["ttft_s"] for r in rows], marker="o", label=variant)
        axis.set_title("plain chat" if shape == "plain" else "conversational RAG (passages at the head)")
        axis.set_xlabel("turn")
        axis.set_ylabel("median TTFT (s)")
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
