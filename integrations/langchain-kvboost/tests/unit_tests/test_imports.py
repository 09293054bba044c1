import langchain_kvboost

EXPECTED = ["ChatKVBoost", "KVBoostLLM", "KVBoostRetrievalWarmer", "warm_documents"]


def test_all_imports() -> None:
    assert sorted(langchain_kvboost.__all__) == sorted(EXPECTED)
    assert all(hasattr(langchain_kvboost, name) for name in EXPECTED)


def test_construction_loads_nothing() -> None:
    chat = langchain_kvboost.ChatKVBoost(model="/nowhere/model", max_tokens=5)
    assert chat._own_engine is None and chat.max_tokens == 5
