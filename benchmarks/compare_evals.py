"""Do two `kvboost-rag eval` runs give the same records (timings aside)? For refactors: run the
same eval before and after a change and compare, question by question, every variant both hold.

    python benchmarks/compare_evals.py before/eval_k5_n12.json after/eval_k5_n6.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

FIELDS = ("em", "f1", "text", "first_token_agrees", "answer_agrees", "reuse_share", "repair_share", "exact_from")
CLOSE_FIELDS = ("reference_margin", "first_token_kl")  # floats that may differ in the last bits


def differences(before: dict, after: dict) -> list[str]:
    found = []
    for name, records in before["records"].items():
        others = {r["question"]: r for r in after["records"].get(name, [])}
        for record in records:
            other = others.get(record["question"])
            if other is None:
                continue
            bad = [f for f in FIELDS if record[f] != other[f]]
            bad += [f for f in CLOSE_FIELDS if not math.isclose(record[f], other[f], rel_tol=1e-6, abs_tol=1e-6)]
            if bad:
                changes = ", ".join(f"{f} {record[f]!r} -> {other[f]!r}" for f in bad)
                found.append(f"{name} q{record['question']}: {changes}")
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    args = p.parse_args()
    before, after = (json.loads(path.read_text()) for path in (args.before, args.after))
    compared = sum(
        1
        for name, records in before["records"].items()
        for r in records
        if r["question"] in {o["question"] for o in after["records"].get(name, [])}
    )
    found = differences(before, after)
    for line in found:
        print(line)
    print(f"{compared - len(found)} of {compared} records equal")
    return int(bool(found))


if __name__ == "__main__":
    sys.exit(main())
