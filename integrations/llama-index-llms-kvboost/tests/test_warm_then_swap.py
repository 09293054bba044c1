"""The deployment flow: `kvboost-rag warm` fills a store (a directory and a shared Redis) in
another process, then an LLM built from options alone finds it, with the passages in another
order in its prompt."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llama_index.llms.kvboost import KVBoostLLM

from kvboost_rag.eval.prompt import rag_prompt
from kvboost_rag.testing.engines import nq_examples
from kvboost_rag.testing.redis_server import local_redis_or_skip

BOUNDARY_TOKENS = 4  # per passage: where its first and last tokens merge with the text around it


def test_a_store_on_disk_and_redis_warmed_by_the_cli_serves_a_fresh_llm(
    tmp_path: Path, warm_with_cli: Callable[..., str]
) -> None:
    passages = [example.passages[0].as_document() for example in nq_examples(3)]
    with local_redis_or_skip() as server:
        # memory, then the directory, then Redis: the directory is new to the LLM's process, so
        # a second reader on another host would find the same corpus in Redis alone
        store = warm_with_cli(passages, tmp_path, f"{tmp_path / 'store'},{server.url}")
        assert server.client().dbsize() > 0

        llm = KVBoostLLM(store=store, dtype="float32", max_tokens=4)  # options only: no engine=
        prompt = rag_prompt("Which is oldest?", passages[::-1], chat=False)
        raw = llm.complete(prompt).raw
        assert [type(tier).__name__ for tier in llm.get_engine().store.tiers] == ["DiskStore", "RedisStore"]

    tokenizer = llm.get_engine().tokenizer
    passage_tokens = sum(len(tokenizer(p, add_special_tokens=False).input_ids) for p in passages)
    slack = BOUNDARY_TOKENS * len(passages)
    usage = raw["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= passage_tokens - slack
    assert raw["reused_approximate_tokens"] >= passage_tokens - slack  # moved: found where they landed
    assert raw["computed_tokens"] <= usage["prompt_tokens"] - passage_tokens + slack  # only the rest computed
