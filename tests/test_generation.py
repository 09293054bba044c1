"""Sampling, stop strings, streaming, chat prompts, result fields and input errors."""

from __future__ import annotations

import time

import pytest

from kvboost_rag import KVBoostRAG, PromptTooLongError
from kvboost_rag.engine.detokenize import Detokenizer

CHAT = [{"role": "user", "content": "Name three colours of the rainbow."}]
# The default model goes on in characters of two and three tokens each (and ends inside one at
# 40 tokens): the answer's text is made of multi-token characters.
MULTI_BYTE = "東京は日本の首都です。大阪は日本の"


def test_greedy_is_deterministic_and_result_is_complete(engine: KVBoostRAG) -> None:
    first = engine.generate(CHAT, max_new_tokens=12, mode="full")
    second = engine.generate(CHAT, max_new_tokens=12, mode="full")
    assert first.text == second.text and first.text.strip()
    assert 0 < first.ttft_s <= first.total_s
    assert first.new_tokens == len(first.token_ids) <= 12
    assert first.prompt_tokens == first.computed_tokens
    assert first.timings.prefill_s > 0
    assert first.finish_reason in {"eos", "length"}
    assert first.tokens_per_s > 0 or first.new_tokens <= 1


def test_seeded_sampling_repeats_and_seeds_differ(engine: KVBoostRAG) -> None:
    options = dict(max_new_tokens=16, temperature=1.0, top_p=0.95, top_k=50, mode="full")
    a = engine.generate(CHAT, seed=1, **options)
    b = engine.generate(CHAT, seed=1, **options)
    assert a.token_ids == b.token_ids
    others = {tuple(engine.generate(CHAT, seed=s, **options).token_ids) for s in (2, 3, 4)}
    assert len(others | {tuple(a.token_ids)}) > 1


def test_top_k_one_is_greedy(engine: KVBoostRAG) -> None:
    greedy = engine.generate(CHAT, max_new_tokens=8, mode="full")
    sampled = engine.generate(CHAT, max_new_tokens=8, temperature=0.7, top_k=1, seed=5, mode="full")
    assert sampled.token_ids == greedy.token_ids


def test_stop_string_truncates(engine: KVBoostRAG) -> None:
    base = engine.generate(CHAT, max_new_tokens=24, mode="full")
    words = base.text.split()
    assert len(words) >= 3
    stop = words[2]
    cut = engine.generate(CHAT, max_new_tokens=24, mode="full", stop=[stop])
    assert cut.finish_reason == "stop"
    assert stop not in cut.text and base.text.startswith(cut.text)
    assert cut.text == base.text[: base.text.index(stop)]


def test_stream_yields_tokens_as_they_come(engine: KVBoostRAG) -> None:
    stream = engine.stream(CHAT, max_new_tokens=20, mode="full")
    arrivals, pieces = [], []
    for piece in stream:
        arrivals.append(time.perf_counter())
        pieces.append(piece)
    result = stream.result
    assert result is not None and "".join(pieces) == result.text
    assert len(pieces) >= min(5, result.new_tokens - 1)
    assert arrivals[-1] - arrivals[0] > 0.5 * (result.total_s - result.ttft_s) * (len(pieces) - 1) / result.new_tokens


def test_stream_with_stop_never_leaks_the_stop_string(engine: KVBoostRAG) -> None:
    base = engine.generate(CHAT, max_new_tokens=24, mode="full")
    stop = base.text.split()[2][:3]
    stream = engine.stream(CHAT, max_new_tokens=24, mode="full", stop=stop)
    streamed = "".join(stream)
    assert stop not in streamed and streamed == stream.result.text


def test_streamed_text_is_the_whole_decode_with_multi_byte_characters(
    engine: KVBoostRAG, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step decodes a few tokens, not the whole answer again, and the deltas joined are the
    whole answer decoded at once; a character split across tokens is streamed whole."""
    decode, windows = engine.tokenizer.decode, []

    def counting(ids: list[int], *args: object, **kwargs: object) -> str:
        windows.append(len(ids))
        return decode(ids, *args, **kwargs)

    monkeypatch.setattr(engine.tokenizer, "decode", counting)
    stream = engine.stream(MULTI_BYTE, max_new_tokens=40, ignore_eos=True, mode="full")
    pieces = list(stream)
    result = stream.result
    assert result is not None and result.new_tokens == 40
    assert sum("\ufffd" in decode([token]) for token in result.token_ids) > 10, "characters split across tokens"
    assert "".join(pieces) == result.text == decode(result.token_ids, skip_special_tokens=True)
    assert "\ufffd" not in "".join(pieces[:-1]), "only the last delta may end inside a character (cut by the limit)"
    assert len(windows) <= 2 * result.new_tokens and max(windows) <= 8, "a step's decode does not grow with the answer"


def test_a_multi_byte_stop_string_never_leaks(engine: KVBoostRAG) -> None:
    """A stop string's first character is held back while the next one is incomplete: the
    stream never shows a part of the stop that the result then cuts."""
    base = engine.generate(MULTI_BYTE, max_new_tokens=24, mode="full")
    stop = base.text[2:4]
    assert len(stop.encode()) > len(stop) and "\ufffd" not in stop and base.text.index(stop) > 0
    stream = engine.stream(MULTI_BYTE, max_new_tokens=24, mode="full", stop=stop)
    streamed = "".join(stream)
    assert stream.result is not None and stream.result.finish_reason == "stop"
    assert streamed == stream.result.text == base.text[: base.text.index(stop)]


def test_the_detokenizer_gives_the_whole_decode_at_every_step(engine: KVBoostRAG) -> None:
    tokenizer = engine.tokenizer
    ids = tokenizer("Grüße 👋 日本語 — naïve café ✓, it's  fine.\n\n" * 3, add_special_tokens=False).input_ids
    detokenizer = Detokenizer(tokenizer)
    for end in range(1, len(ids) + 1):
        assert detokenizer.add(ids[:end]) == tokenizer.decode(ids[:end], skip_special_tokens=True)


def test_length_limit(engine: KVBoostRAG) -> None:
    result = engine.generate("Count: one, two, three,", max_new_tokens=3, mode="full")
    assert result.new_tokens <= 3 and (result.finish_reason == "length" or result.new_tokens < 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"stop": [""]}, "stop"),
        ({"mode": "fast"}, "mode"),
    ],
)
def test_invalid_settings_are_refused(engine: KVBoostRAG, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        engine.stream(CHAT, **kwargs)


@pytest.mark.parametrize("prompt", ["", "   ", [], [{"content": "no role"}]])
def test_empty_or_malformed_prompt_is_refused(engine: KVBoostRAG, prompt: object) -> None:
    with pytest.raises(ValueError, match="prompt"):
        engine.generate(prompt)  # type: ignore[arg-type]


def test_prompt_over_the_context_window_is_refused(engine: KVBoostRAG) -> None:
    with pytest.raises(PromptTooLongError, match="context window"):
        engine.generate("word " * (engine.max_context + 10))


def test_bad_documents_are_refused_before_any_work(fresh_engine: KVBoostRAG) -> None:
    with pytest.raises(ValueError, match="document 1 is empty"):
        fresh_engine.warm(["fine text", ""])
    with pytest.raises(TypeError, match="document 0"):
        fresh_engine.warm([b"bytes"])  # type: ignore[list-item]
    assert fresh_engine.store.stats().entries == 0, "nothing half-warmed"


def test_timeout_ends_decoding(engine: KVBoostRAG) -> None:
    result = engine.generate(CHAT, max_new_tokens=64, mode="full", timeout_s=1e-6)
    assert result.finish_reason == "timeout" and result.new_tokens == 1
    with pytest.raises(ValueError, match="timeout_s"):
        engine.stream(CHAT, timeout_s=0)


def test_min_p_and_repetition_penalty_are_keywords_of_generate_as_of_sampling_params(engine: KVBoostRAG) -> None:
    from kvboost_rag import SamplingParams

    prompt = "List the days of the week: Monday, Tuesday,"
    by_keyword = engine.generate(prompt, max_new_tokens=8, min_p=0.1, repetition_penalty=1.5, store_prompt=False)
    params = SamplingParams(max_new_tokens=8, min_p=0.1, repetition_penalty=1.5)
    assert by_keyword.token_ids == engine.generate(prompt, sampling=params, store_prompt=False).token_ids
    with pytest.raises(ValueError, match="min_p"):
        engine.generate(prompt, min_p=2.0)
    with pytest.raises(TypeError, match="not both"):
        engine.generate(prompt, sampling=params, repetition_penalty=1.2)
