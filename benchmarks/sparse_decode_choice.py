"""How good is decode-time retrieval's choice of pages? Quest's bound against exact choices.

Per NQ prompt (top-k FAISS passages, shuffled as the eval does): one full prefill, dense
attention's greedy answer, then each decode attention teacher-forced along that answer over a
copy of the cache. Per attention: the answers whose every next token is dense's (the free-run
answer would then be dense's), the share of steps whose argmax is dense's, and the mean KL of
the next-token distribution from dense's. Attentions: `quest` (SparseDecodeConfig, its threshold,
or `quest:T`), `oracle` (the pages whose best exact score is highest: free here, a bound on
any choice), `sparq:R` (approximate scores on the query's R largest dimensions, as SparQ
attention; each page by its best token), `sdpa` (dense attention through sdpa's kernel: the
noise floor of "equal" at this dtype); `@B` sets the token budget (oracle@3072).

JSON: benchmarks/results/sparse_decode_choice.json (or --out).
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

import torch

from kvboost_lab import harness
from kvboost_rag import SparseDecodeConfig
from kvboost_rag.hf.cache import forward_last_logits, make_cache
from kvboost_rag.ops.page_selection import attend_selected, select_pages
from kvboost_rag.ops.sparse_decode import SparseDecode


class PageChoice:
    """Pages by each KV head group's best token score (exact, or on `dims` query dimensions),
    pooled as probabilities over the group's heads; then attention to them as retrieval's."""

    def __init__(self, config: SparseDecodeConfig, dims: int | None) -> None:
        self.config, self.dims = config, dims

    def attend(self, layer: int, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float):
        c, length = self.config, keys.shape[2]
        if length <= c.budget_tokens:
            return None
        kv_heads, dim = keys.shape[1], keys.shape[3]
        whole = length // c.page_size * c.page_size
        grouped = query[0, :, 0].float().view(kv_heads, -1, dim)
        paged = keys[0, :, :whole].float()
        if self.dims:  # SparQ: the dimensions where the group's query is largest, rescaled
            top = grouped.abs().sum(1).topk(self.dims, dim=-1).indices
            share = grouped.gather(2, top.unsqueeze(1).expand(-1, grouped.shape[1], -1))
            rescale = share.abs().sum(-1, keepdim=True) / grouped.abs().sum(-1, keepdim=True)
            scores = share @ paged.gather(2, top.unsqueeze(1).expand(-1, whole, -1)).transpose(1, 2) / rescale
        else:
            scores = grouped @ paged.transpose(1, 2)
        best = (scores * scale).view(kv_heads, grouped.shape[1], -1, c.page_size).amax(-1)
        pooled = (best - best.logsumexp(-1, keepdim=True)).exp().sum(1)
        chosen = select_pages(pooled, length, c.page_size, c.budget_tokens, c.sink_tokens, c.recent_tokens)
        out = attend_selected(query[0, :, 0], keys[0], values[0], chosen, scale)
        return out.view(1, 1, *out.shape)

    def forget(self) -> None:
        pass


class SdpaDense:
    def attend(self, layer: int, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float):
        out = torch.nn.functional.scaled_dot_product_attention(query, keys, values, scale=scale, enable_gqa=True)
        return out.transpose(1, 2)

    def forget(self) -> None:
        pass


def attention_for(spec: str) -> Any:
    name, _, budget = spec.partition("@")
    name, _, argument = name.partition(":")
    config = SparseDecodeConfig(enabled=True, min_prompt_tokens=1)
    if budget:
        config = replace(config, budget_tokens=int(budget))
    if name == "quest":
        threshold = float(argument) if argument else config.correction_threshold
        return SparseDecode(replace(config, correction_threshold=threshold))
    if name == "oracle":
        return PageChoice(config, None)
    if name == "sparq":
        return PageChoice(config, int(argument or 16))
    if name == "sdpa":
        return SdpaDense()
    raise SystemExit(f"unknown attention {spec!r}: quest[:T], oracle, sparq[:R] or sdpa, each with @budget")


def main() -> None:
    p = harness.parser(__doc__, questions=12, k=40, seed=0, out="sparse_decode_choice.json", max_new_tokens=32)
    p.add_argument("--attentions", nargs="+", default=["quest", "quest@3072", "sparq:16", "oracle", "oracle@3072"])
    args = harness.parse(p)
    nq = harness.draw_nq(args.questions, args.k, args.seed)
    engine = harness.load_engine(args)
    results: dict[str, list[dict[str, float]]] = {spec: [] for spec in args.attentions}
    for i in range(len(nq)):
        tokens = engine.tokenize_prompt(nq.prompt(i, args.seed))
        first, keys, values = harness.full_prefill_kv(engine, tokens)
        answer, reference = [], []
        cache, logits = make_cache(keys, values), first
        for step in range(args.max_new_tokens):
            answer.append(int(logits.argmax()))
            reference.append(logits.log_softmax(-1))
            logits = forward_last_logits(
                engine.model, torch.tensor([answer[-1]]), torch.tensor([len(tokens) + step]), cache
            )
        for spec in args.attentions:
            cache, attention = make_cache(keys, values), attention_for(spec)
            agree, kl = [], []
            for step in range(args.max_new_tokens - 1):  # the first token is the prefill's
                logits = forward_last_logits(
                    engine.model,
                    torch.tensor([answer[step]]),
                    torch.tensor([len(tokens) + step]),
                    cache,
                    sparse=attention,
                )
                agree.append(float(int(logits.argmax()) == answer[step + 1]))
                ours = logits.log_softmax(-1)
                kl.append(float((reference[step + 1].exp() * (reference[step + 1] - ours)).sum()))
            results[spec].append(
                {"equal": float(all(agree)), "agreement": statistics.fmean(agree), "kl": statistics.fmean(kl)}
            )
            print(i, len(tokens), spec, results[spec][-1], flush=True)
    report = {
        "questions": len(nq),
        "k": args.k,
        "max_new_tokens": args.max_new_tokens,
        "attentions": [
            {
                "attention": spec,
                "answers_equal": sum(r["equal"] for r in rows),
                "agreement": statistics.fmean(r["agreement"] for r in rows),
                "kl_mean": statistics.fmean(r["kl"] for r in rows),
            }
            for spec, rows in results.items()
        ],
    }
    print(report["attentions"])
    harness.write_json(args.out, report, indent=1)


if __name__ == "__main__":
    main()
