"""Where should `RepairConfig.verify_margin` sit? CacheBlend's own confidence against full prefill.

For each question it records full prefill's greedy answer and CacheBlend's (rho 0.15, nothing
verified), with the probability lead of CacheBlend's top token over its runner-up at every
step. A verify margin m then decides the answer without rerunning anything: at the first step
whose lead is below m (with `refresh`, at the second step at the latest), the rest of the
answer is recomputed on exact KV, so where CacheBlend's tokens so far equal full prefill's, the
answer becomes full prefill's ("known"); where they already differ, the continuation is unknown
and counted as CacheBlend's answer. The questions are drawn from outside the eval's 500 (seed
0), so the eval is not the set the margin was chosen on. Prints a table per margin and writes
the records and the table as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

from tqdm import tqdm

import kvboost_rag.engine as engine_module
from kvboost_rag import KVBoostRAG
from kvboost_rag.config import RepairConfig
from kvboost_rag.evaluation import DEFAULT_TEMPLATE, build_messages
from kvboost_rag.metrics import best_subspan_em
from kvboost_rag.qa_dataset import load_qa
from kvboost_rag.retrieval import retrieve_documents
from kvboost_rag.sampling import top_margin

MARGINS = (0.0, 0.02, 0.05, 0.1, 0.2)
REFRESHED_MARGINS = (0.0, 0.05)  # with `refresh`: every step after the first recomputed too


def record_answers(questions: int, k: int, seed: int) -> list[dict]:
    examples = load_qa()
    in_eval = {e.question for e in random.Random(0).sample(examples, 500)}
    chosen = random.Random(seed).sample([e for e in examples if e.question not in in_eval], questions)
    retrieved = retrieve_documents(examples, chosen, k)
    engine = KVBoostRAG.from_pretrained()
    leads: list[float] = []
    sample = engine_module.sample_token

    def sample_and_record(logits, params, generator):  # type: ignore[no-untyped-def]
        leads.append(top_margin(logits))
        return sample(logits, params, generator)

    # NOTE: the engine's sampler is wrapped to see every step's logits; nothing else changes.
    engine_module.sample_token = sample_and_record
    engine.generate("Warm-up.", max_new_tokens=1, mode="full")
    rows = []
    for i in tqdm(range(questions), unit="q"):
        documents = list(retrieved[i])
        engine.warm(documents)
        random.Random(f"{seed}:{i}").shuffle(documents)
        prompt = build_messages(chosen[i].question, documents, DEFAULT_TEMPLATE, chat=True)
        row = {}
        for name, mode, repair in (("full", "full", None), ("cacheblend", "reuse", RepairConfig().alone())):
            leads.clear()
            result = engine.generate(prompt, mode=mode, repair=repair, max_new_tokens=16, stop=["\n"], store_prompt=False)
            row[name] = dict(
                ids=result.token_ids,
                ttft_s=result.ttft_s,
                total_s=result.total_s,
                leads=list(leads),
                em=best_subspan_em(result.text, chosen[i].answers),
            )
        rows.append(row)
    engine_module.sample_token = sample
    return rows


def simulate(rows: list[dict], margin: float, refresh: bool = False) -> dict[str, float]:
    full_ttft = statistics.median(r["full"]["ttft_s"] for r in rows)
    first = answer = em_diff = verified_first = recomputed = unknown = 0
    ttft, total = [], []
    for row in rows:
        full, blend = row["full"], row["cacheblend"]
        step = next((i for i, lead in enumerate(blend["leads"]) if lead < margin or refresh and i > 0), None)
        ids, em = blend["ids"], blend["em"]
        ttft.append(blend["ttft_s"] + (full["ttft_s"] if step == 0 else 0.0))
        total.append(blend["total_s"] + (full["ttft_s"] if step is not None else 0.0))
        if step is not None:
            recomputed += 1
            verified_first += step == 0
            if blend["ids"][:step] == full["ids"][:step]:
                ids, em = full["ids"], full["em"]
            else:
                unknown += 1
        first += ids[:1] == full["ids"][:1]
        answer += ids == full["ids"]
        em_diff += em - full["em"]
    n = len(rows)
    return {
        "margin": margin,
        "refresh": refresh,
        "first_token_agreement": first / n,
        "answer_agreement": answer / n,
        "em_diff_vs_full": em_diff / n,
        "verified_first_token_share": verified_first / n,
        "recomputed_answer_share": recomputed / n,
        "unknown_continuations": unknown,
        "ttft_median_ratio": statistics.median(ttft) / full_ttft,
        "ttft_mean_ratio": statistics.fmean(ttft) / full_ttft,
        "answer_time_median_ratio": statistics.median(total) / statistics.median(r["full"]["total_s"] for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--questions", type=int, default=250)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--rows", type=Path, default=None, help="recorded answers to simulate again")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(__file__).parent / "results" / "verify" / f"verify_margin_k{args.k}.json"
    rows = json.loads(args.rows.read_text())["rows"] if args.rows else record_answers(args.questions, args.k, args.seed)
    table = [simulate(rows, margin) for margin in MARGINS]
    table += [simulate(rows, margin, refresh=True) for margin in REFRESHED_MARGINS]
    print(f"k={args.k}, {len(rows)} questions outside the eval's")
    print("margin         1st=full  answer=full  EM diff  1st verified  recomputed  unknown  TTFT med/mean  answer time")
    for t in table:
        label = f"{t['margin']:g}" + (" +refresh" if t["refresh"] else "")
        print(
            f"{label:<13}  {t['first_token_agreement']:>7.1%}  {t['answer_agreement']:>10.1%}  "
            f"{t['em_diff_vs_full'] * 100:+7.1f}  {t['verified_first_token_share']:>11.0%}  "
            f"{t['recomputed_answer_share']:>9.0%}  {t['unknown_continuations']:>7}  "
            f"{t['ttft_median_ratio']:.2f}/{t['ttft_mean_ratio']:.2f}x  {t['answer_time_median_ratio']:>9.2f}x"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = vars(args) | {"out": str(out), "rows": str(args.rows) if args.rows else None, "questions": len(rows)}
    out.write_text(json.dumps({"settings": settings, "table": table, "rows": rows}))


if __name__ == "__main__":
    main()
