"""Decode speed beside the peers a user would pick instead, in one run, on the same prompts.

Per prompt length (NQ passages joined up to it, raw text, greedy, a fixed number of new tokens):
- transformers: `model.generate` on the default model as transformers loads it, in the host's
  default dtype (bf16 with native bf16, else fp32), sdpa; decode step = time between its
  next-token choices;
- ours, float weights (`weights="float"`) and ours as users get it (`weights` left to the default:
  int4 from the GGUF's Q4_1 blocks on a CPU; drafts from the prompt, `draft_tokens`), and the
  default without drafts, each with the decode step: full prefill's time, the decode time a token
  (and the share of tokens taken from drafts), and the first token with reuse (the prompt's
  passages warmed, then given shuffled);
- llama.cpp: llama-server (`make llama-server`) on the same GGUF file, `/completion` with
  `cache_prompt` off (full prefill) and then on for the shuffled prompt after the original (its
  prefix cache, the reuse it offers), its own timings; and llama-server with its n-gram drafts
  (`--spec-type ngram-simple`, runs of 3 tokens looked up, 3 drafted: ours' sizes).
Medians over --repeats. JSON: benchmarks/results/bench_decode_peers.json (or --out).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import statistics
import subprocess
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import torch
from bench_decode import StepClock, prompt_of_length, step_s
from transformers import AutoModelForCausalLM, LogitsProcessorList

from kvboost_lab import harness
from kvboost_lab.http_server import free_port
from kvboost_rag import KVBoostRAG
from kvboost_rag.eval.data import load_qa
from kvboost_rag.hf.fingerprint import weight_format
from kvboost_rag.hf.loader import default_model_dir, default_model_gguf, resolve_dtype

LLAMA_SERVER = Path(__file__).resolve().parents[1] / ".llama.cpp" / "llama-server"


def passages_of_length(tokenizer, passages: list[str], length: int) -> list[str]:
    """The leading passages whose text reaches `length` tokens (the last one cut to fit)."""
    text = prompt_of_length(tokenizer, passages, length)
    return [p for p in text.split("\n\n") if p.strip()]


def transformers_step(model, tokenizer, prompt: str, new_tokens: int) -> float:
    ids = torch.tensor([tokenizer(prompt, add_special_tokens=False).input_ids])
    clock = StepClock()
    with torch.inference_mode():
        model.generate(
            ids,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            logits_processor=LogitsProcessorList([clock]),
        )
    return clock.step_s()


def ours(engine: KVBoostRAG, parts: list[str], new_tokens: int, seed: int) -> dict[str, float]:
    """Full prefill's first token and decode step, then the first token with the parts warmed
    and given in another order."""
    options = dict(max_new_tokens=new_tokens, ignore_eos=True, store_prompt=False)
    full = engine.generate("\n\n".join(parts), mode="full", **options)
    engine.warm(parts)
    shuffled = parts[:]
    random.Random(seed).shuffle(shuffled)
    reused = engine.generate("\n\n".join(shuffled), **options)
    return {
        "prefill_s": full.ttft_s,
        "step_s": step_s(full),
        "ttft_reuse_s": reused.ttft_s,
        "reuse_step_s": step_s(reused),
        "reused_tokens": reused.reused_tokens,
        "drafted_share": full.accepted_tokens / (full.new_tokens - 1),  # tokens a pass saved, per token
        # Repair and, where the first token was a near-tie, the exact prefill that verified it.
        "reuse_computed_tokens": reused.computed_tokens + reused.recomputed_tokens,
    }


class LlamaServer:
    """llama-server on a GGUF file, on a free port, for the length of a `with`."""

    def __init__(self, binary: Path, gguf: Path, threads: int, context: int, *extra: str) -> None:
        self.port = free_port()
        command = [str(binary), "-m", str(gguf), "-t", str(threads), "-c", str(context), "--port", str(self.port)]
        command += extra
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self) -> LlamaServer:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.process.kill()
        raise RuntimeError("llama-server did not come up in 120 s")

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)

    def complete(self, prompt: str, new_tokens: int, cache_prompt: bool) -> dict[str, float]:
        body = dict(prompt=prompt, n_predict=new_tokens, ignore_eos=True, temperature=0, cache_prompt=cache_prompt)
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/completion",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=600) as response:
            timings = json.load(response)["timings"]
        return {
            "wall_s": time.perf_counter() - started,
            "prefill_s": timings["prompt_ms"] / 1000,
            "prompt_tokens_computed": timings["prompt_n"],
            "step_s": timings["predicted_ms"] / 1000 / max(1, timings["predicted_n"]),
        }


def llama_cpp(server: LlamaServer, parts: list[str], new_tokens: int, seed: int) -> dict[str, float]:
    full = server.complete("\n\n".join(parts), new_tokens, cache_prompt=False)
    server.complete("\n\n".join(parts), 1, cache_prompt=True)  # its prefix cache holds the original order
    shuffled = parts[:]
    random.Random(seed).shuffle(shuffled)
    again = server.complete("\n\n".join(shuffled), 1, cache_prompt=True)
    return {
        "prefill_s": full["prefill_s"],
        "step_s": full["step_s"],
        "ttft_reuse_s": again["prefill_s"],
        "reuse_computed_tokens": again["prompt_tokens_computed"],
    }


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def main() -> None:
    p = harness.parser(__doc__, questions=0, k=0, seed=0, out="bench_decode_peers.json", max_new_tokens=64)
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 4000])
    p.add_argument("--repeats", type=int, default=3, help="runs per length and peer; medians are kept")
    p.add_argument("--llama-server", type=Path, default=LLAMA_SERVER, help="binary (make llama-server)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="llama-server's threads")
    args = harness.parse(p)
    dtype = resolve_dtype(args.dtype)
    passages = [e.passages[0].as_document() for e in load_qa(limit=600)]
    plain = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=dtype).eval()
    default = KVBoostRAG.from_pretrained(dtype=dtype, store="memory")
    engines = {
        "ours (float weights)": KVBoostRAG.from_pretrained(dtype=dtype, weights="float", store="memory"),
        "ours (default)": default,
        "ours (default, no drafts)": KVBoostRAG(
            default.model, default.tokenizer, replace(default.config, draft_tokens=0), name=default.name
        ),
    }
    tokenizer = engines["ours (default)"].tokenizer
    have_llama = args.llama_server.is_file()
    if not have_llama:
        print(f"no llama-server at {args.llama_server} (make llama-server): llama.cpp left out")
    rows = []
    gguf, threads = default_model_gguf(), args.threads
    serving = LlamaServer(args.llama_server, gguf, threads, 8192) if have_llama else None
    ngram = ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "3")
    drafting = LlamaServer(args.llama_server, gguf, threads, 8192, *ngram) if have_llama else None
    with serving or contextlib.nullcontext() as server, drafting or contextlib.nullcontext() as lookup:
        for length in args.lengths:
            parts = passages_of_length(tokenizer, passages, length)
            prompt = "\n\n".join(parts)
            row: dict = {"prompt_tokens": len(tokenizer(prompt, add_special_tokens=False).input_ids)}
            steps = [transformers_step(plain, tokenizer, prompt, args.max_new_tokens) for _ in range(args.repeats)]
            row["transformers"] = {"step_s": statistics.median(steps)}
            for name, engine in engines.items():
                runs = []
                for repeat in range(args.repeats):
                    fresh = KVBoostRAG(engine.model, engine.tokenizer, engine.config, name=engine.name)
                    runs.append(ours(fresh, parts, args.max_new_tokens, args.seed + repeat))
                row[name] = median_of(runs) | {"weights": weight_format(engine.model)}
            if server and lookup:
                runs = [llama_cpp(server, parts, args.max_new_tokens, args.seed + r) for r in range(args.repeats)]
                row["llama.cpp"] = median_of(runs)
                runs = [llama_cpp(lookup, parts, args.max_new_tokens, args.seed + r) for r in range(args.repeats)]
                row["llama.cpp (n-gram drafts)"] = median_of(runs)
            for peer in [k for k in row if isinstance(row[k], dict)]:
                row[peer]["tokens_per_s"] = 1 / row[peer]["step_s"]
            print(json.dumps(row), flush=True)
            rows.append(row)
    report = {
        "dtype": str(dtype),
        "max_new_tokens": args.max_new_tokens,
        "threads": torch.get_num_threads(),
        "llama_server": str(args.llama_server) if have_llama else None,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "rows": rows,
    }
    harness.write_json(args.out, report)
    for row in rows:
        base = row["transformers"]["tokens_per_s"]
        cells = [
            f"{peer} {v['tokens_per_s']:.1f} tok/s ({v['tokens_per_s'] / base:.2f}x)"
            for peer, v in row.items()
            if isinstance(v, dict)
        ]
        print(f"{row['prompt_tokens']} tokens: " + "; ".join(cells))


if __name__ == "__main__":
    main()
