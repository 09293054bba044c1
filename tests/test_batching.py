"""Continuous batching: concurrent requests decode in one forward pass a step and answer as alone."""

from __future__ import annotations

import gc
import threading
from collections import Counter

import pytest
import torch

from kvboost_rag import EngineConfig, KVBoostRAG
from kvboost_rag.hf.batch_kv import WIDTH_BLOCK, BatchKV
from kvboost_rag.hf.cache import forward_last_logits, make_cache
from kvboost_rag.hf.graph_step import GraphedSteps
from kvboost_rag.hf.step import step_for, step_logits
from kvboost_rag.testing.engines import on_empty_store


@pytest.fixture()
def batch_engine(engine: KVBoostRAG) -> KVBoostRAG:
    """The session's model with an empty store and a batcher of its own (its step sizes counted)."""
    return KVBoostRAG(engine.model, engine.tokenizer, EngineConfig(store="memory"), name=engine.name)


def step_sizes(engine: KVBoostRAG) -> Counter[int]:
    sizes: Counter[int] = Counter()
    engine.batcher.listeners.append(lambda rows, _: sizes.update([rows]))
    return sizes


def prompts_for(passages: list[str]) -> list[str]:
    return [f"{passages[i]}\n\nQuestion: what is this passage about?\nAnswer:" for i in range(6)]


def test_concurrent_requests_step_together_and_answer_as_alone(batch_engine: KVBoostRAG, passages: list[str]) -> None:
    batch_engine.warm(passages[:6])
    prompts = prompts_for(passages)
    # per-request settings stay per request: lengths, a stop string, a seeded sampled answer
    options = [dict(max_new_tokens=12 + 3 * i, store_prompt=False) for i in range(6)]
    options[2]["stop"] = ["."]
    options[4].update(temperature=0.8, top_p=0.9, seed=7)
    alone = [batch_engine.generate(p, **o) for p, o in zip(prompts, options)]
    sizes = step_sizes(batch_engine)
    together: list = [None] * 6
    start = threading.Barrier(6)

    def answer(i: int) -> None:
        start.wait()
        together[i] = batch_engine.generate(prompts[i], **options[i])

    threads = [threading.Thread(target=answer, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert max(sizes) >= 3, sizes  # steps ran several requests in one pass
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert [r.finish_reason for r in together] == [r.finish_reason for r in alone]
    assert batch_engine.batcher.running == 0


def test_generate_batch_answers_in_order_and_checks_every_prompt_first(
    batch_engine: KVBoostRAG, passages: list[str]
) -> None:
    prompts = prompts_for(passages)[:4]
    alone = [batch_engine.generate(p, max_new_tokens=8, store_prompt=False).token_ids for p in prompts]
    sizes = step_sizes(batch_engine)
    results = batch_engine.generate_batch(prompts, max_new_tokens=8, store_prompt=False)
    assert [r.token_ids for r in results] == alone and max(sizes) >= 2
    stepped = sum(sizes.values())
    with pytest.raises(TypeError):
        batch_engine.generate_batch([prompts[0], 42], max_new_tokens=8)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="max_running"):  # the engine's option, not a call's
        batch_engine.generate_batch(prompts, max_running=2)
    assert sum(sizes.values()) == stepped  # no model work for a batch with a bad prompt


def test_a_closed_stream_leaves_the_batch_at_once(batch_engine: KVBoostRAG, passages: list[str]) -> None:
    prompts = prompts_for(passages)[:3]
    alone = [batch_engine.generate(p, max_new_tokens=24, ignore_eos=True, store_prompt=False).text for p in prompts]
    batcher = batch_engine.batcher
    streams = [batch_engine.stream(p, max_new_tokens=24, ignore_eos=True, store_prompt=False) for p in prompts]
    texts: list[str] = [""] * 3
    running_after_close: list[int] = []
    start = threading.Barrier(3)

    def read(i: int) -> None:
        start.wait()
        for count, delta in enumerate(streams[i]):
            texts[i] += delta
            if i == 0 and count == 3:
                streams[i].close()
                running_after_close.append(batcher.running)
                return

    threads = [threading.Thread(target=read, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert running_after_close and running_after_close[0] <= 2  # its row was freed by the close itself
    assert texts[1:] == alone[1:] and alone[0].startswith(texts[0]) and texts[0]
    assert batcher.running == 0


def test_batch_kv_rows_join_grow_and_leave_into_their_own_caches() -> None:
    torch.manual_seed(0)
    layers, heads, dim = 2, 3, 4
    lengths = (5, 9, 7)
    caches = [make_cache(torch.randn(layers, heads, n, dim), torch.randn(layers, heads, n, dim)) for n in lengths]
    originals = [cache.layers[1].keys.clone() for cache in caches]
    kv = BatchKV(layers, heads, dim, torch.float32, torch.device("cpu"))
    assert [kv.join(cache) for cache in caches] == [0, 1, 2]
    slots = kv.reserve_step()
    assert slots.tolist() == list(lengths) and kv.capacity % WIDTH_BLOCK == 0
    new_keys = torch.randn(3, heads, 1, dim)
    for layer in range(layers):
        kv.append(layer, new_keys, new_keys + 1, slots.view(3, 1))
    kv.advance()
    assert kv.leave(0, caches[0]) == 2  # the last row moved into the freed one
    assert kv.lengths == [8, 10]
    assert torch.equal(kv.keys[1, 0, :, :8], torch.cat([originals[2], new_keys[2:3]], dim=2)[0])
    held = caches[0].layers[1]
    assert held.keys.shape[-2] == 6
    assert torch.equal(held.keys[0, :, :5], originals[0][0]) and torch.equal(held.keys[0, :, 5], new_keys[0, :, 0])
    assert torch.equal(held.values[0, :, 5], new_keys[0, :, 0] + 1)
    assert kv.leave(1, None) is None and kv.rows == 1  # a dropped cache gets nothing back
    assert caches[1].layers[0].keys.shape[-2] == 9


def test_steps_over_the_whole_buffer_answer_as_over_the_longest_row(engine: KVBoostRAG, passages: list[str]) -> None:
    """The shapes a CUDA graph keeps (attention over the buffer's capacity, the slots past each
    row masked) give the rows the eager step's tokens; off a GPU the graphed steps are that
    whole-buffer step, and say why they replay nothing."""
    step = step_for(engine.model)
    assert step is not None
    prompts = [engine.tokenizer(passages[i], add_special_tokens=False).input_ids[: 40 + 9 * i] for i in range(3)]
    runs = []
    for whole in (False, True, None):
        kv = step.new_kv(torch.float32)
        tokens = []
        for ids in prompts:
            cache = make_cache()
            logits = forward_last_logits(engine.model, torch.tensor(ids), torch.arange(len(ids)), cache)
            tokens.append([int(logits.argmax())])
            kv.join(cache)
        graphed = GraphedSteps(step)
        rows = []
        for _ in range(6):
            last = torch.tensor([[t[-1]] for t in tokens])
            positions = torch.tensor(kv.lengths).view(-1, 1)
            if whole is None:
                logits = step_logits(step, last, positions, kv, whole=True, forward=graphed)[:, 0]
            else:
                logits = step_logits(step, last, positions, kv, whole=whole)[:, 0]
            rows.append(logits)
            for row, t in enumerate(tokens):
                t.append(int(logits[row].argmax()))
        assert kv.capacity > max(kv.lengths)  # the whole buffer had masked slots to attend past
        runs.append((tokens, torch.stack(rows)))
    (longest, longest_logits), (whole, whole_logits), (graphed_tokens, graphed_logits) = runs
    assert whole == longest and graphed_tokens == longest
    assert torch.equal(whole_logits, longest_logits)  # the step's numbers do not depend on the width
    assert torch.equal(graphed_logits, whole_logits)
    assert not graphed.enabled and "not on a CUDA GPU" in graphed.why_not


def test_answers_kept_after_batched_decoding_hold_the_sequential_kv(engine: KVBoostRAG, passages: list[str]) -> None:
    """A turn decoded in a batch keeps the KV for the next turn that one decoded alone keeps: the
    rows' K/V went back to each request's own cache."""
    chats = [[{"role": "user", "content": f"{passages[i]}\n\nWhat is this about?"}] for i in (10, 11, 12)]

    def follow_up(chat: list, answer: str) -> list:
        return [*chat, {"role": "assistant", "content": answer}, {"role": "user", "content": "Say more."}]

    alone = KVBoostRAG(engine.model, engine.tokenizer, EngineConfig(store="memory"), name=engine.name)
    answers = [alone.generate(chat, max_new_tokens=12).text for chat in chats]
    expected = [alone.next_token_logits(follow_up(c, a))[0] for c, a in zip(chats, answers)]
    batched = KVBoostRAG(engine.model, engine.tokenizer, EngineConfig(store="memory"), name=engine.name)
    sizes = step_sizes(batched)
    results = batched.generate_batch(chats, max_new_tokens=12)
    assert [r.text for r in results] == answers and max(sizes) == 3
    for chat, answer, logits in zip(chats, answers, expected):
        got, plan = batched.next_token_logits(follow_up(chat, answer))
        assert plan.tokens("exact") > 0  # the kept turn is found
        # the same K/V to the bit: a row's K/V lost or taken from another row would move the logits
        assert torch.equal(got, logits)


def test_a_stream_dropped_unfinished_leaves_the_batch(batch_engine: KVBoostRAG, passages: list[str]) -> None:
    prompt = prompts_for(passages)[0]
    for _ in batch_engine.stream(prompt, max_new_tokens=500, ignore_eos=True, store_prompt=False):
        break  # the stream is dropped here, unfinished
    gc.collect()
    assert batch_engine.generate("Say hi.", max_new_tokens=2, store_prompt=False).new_tokens == 2
    assert batch_engine.batcher.running == 0 and not batch_engine.batcher.busy()


def test_a_failed_step_ends_its_requests_with_the_error_and_the_batch_goes_on(
    batch_engine: KVBoostRAG, passages: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvboost_rag.engine.batching as batching

    prompts = prompts_for(passages)[:2]
    expected = [batch_engine.generate(p, max_new_tokens=4, ignore_eos=True, store_prompt=False).text for p in prompts]

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the device went away")

    with monkeypatch.context() as patched:
        patched.setattr(batching, "step_logits", broken)
        with pytest.raises(RuntimeError, match="device went away"):
            batch_engine.generate_batch(prompts, max_new_tokens=4, ignore_eos=True, store_prompt=False)
    assert batch_engine.batcher.running == 0
    again = batch_engine.generate_batch(prompts, max_new_tokens=4, ignore_eos=True, store_prompt=False)
    assert [r.text for r in again] == expected


def test_the_batch_holds_max_running_and_later_requests_wait_their_turn(
    engine: KVBoostRAG, passages: list[str]
) -> None:
    """Threads are not rows: 6 callers at once on an engine of `max_running=2` step at most 2
    together, the others wait in arrival order, and every answer is its answer alone."""
    bounded = on_empty_store(engine, EngineConfig(store="memory", max_running=2))
    prompts = prompts_for(passages)
    options = dict(max_new_tokens=6, ignore_eos=True, store_prompt=False)
    alone = [bounded.generate(p, **options).token_ids for p in prompts]
    sizes = step_sizes(bounded)
    states: list[dict[str, int]] = []  # at each step: its rows, and how many requests wait and decode
    bounded.batcher.listeners.append(lambda rows, _: states.append({**bounded.batcher.states(), "rows": rows}))
    together: list = [None] * len(prompts)
    start = threading.Barrier(len(prompts))

    def answer(i: int) -> None:
        start.wait()
        together[i] = bounded.generate(prompts[i], **options).token_ids

    threads = [threading.Thread(target=answer, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert max(sizes) == 2 and max(s["waiting"] for s in states) >= 1, (sizes, states)
    assert all(s["decoding"] == s["rows"] for s in states), states  # every decoding request steps each turn
    assert together == alone
    sizes.clear()
    states.clear()
    batched = bounded.generate_batch(prompts, **options)  # one thread: the same bound, the same queue
    assert max(sizes) == 2 and max(s["waiting"] for s in states) >= 1, (sizes, states)
    assert max(s["decoding"] for s in states) == 2 and states[-1]["waiting"] == 0
    assert [r.token_ids for r in batched] == alone
    with pytest.raises(ValueError, match="max_running"):
        EngineConfig(max_running=0)
