"""Where should `RepairConfig.verify_margin` sit? CacheBlend's own confidence against full prefill.

For each question it records full prefill's greedy answer and CacheBlend's (rho 0.15, nothing
verified), with the probability lead of CacheBlend's top token over its runner-up at every
step. A verify margin m then decides the answer without rerunning anything: at the first step
whose lead is below m (with `refresh`, at the second step at the latest), the rest of the
answer is recomputed on exact KV, so where CacheBlend's tokens so far equal full prefill's, the
answer becomes full prefill's ("known"); where they already differ, the continuation is unknown
and counted as CacheBlend's answer. The questions are drawn from outside the eval's 500 (seed
0), so the eval is not the set the margin was chosen on. Prints a table per margin and writes
the records and the table as JSON; `--rows` simulates recorded answers again without a model.

JSON: benchmarks/results/verify/verify_margin_k{k}.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from tqdm import tqdm

from kvboost_lab import harness
from kvboost_rag import DecodeObserver, ExactnessConfig
from kvboost_rag.engine import Request
from kvboost_rag.eval.metrics import best_subspan_em
from kvboost_rag.eval.variants import Variant

MARGINS = (0.0, 0.02, 0.05, 0.1, 0.2)
REFRESHED_MARGINS = (0.0, 0.05)  # with `refresh`: every step after the first recomputed too


class LeadRecorder(DecodeObserver):
    """The lead of every sampled token over its runner-up, as the exactness policy reads it."""

    def __init__(self) -> None:
        self.leads: list[float] = []

    def on_token(self, request: Request, token: int) -> None:
        self.leads.append(self.lead(request))


def record_answers(args: argparse.Namespace) -> list[dict]:
    """Full prefill's and CacheBlend's greedy answers (nothing verified) with every step's lead."""
    nq = harness.draw_nq(args.questions, args.k, args.seed, outside_eval=True)
    engine = harness.load_engine(args)
    engine.generate("Warm-up.", max_new_tokens=1, mode="full")
    variants = [Variant("full", "full"), Variant("cacheblend", "reuse", engine.config.repair, ExactnessConfig.off())]
    rows = []
    for i in tqdm(range(len(nq)), unit="q"):
        engine.warm(nq.passages_for(i))
        prompt = nq.prompt(i, args.seed)
        row = {}
        for variant in variants:
            recorder = LeadRecorder()
            result = harness.answer(engine, prompt, variant, args.max_new_tokens, observer=recorder)
            row[variant.name] = dict(
                ids=result.token_ids,
                ttft_s=result.ttft_s,
                total_s=result.total_s,
                leads=recorder.leads,
                em=best_subspan_em(result.text, nq.examples[i].answers),
            )
        rows.append(row)
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
    p = harness.parser(__doc__, questions=250, k=5, seed=11, out="verify/verify_margin_k{k}.json", max_new_tokens=16)
    p.add_argument("--rows", type=Path, default=None, help="recorded answers (an earlier --out) to simulate again")
    args = harness.parse(p)
    recorded = json.loads(args.rows.read_text()) if args.rows else None
    rows = recorded["rows"] if recorded else record_answers(args)
    table = [simulate(rows, margin) for margin in MARGINS]
    table += [simulate(rows, margin, refresh=True) for margin in REFRESHED_MARGINS]
    print(f"k={args.k}, {len(rows)} questions outside the eval's")
    print(
        "margin         1st=full  answer=full  EM diff  1st verified  recomputed  unknown  TTFT med/mean  answer time"
    )
    for t in table:
        label = f"{t['margin']:g}" + (" +refresh" if t["refresh"] else "")
        print(
            f"{label:<13}  {t['first_token_agreement']:>7.1%}  {t['answer_agreement']:>10.1%}  "
            f"{t['em_diff_vs_full'] * 100:+7.1f}  {t['verified_first_token_share']:>11.0%}  "
            f"{t['recomputed_answer_share']:>9.0%}  {t['unknown_continuations']:>7}  "
            f"{t['ttft_median_ratio']:.2f}/{t['ttft_mean_ratio']:.2f}x  {t['answer_time_median_ratio']:>9.2f}x"
        )
    settings = (recorded["settings"] if recorded else vars(args)) | {  # as the answers were recorded
        "out": str(args.out),
        "rows": str(args.rows) if args.rows else None,
        "questions": len(rows),
    }
    harness.write_json(args.out, {"settings": settings, "table": table, "rows": rows}, indent=None)


if __name__ == "__main__":
    main()
