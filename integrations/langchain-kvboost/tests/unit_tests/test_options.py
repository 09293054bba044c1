"""The shared options as LangChain fields: same names as the LlamaIndex package, clear errors."""

from __future__ import annotations

import pytest
from langchain_kvboost import ChatKVBoost, KVBoostLLM

from kvboost_rag.config import engine_option_names
from kvboost_rag.frameworks.usage import finish_reason, sum_usage
from kvboost_rag.options import OPTION_NAMES, OPTIONS

CLASSES = [ChatKVBoost, KVBoostLLM]


@pytest.mark.parametrize("cls", CLASSES)
def test_every_shared_option_is_a_documented_field(cls: type) -> None:
    assert engine_option_names() <= OPTION_NAMES
    for option in OPTIONS:
        field = cls.model_fields[option.name]
        assert field.description == option.doc and "\n" not in option.doc
        assert field.default == option.default
    assert cls.model_fields["model"].alias == "model_name"
    assert cls(model_name="m").model == cls(model="m").model == "m"


@pytest.mark.parametrize("cls", CLASSES)
def test_langchains_standard_names_work_and_former_names_warn(cls: type, recwarn: pytest.WarningsRecorder) -> None:
    assert cls(timeout=5).timeout_s == cls(timeout_s=5).timeout_s == 5, "LangChain's standard `timeout`"
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]
    with pytest.warns(DeprecationWarning, match="'store_prompt_prefixes' is now 'store_prompt'"):
        assert cls(store_prompt_prefixes=False).store_prompt is False
    with pytest.raises(TypeError, match="former name"):
        cls(store_prompt_prefixes=False, store_prompt=True)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize(
    ("wrong", "meant"),
    [("max_new_tokens", "max_tokens"), ("cache_dir", "store"), ("quantization", "kv_quantization")],
)
def test_an_unknown_option_names_the_one_meant(cls: type, wrong: str, meant: str) -> None:
    with pytest.raises(TypeError, match=f"'{wrong}' \\(did you mean '{meant}'\\?\\)"):
        cls(**{wrong: 64})


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"max_tokens": 0}, "max_new_tokens must be an integer >= 1, got 0"),  # the engine's words
        ({"chunk_size": 0}, "chunk_size must be an integer >= 1"),
        ({"top_p": 0}, "top_p must be in"),
        ({"timeout_s": -1}, "timeout_s must be > 0"),
        ({"mode": "fastest"}, "mode"),  # the field's type: pydantic refuses it first
    ],
)
def test_bad_values_fail_at_construction_without_loading(cls: type, bad: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cls(model="/nowhere/model", **bad)


def test_engine_options_do_not_apply_to_a_shared_engine() -> None:
    from kvboost_rag import KVBoostRAG

    engine = object.__new__(KVBoostRAG)  # never used: construction is refused first
    with pytest.raises(ValueError, match="store"):
        ChatKVBoost(engine=engine, store="memory")


@pytest.mark.parametrize("cls", CLASSES)
def test_an_unknown_call_option_fails_before_loading(cls: type) -> None:
    model = cls(model="/nowhere/model")
    with pytest.raises(TypeError, match="'max_new_tokens' \\(did you mean 'max_tokens'\\?\\)"):
        model.invoke("Hello", max_new_tokens=3)
    assert model._own_engine is None


def usage(prompt: int, completion: int, cached: int) -> dict:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def test_finish_reasons_and_usage_are_openais() -> None:
    assert [finish_reason(r) for r in ("eos", "stop", "length", "timeout")] == ["stop", "stop", "length", "length"]
    assert sum_usage([usage(3, 1, 2), None, usage(5, 2, 0)]) == usage(8, 3, 2)
