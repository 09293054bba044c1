"""Concurrent calls on one engine give the outputs of sequential calls."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from kvboost_rag import KVBoostRAG


def test_concurrent_generate_equals_sequential(fresh_engine: KVBoostRAG, passages: list[str]) -> None:
    fresh_engine.warm(passages[:8])
    prompts = [
        [{"role": "user", "content": f"{passages[i]}\n\n{passages[i + 1]}\n\nSummarize in five words."}]
        for i in range(0, 8, 2)
    ] + ["Say hello.", "List two fruits."]
    sequential = [fresh_engine.generate(p, max_new_tokens=10, store_prompt=False).text for p in prompts]
    with ThreadPoolExecutor(max_workers=4) as pool:
        concurrent = list(
            pool.map(lambda p: fresh_engine.generate(p, max_new_tokens=10, store_prompt=False).text, prompts)
        )
    assert concurrent == sequential


def test_concurrent_streams_and_warms_interleave_safely(fresh_engine: KVBoostRAG, passages: list[str]) -> None:
    prompt = f"{passages[20]}\n\nWhat is this passage about?"
    expected = fresh_engine.generate(prompt, max_new_tokens=8, mode="full").text

    def stream_one(_: int) -> str:
        return "".join(fresh_engine.stream(prompt, max_new_tokens=8, mode="full"))

    with ThreadPoolExecutor(max_workers=4) as pool:
        warms = [pool.submit(fresh_engine.warm, passages[21:30]) for _ in range(2)]
        texts = list(pool.map(stream_one, range(4)))
        reports = [w.result() for w in warms]
    assert texts == [expected] * 4
    assert sum(r.documents for r in reports) == 18
    again = fresh_engine.warm(passages[21:30])
    assert again.skipped_documents == 9 and again.tokens_encoded == 0
