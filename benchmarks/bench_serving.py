"""Many clients, one model: `kvboost-rag serve` under 1, 4 and 8 concurrent streaming clients.

The server runs as users start it (`python -m kvboost_rag.cli serve`, its defaults: int4 weights
where the GGUF allows, continuous batching, `--max-running 8`), in its own process; the clients
are the official `openai` client in threads of this one. The NQ questions' documents are warmed
through `/kvboost/warm` first, so prompts reuse them as a RAG server's do. Every client count
answers the same prompts (greedy, `ignore_eos`: answers of exactly --max-tokens; prompts not
kept, nor cached by llama-server: each run reuses the warmed documents alone), each client
taking its share one after another; the one-client run is the sequential reference.

Per client count: wall time, aggregate completion tokens/s (and x one client's), per-request
p50/p95 TTFT and decode tokens/s, and how many answers equal the sequential ones (first chunk
and whole). Beside it, in the same run: llama-server (`make llama-server`) with `--parallel`
slots on the same GGUF and the same clients, and transformers' own continuous batching
(`generate_batch`) on the first 8 prompts at once. Then the load test: 200 streamed requests from 8
clients, every 25th client hanging up after two chunks: errors, truncated streams, and what
`/metrics` says is left running. `--device cuda --clients 1 8 32` is the GPU check.
JSON: benchmarks/results/bench_serving.json (or --out).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai

from kvboost_lab import harness
from kvboost_lab.http_server import free_port

# each run sees the warmed documents alone: a kept prompt (ours) or a cached one (llama.cpp's prompt
# cache) would let a later run reuse the same prompt whole, which RAG prompts never are
OURS = {"kvboost": {"store_prompt": False}}
LLAMA_CPP = {"cache_prompt": False}
LLAMA_SERVER = Path(__file__).resolve().parents[1] / ".llama.cpp" / "llama-server"


@contextlib.contextmanager
def server(command: list[str], port: int, ready_path: str = "/health") -> Iterator[str]:
    """A server process until the block ends; yields its /v1 base URL."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None and time.monotonic() < deadline, f"{command[0]} did not start"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(root + ready_path, timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
        yield root + "/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def one_request(
    client: openai.OpenAI, model: str, messages: Any, max_tokens: int, hang_up: bool = False, extra: dict | None = None
) -> dict:
    """One streamed answer, timed from the call: TTFT, decode rate, its text and how it ended."""
    started = time.perf_counter()
    record: dict[str, Any] = {"text": "", "first_chunk": None, "finish": None, "tokens": None, "error": None}
    times: list[float] = []
    try:
        stream = client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, **(extra or OURS)},
        )
        for chunk in stream:
            if chunk.usage is not None:
                record["tokens"] = chunk.usage.completion_tokens
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta.content
            if delta:
                times.append(time.perf_counter() - started)
                record["first_chunk"] = record["first_chunk"] or delta
                record["text"] += delta
                if hang_up and len(times) == 2:
                    stream.close()
                    record["finish"] = "hung up"
                    break
            record["finish"] = chunk.choices[0].finish_reason or record["finish"]
    except Exception as error:  # noqa: BLE001 - counted and reported, never hidden
        record["error"] = repr(error)
    record["total_s"] = time.perf_counter() - started
    record["ttft_s"] = times[0] if times else None
    if len(times) > 1 and record["tokens"]:
        record["decode_tokens_per_s"] = (record["tokens"] - 1) / (times[-1] - times[0])
    return record


def clients_run(
    base_url: str, model: str, prompts: list, clients: int, max_tokens: int, hang_up_every: int = 0, extra=None
):
    """Each of `clients` threads answers its share of the prompts in turn; records in prompt order, wall s."""
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
    records: list[dict | None] = [None] * len(prompts)

    def work(mine: list[int]) -> None:
        for i in mine:
            hang_up = bool(hang_up_every) and i % hang_up_every == hang_up_every - 1
            records[i] = one_request(client, model, prompts[i], max_tokens, hang_up, extra)

    threads = [threading.Thread(target=work, args=(list(range(k, len(prompts), clients)),)) for k in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return records, time.perf_counter() - started


def show(label: str, row: dict[str, Any]) -> None:
    print(f"{label}:", {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1] if len(values) > 1 else values[0]


def summary(records: list[dict], wall_s: float, reference: list[dict] | None) -> dict[str, Any]:
    done = [r for r in records if r["error"] is None]
    ttfts = [r["ttft_s"] for r in done if r["ttft_s"] is not None]
    rates = [r["decode_tokens_per_s"] for r in done if "decode_tokens_per_s" in r]
    tokens = sum(r["tokens"] or 0 for r in done)
    row: dict[str, Any] = {
        "requests": len(records),
        "errors": len(records) - len(done),
        "wall_s": wall_s,
        "completion_tokens": tokens,
        "aggregate_tokens_per_s": tokens / wall_s,
        "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
        "ttft_p95_s": quantile(ttfts, 0.95) if ttfts else None,
        "decode_tokens_per_s_p50": statistics.median(rates) if rates else None,
        "decode_tokens_per_s_p95_low": quantile(rates, 0.05) if rates else None,  # the slowest 5%'s bound
    }
    if reference is not None:
        pairs = list(zip(records, reference))
        row["same_first_chunk"] = sum(a["first_chunk"] == b["first_chunk"] for a, b in pairs) / len(pairs)
        row["same_answer"] = sum(a["text"] == b["text"] for a, b in pairs) / len(pairs)
        # where a batched row rounds differently, how far each answer goes before it parts
        row["text_before_parting_p50"] = statistics.median(
            len(os.path.commonprefix([a["text"], b["text"]])) / max(len(b["text"]), 1) for a, b in pairs
        )
    return row


def load_test(base_url: str, model: str, prompts: list, max_tokens: int, root: str, count: int) -> dict[str, Any]:
    """`count` (200) streamed requests, 8 clients, every 25th hanging up after two chunks."""
    many = [prompts[i % len(prompts)] for i in range(count)]
    records, wall_s = clients_run(base_url, model, many, 8, max_tokens, hang_up_every=25)
    hung = [r for r in records if r["finish"] == "hung up"]
    kept = [r for r in records if r["finish"] != "hung up"]
    truncated = [r for r in kept if r["error"] is None and (r["finish"] != "length" or r["tokens"] != max_tokens)]
    # the last request may be one that hung up: the server frees its row when it sees the
    # disconnect, a moment after the client left, so the gauges are read until they are empty
    ended = time.perf_counter()
    while True:
        left = httpx.get(root + "/metrics", timeout=10).text
        gauges = {
            name: float(line.split()[-1])
            for line in left.splitlines()
            for name in ("kvboost:num_requests_running", "kvboost:num_requests_waiting")
            if line.startswith(name + " ")
        }
        if not any(gauges.values()) or time.perf_counter() - ended > 10:
            break
        time.sleep(0.05)
    return {
        "requests": len(records),
        "errors": sum(r["error"] is not None for r in records),
        "truncated": len(truncated),
        "hung_up": len(hung),
        "wall_s": wall_s,
        "running_after": gauges.get("kvboost:num_requests_running"),
        "empty_after_s": time.perf_counter() - ended,
        "waiting_after": gauges.get("kvboost:num_requests_waiting"),
    }


def transformers_batch(model_dir: Path, prompts: list, max_tokens: int, device: str) -> dict[str, Any]:
    """transformers' continuous batching (`generate_batch`, paged cache) on the same chat prompts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from kvboost_rag.hf.loader import resolve_dtype

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dtype = resolve_dtype(None, device)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").to(device)
    ids = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True) for p in prompts]
    ids = [list(i["input_ids"]) if isinstance(i, dict) or hasattr(i, "keys") else list(i) for i in ids]
    config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=-1)  # no end: fixed length
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate_batch(ids, generation_config=config, max_new_tokens=max_tokens)
    wall_s = time.perf_counter() - started
    tokens = sum(len(o.generated_tokens) for o in out.values())
    return {
        "requests": len(ids),
        "wall_s": wall_s,
        "completion_tokens": tokens,
        "aggregate_tokens_per_s": tokens / wall_s,
    }


def main() -> None:
    p = harness.parser(__doc__, questions=24, k=5, seed=0, out="bench_serving.json", max_new_tokens=128, dtype=False)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8], help="concurrent clients (1 first)")
    p.add_argument("--device", default="cpu", help="the server's device (cuda: the GPU check)")
    p.add_argument("--load-requests", type=int, default=200, help="requests of the load test")
    p.add_argument("--skip-peers", action="store_true", help="ours only (no llama-server, no transformers)")
    args = harness.parse(p)
    from kvboost_rag.hf.loader import default_model_dir, default_model_gguf

    nq = harness.draw_nq(args.questions, args.k, args.seed)
    prompts = [nq.prompt(i, args.seed) for i in range(len(nq))]
    port = free_port()
    flags = ["--store", "memory", "--port", str(port), "--device", args.device, "--max-waiting", "256"]
    flags += ["--max-running", str(max(args.clients))]  # the batch holds every client (8: the default)
    command = [sys.executable, "-m", "kvboost_rag.cli", "serve", *flags]
    if args.model:
        command += ["--model", args.model]
    report: dict[str, Any] = {"max_tokens": args.max_new_tokens, "k": args.k, "prompts": len(prompts), "ours": {}}
    with server(command, port) as url:
        root = url.removesuffix("/v1")
        model = httpx.get(url + "/models").json()["data"][0]["id"]
        warmed = httpx.post(root + "/kvboost/warm", json={"documents": nq.all_documents(args.k)}, timeout=3600)
        print("warmed:", warmed.json())
        clients_run(url, model, prompts[:2], 1, 4)  # first-call costs, and the template's head cached
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        full, alone = [], {"kvboost": {"mode": "full", "store_prompt": False}}
        for messages in prompts[:5]:  # full prefill's TTFT, alone: the target's allowance
            started = time.perf_counter()
            client.chat.completions.create(
                model=model, messages=messages, max_tokens=1, temperature=0, extra_body=alone
            )
            full.append(time.perf_counter() - started)
        report["full_prefill_s"] = statistics.median(full)
        reference = None
        for count in args.clients:
            records, wall_s = clients_run(url, model, prompts, count, args.max_new_tokens)
            reference = reference or records
            row = report["ours"][str(count)] = summary(records, wall_s, reference)
            show(f"ours, {count} clients", row)
        report["load_test"] = load_test(url, model, prompts, 32, root, args.load_requests)
        print("load test:", report["load_test"])
    if not args.skip_peers and LLAMA_SERVER.exists() and args.device == "cpu":
        port = free_port()
        slots = max(args.clients)
        command = [str(LLAMA_SERVER), "-m", str(default_model_gguf()), "--port", str(port), "-t", "2"]
        command += ["--parallel", str(slots), "-c", str(slots * 2048)]
        report["llama_cpp"] = {}
        with server(command, port) as url:
            clients_run(url, "default", prompts[:2], 1, 4)
            reference = None
            for count in args.clients:
                records, wall_s = clients_run(url, "default", prompts, count, args.max_new_tokens, extra=LLAMA_CPP)
                reference = reference or records
                row = report["llama_cpp"][str(count)] = summary(records, wall_s, reference)
                print(
                    f"llama.cpp, {count} clients:",
                    {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()},
                )
    if not args.skip_peers:
        # 8 prompts, all at once (its own scheduler): the 24 took 164 s at 64 tokens here
        report["transformers_generate_batch"] = transformers_batch(
            default_model_dir(), prompts[:8], args.max_new_tokens, args.device
        )
        print("transformers generate_batch:", report["transformers_generate_batch"])
    one = report["ours"][str(args.clients[0])]
    for row in report["ours"].values():
        row["x_one_client"] = row["aggregate_tokens_per_s"] / one["aggregate_tokens_per_s"]
        row["ttft_p95_allowance_s"] = 2 * one["ttft_p50_s"] + report["full_prefill_s"]
    harness.write_json(args.out, report)


if __name__ == "__main__":
    main()
