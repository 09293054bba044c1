"""Answers under two weight formats, question by question: two `kvboost-rag eval` runs on the same
questions (same --limit, --k and --seed), one per `--weights`.

    kvboost-rag eval --limit 500 --k 5 --variants full --weights float --out results/weights/float
    kvboost-rag eval --limit 500 --k 5 --variants full --weights int4 --out results/weights/int4
    python benchmarks/compare_weights.py results/weights/float/eval_k5_n500.json \
        results/weights/int4/eval_k5_n500.json --out benchmarks/results/weights_k5_n500.json

Per variant both runs hold: first-token agreement (the answers' first tokens), whole answers
equal, EM of each with the paired difference and its 95% interval (bootstrap over questions).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from kvboost_rag.hf.loader import default_model_dir


def first_token(tokenizer, text: str) -> int | None:
    ids = tokenizer(text, add_special_tokens=False).input_ids
    return ids[0] if ids else None


def paired_interval(differences: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(differences, k=len(differences))) / len(differences) for _ in range(draws))
    return means[int(0.025 * draws)], means[int(0.975 * draws) - 1]


def compare(reference: dict, candidate: dict, tokenizer) -> dict[str, dict]:
    rows = {}
    for variant, records in reference["records"].items():
        theirs = {r["question"]: r for r in candidate["records"].get(variant, [])}
        pairs = [(r, theirs[r["question"]]) for r in records if r["question"] in theirs]
        if not pairs:
            continue
        differences = [b["em"] - a["em"] for a, b in pairs]
        low, high = paired_interval(differences)
        rows[variant] = {
            "questions": len(pairs),
            "first_token_agreement": sum(
                first_token(tokenizer, a["text"]) == first_token(tokenizer, b["text"]) for a, b in pairs
            )
            / len(pairs),
            "answers_equal": sum(a["text"] == b["text"] for a, b in pairs) / len(pairs),
            "em_reference": sum(a["em"] for a, _ in pairs) / len(pairs),
            "em_candidate": sum(b["em"] for _, b in pairs) / len(pairs),
            "em_difference": sum(differences) / len(pairs),
            "em_difference_95": [low, high],
            "ttft_median_reference_s": sorted(a["ttft_s"] for a, _ in pairs)[len(pairs) // 2],
            "ttft_median_candidate_s": sorted(b["ttft_s"] for _, b in pairs)[len(pairs) // 2],
            "total_median_reference_s": sorted(a["total_s"] for a, _ in pairs)[len(pairs) // 2],
            "total_median_candidate_s": sorted(b["total_s"] for _, b in pairs)[len(pairs) // 2],
        }
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reference", type=Path, help="eval JSON of the reference format (float weights)")
    p.add_argument("candidate", type=Path, help="eval JSON of the candidate format (int4)")
    p.add_argument("--out", type=Path, default=None, help="JSON to write")
    args = p.parse_args()
    from transformers import AutoTokenizer

    reference, candidate = (json.loads(path.read_text()) for path in (args.reference, args.candidate))
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    rows = compare(reference, candidate, tokenizer)
    report = {
        "reference": {"file": str(args.reference), "settings": reference["settings"], "run": reference["run"]},
        "candidate": {"file": str(args.candidate), "settings": candidate["settings"], "run": candidate["run"]},
        "variants": rows,
    }
    for variant, row in rows.items():
        low, high = row["em_difference_95"]
        print(
            f"{variant}: {row['questions']} questions; first token equal {row['first_token_agreement']:.1%}, "
            f"answers equal {row['answers_equal']:.1%}; EM {row['em_reference']:.1%} -> {row['em_candidate']:.1%} "
            f"({row['em_difference']:+.1%} [{low:+.1%}, {high:+.1%}])"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
