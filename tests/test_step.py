"""The decode step: one layer loop for lone, batched and drafted tokens, whose numbers do not
depend on the rows beside it; models it does not serve keep their forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from kvboost_rag import KVBoostRAG
from kvboost_rag.eval.prompt import rag_prompt
from kvboost_rag.hf.attention import use_reuse_attention
from kvboost_rag.hf.cache import forward_last_logits, make_cache
from kvboost_rag.hf.int4_linear import quantize_linear_layers
from kvboost_rag.hf.step import DecodeStep, decode_step_logits, step_for, step_logits
from kvboost_rag.testing.engines import nq_examples

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
FAMILIES = [
    LlamaConfig(**SMALL),
    Qwen2Config(**SMALL),  # q/k/v biases
    MistralConfig(**SMALL, sliding_window=None),
]


def _tiny(tmp_path: Path, config: object, dtype: torch.dtype) -> torch.nn.Module:
    config.vocab_size = 1024  # type: ignore[attr-defined]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    return AutoModelForCausalLM.from_pretrained(tmp_path, dtype=dtype).eval()


def _prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(10, 1000, (length,), generator=torch.Generator().manual_seed(seed))


def _forward_and_steps(model: torch.nn.Module, steps: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits after a prefill and `steps` tokens (the same tokens both ways): each token through
    the model's forward, then through `decode_step_logits`."""
    prompt = _prompt(41, 0)
    answer = torch.randint(10, 1000, (steps,), generator=torch.Generator().manual_seed(1))
    results = []
    for step in (forward_last_logits, decode_step_logits):
        cache = make_cache()
        logits = [forward_last_logits(model, prompt, torch.arange(len(prompt)), cache)]
        for i in range(steps):
            logits.append(step(model, answer[i : i + 1], torch.tensor([len(prompt) + i]), cache))
        results.append(torch.stack(logits))
    return results[0], results[1]


def _alone_and_together(model: torch.nn.Module, lengths: list[int], steps: int = 6) -> tuple[list, list]:
    """Greedy tokens and logits of prompts of `lengths`, each stepped alone, then all as rows of one
    buffer (a row joining at each step, as requests arrive)."""
    step = step_for(model)
    assert isinstance(step, DecodeStep)
    caches, firsts = [], []
    for row, length in enumerate(lengths):
        cache = make_cache()
        firsts.append(forward_last_logits(model, _prompt(length, row), torch.arange(length), cache))
        caches.append(cache)
    dtype = caches[0].layers[0].keys.dtype

    def run(rows: list[int]) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
        kv = step.new_kv(dtype)
        tokens = [[int(firsts[r].argmax())] for r in rows]
        logits: list[list[torch.Tensor]] = [[] for _ in rows]
        for r in rows:
            kv.join(caches[r])
        for _ in range(steps):
            last = torch.tensor([[t[-1]] for t in tokens])
            positions = torch.tensor([lengths[r] + len(tokens[i]) - 1 for i, r in enumerate(rows)]).view(-1, 1)
            out = step_logits(step, last, positions, kv)[:, 0]
            for i, row_logits in enumerate(out):
                logits[i].append(row_logits)
                tokens[i].append(int(row_logits.argmax()))
        return tokens, logits

    alone = [run([r]) for r in range(len(lengths))]
    together = run(list(range(len(lengths))))
    return [a[0][0] for a in alone] + [a[1][0] for a in alone], list(together[0]) + list(together[1])


def _assert_rows_are_their_own(model: torch.nn.Module, lengths: list[int]) -> None:
    alone, together = _alone_and_together(model, lengths)
    rows = len(lengths)
    assert together[:rows] == alone[:rows], "greedy tokens alone and batched"
    for got, expected in zip(together[rows:], alone[rows:]):
        assert all(torch.equal(g, e) for g, e in zip(got, expected)), "logits alone and batched, to the bit"


def test_default_model_steps_agree_with_its_forward(engine: KVBoostRAG) -> None:
    assert step_for(engine.model) is not None
    expected, got = _forward_and_steps(engine.model)
    torch.testing.assert_close(got, expected, atol=2e-3, rtol=0)  # a summation order apart
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize("adapted", [False, True], ids=["sdpa", "engine attention"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", FAMILIES, ids=["llama", "qwen2", "mistral"])
def test_llama_shaped_models_step_their_forward_and_rows_alone_or_together(
    tmp_path: Path, config: object, dtype: torch.dtype, adapted: bool
) -> None:
    model = _tiny(tmp_path, config, dtype)
    if adapted:
        use_reuse_attention(model)
    assert step_for(model) is not None
    expected, got = _forward_and_steps(model)
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got, expected, atol=tolerance, rtol=0)
    # rows of lengths that fill a width block or not, one past the longest's block
    _assert_rows_are_their_own(model, [41, 64, 63, 130, 5])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_long_row_and_short_ones_keep_their_numbers(tmp_path: Path, dtype: torch.dtype) -> None:
    """A row of thousands of tokens among short ones (the width is the long row's for all)."""
    model = _tiny(tmp_path, LlamaConfig(**SMALL), dtype)
    _assert_rows_are_their_own(model, [2100, 300, 2047, 64, 4001])


def test_default_int4_model_fuses_its_projections_and_keeps_each_rows_numbers() -> None:
    int4 = KVBoostRAG.from_pretrained(dtype="float32", store="memory")  # the default: the GGUF's int4 blocks
    step = step_for(int4.model)
    assert step is not None and all(layer.qkv_proj is not None and layer.gate_up_proj for layer in step.layers)
    expected, got = _forward_and_steps(int4.model)
    # the int4 products round their inputs to bf16: a last-bit difference in attention can round
    # an input the other way (a lost row's K/V would move the logits by whole units)
    torch.testing.assert_close(got, expected, atol=0.5, rtol=0)
    _assert_rows_are_their_own(int4.model, [300, 41, 129, 64, 700, 90, 257, 12, 511])  # two int4 parts and one more


def test_int4_layers_keep_each_rows_numbers(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    quantize_linear_layers(model)
    _assert_rows_are_their_own(model, [41, 7, 90, 64, 65])


def test_other_models_keep_their_forward(tmp_path: Path) -> None:
    model = _tiny(tmp_path, Qwen3Config(**SMALL, head_dim=16), torch.float32)  # q/k norms: not the Llama pattern
    assert step_for(model) is None
    expected, got = _forward_and_steps(model)
    assert torch.equal(got, expected)


def test_an_answer_recomputed_at_once_is_its_steps_on_every_model(tmp_path: Path) -> None:
    """`decode_step_logits` over several tokens (an exact recompute of an answer) gives the logits
    of one step a token: the decode step's, or the forward's on a model without one."""
    for config in (Qwen3Config(**SMALL, head_dim=16), LlamaConfig(**SMALL)):
        model = _tiny(tmp_path / config.model_type, config, torch.float32)
        prompt, answer = _prompt(41, 0), _prompt(4, 1)
        results = []
        for at_once in (True, False):
            cache = make_cache()
            forward_last_logits(model, prompt, torch.arange(41), cache)
            positions = torch.arange(41, 45)
            if at_once:
                results.append(decode_step_logits(model, answer, positions, cache))
            else:
                for i in range(4):
                    logits = decode_step_logits(model, answer[i : i + 1], positions[i : i + 1], cache)
                results.append(logits)
        assert torch.equal(results[0], results[1]), config.model_type


def test_a_hooked_layer_still_sees_every_step(tiny_model_dir: Path) -> None:
    """Layers are called without `nn.Module.__call__` only where no hook would run around them."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    seen: list[int] = []
    model.model.layers[1].mlp.down_proj.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[1]))
    _forward_and_steps(model, steps=3)
    # the prefill and three steps by the forward; then the prefill, and three steps of one token
    # (an fp32 product runs in parts of four rows: the three padding rows ride along)
    assert seen == [41, 1, 1, 1, 41, 1, 1, 1]


def test_greedy_answers_are_the_same_alone_and_among_others(passages: list[str]) -> None:
    """The default engine of this host (bf16 or fp32 by its CPU, int4 weights): NQ prompts of five
    warmed documents, each answered alone, then all at once, 8 decoding together."""
    engine = KVBoostRAG.from_pretrained(store="memory")
    examples = nq_examples(16)
    documents = [
        [passages[(i + j) % len(passages)] for j in range(4)] + [e.passages[0].as_document()]
        for i, e in enumerate(examples)
    ]
    for docs in documents:
        engine.warm(docs)
    prompts = [rag_prompt(e.question, docs) for e, docs in zip(examples, documents)]
    options = dict(max_new_tokens=24, ignore_eos=True, store_prompt=False)
    alone = [engine.generate(prompt, **options).token_ids for prompt in prompts]
    together = [r.token_ids for r in engine.generate_batch(prompts, **options)]
    assert together == alone
