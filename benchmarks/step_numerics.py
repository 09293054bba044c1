"""Which kernels give a decode row the same numbers whatever rows step beside it, on this host.

A greedy answer is the same alone and batched only if every operator of the step gives a row the
numbers it gets alone (`kvboost_rag/hf/step.py`). Two questions, on random data of the default
model's shapes (3 K/V heads of 64, 3 query heads each, hidden 576):

- attention (fp32 scores, softmax, then the values' product in fp32 or bf16): is a row's output
  the same over its own width and over a wider, masked one, alone and among 2-8 rows? Once with
  widths as they come, once rounded up to 64 slots (the step's choice);
- a linear layer (fp32 and bf16 `nn.Linear`): is row i of an m-row product the same as row i of
  a 16-row one, for m = 1..16, and with m zero-padded to parts of 4 rows (the step's fp32 choice)?

Prints the counts of cases that differ (0 is what the step needs) and writes JSON
(benchmarks/results/step_numerics.json or --out). Run it with the AVX2 environment
(`make test-as-avx2`'s variables) for the other host kind.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

KV_HEADS, GROUP, HEAD_DIM, HIDDEN = 3, 3, 64, 576
LENGTHS = [*range(1, 140), 255, 256, 257, 500, 511, 512, 513, 700, 1000, 2047, 3000, 4001]


def rounded(slots: int, block: int) -> int:
    return -(-slots // block) * block


def attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, length: int) -> torch.Tensor:
    """Row 0's output over `keys`/`values` [rows, kv_heads, width, d], its slots past `length` masked."""
    rows, _, width, _ = keys.shape
    mask = torch.zeros(rows, 1, 1, width)
    mask[0, ..., length:] = float("-inf")
    probs = torch.matmul(query, keys.transpose(2, 3)).add_(mask).softmax(dim=-1)
    return torch.matmul(probs.to(values.dtype), values)[0]


def attention_cases(value_dtype: torch.dtype, block: int) -> tuple[int, int]:
    """(differing, all) cases of row 0 alone at its width against wider and among other rows."""
    generator = torch.Generator().manual_seed(0)
    differing = total = 0
    for length in LENGTHS:
        query = torch.randn(1, KV_HEADS, GROUP, HEAD_DIM, generator=generator)
        keys = torch.randn(1, KV_HEADS, length, HEAD_DIM, generator=generator)
        values = torch.randn(1, KV_HEADS, length, HEAD_DIM, generator=generator)

        def padded(width: int, rows: int) -> torch.Tensor:
            k = torch.randn(rows, KV_HEADS, width, HEAD_DIM, generator=generator)
            v = torch.randn(rows, KV_HEADS, width, HEAD_DIM, generator=generator)
            k[0], v[0] = 0, 0
            k[0, :, :length], v[0, :, :length] = keys[0], values[0]
            q = torch.cat([query, torch.randn(rows - 1, KV_HEADS, GROUP, HEAD_DIM, generator=generator)])
            return attention(q, k, v.to(value_dtype), length)

        alone = padded(rounded(length, block), 1)
        for extra in (0, 1, 2, 5, 30):
            for rows in (1, 2, 3, 8):
                total += 1
                differing += not torch.equal(alone, padded(rounded(length, block) + extra * block, rows))
    return differing, total


def linear_cases(dtype: torch.dtype, parts_of: int | None) -> tuple[int, int]:
    """(differing, all) rows of m-row products (m = 1..16) against the same rows of a 16-row one."""
    generator = torch.Generator().manual_seed(1)
    differing = total = 0
    for out_features, in_features in [(49152, HIDDEN), (1536, HIDDEN), (HIDDEN, 1536), (HIDDEN, HIDDEN)]:
        layer = torch.nn.Linear(in_features, out_features, bias=False).to(dtype)
        x = torch.randn(16, 1, in_features, generator=generator).to(dtype)

        def product(rows: torch.Tensor) -> torch.Tensor:
            if parts_of is None:
                return layer(rows)
            out = []
            for part in rows.split(parts_of):
                held = part.shape[0]
                part = torch.cat([part, part.new_zeros(parts_of - held, *part.shape[1:])])
                out.append(layer(part)[:held])
            return torch.cat(out)

        with torch.inference_mode():
            reference = product(x)
            for m in range(1, 17):
                total += 1
                differing += not torch.equal(product(x[:m]), reference[:m])
    return differing, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "step_numerics.json"))
    args = parser.parse_args()
    report: dict[str, object] = {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "ATEN_CPU_CAPABILITY": os.environ.get("ATEN_CPU_CAPABILITY"),
    }
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for block in (1, 64):
            differing, total = attention_cases(dtype, block)
            report[f"attention_{name}_values_width_block_{block}"] = {"differing": differing, "cases": total}
            print(f"attention, {name} values, widths rounded to {block:>2}: {differing} of {total} differ")
        for parts in (None, 4):
            differing, total = linear_cases(dtype, parts)
            label = "whole" if parts is None else f"parts_of_{parts}"
            report[f"linear_{name}_{label}"] = {"differing": differing, "cases": total}
            print(f"linear, {name}, {label.replace('_', ' ')}: {differing} of {total} rows differ")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
