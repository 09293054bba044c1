"""Shared fixtures: the embedded default model in fp32 with float weights, loaded once per test session
(int4 weights, the default on a CPU, have their own tests: tests/test_weights.py)."""

from __future__ import annotations

import pytest

from kvboost_rag import KVBoostRAG
from kvboost_rag.eval.data import load_qa
from kvboost_rag.testing.engines import on_empty_store


@pytest.fixture(scope="session")
def engine() -> KVBoostRAG:
    return KVBoostRAG.from_pretrained(dtype="float32", weights="float", store="memory")


@pytest.fixture()
def fresh_engine(engine: KVBoostRAG) -> KVBoostRAG:
    """The session's model with an empty store, so tests do not see each other's chunks."""
    return on_empty_store(engine)


@pytest.fixture(scope="session")
def passages() -> list[str]:
    """Real NQ gold passages, as 'title\\ntext'."""
    return [example.passages[0].as_document() for example in load_qa(limit=40)]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, engine: KVBoostRAG):
    """A small random Llama with the default tokenizer: fast enough for many processes."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    folder = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(
        vocab_size=len(engine.tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    engine.tokenizer.save_pretrained(folder)
    return folder
