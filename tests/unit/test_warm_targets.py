"""What warming entry points take: an engine, a model holding one, or None (the default engine);
anything else is a TypeError before any work, never a warning per document and nothing warmed."""

from __future__ import annotations

import warnings

import pytest

import kvboost_rag.frameworks.warming as warming
from kvboost_rag.frameworks.warming import check_warm_target, engine_of, warm_quietly
from kvboost_rag.testing.fakes import CountingEngine


class Holder:
    """A framework model: gives its engine on request, as ChatKVBoost and KVBoostLLM do."""

    def __init__(self, engine: object) -> None:
        self.engine = engine

    def get_engine(self) -> object:
        return self.engine


def test_an_engine_or_a_model_holding_one_warms() -> None:
    engine = CountingEngine()
    assert engine_of(engine) is engine and engine_of(Holder(engine)) is engine
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = warm_quietly(Holder(engine), ["a document", "another"])
    assert report.documents == 2 and engine.warmed == ["a document", "another"]


def test_nothing_is_the_default_engine_loaded_only_where_there_is_something_to_warm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    default = CountingEngine()
    loads: list[int] = []
    monkeypatch.setattr(warming, "default_engine", lambda: loads.append(1) or default)
    assert warm_quietly(None, ["", "  "]).documents == 0 and loads == [], "nothing to warm: nothing loaded"
    assert warm_quietly(None, ["a document"]).documents == 1 and default.warmed == ["a document"]


@pytest.mark.parametrize("wrong", ["engine", 3, object(), Holder, [CountingEngine()]])
def test_anything_else_is_a_type_error(wrong: object) -> None:
    with pytest.raises(TypeError, match="needs a KVBoostRAG engine, a model that holds one"):
        check_warm_target(wrong, "warming")
    with pytest.raises(TypeError):
        warm_quietly(wrong, ["a document"])  # type: ignore[arg-type]


def test_a_holder_that_gives_no_engine_and_texts_that_are_not_text_are_type_errors() -> None:
    with pytest.raises(TypeError, match="gave str, not a KVBoostRAG"):
        engine_of(Holder("not an engine"))
    engine = CountingEngine()
    with pytest.raises(TypeError, match="documents' text"):
        warm_quietly(engine, ["fine", b"bytes"])  # type: ignore[list-item]
    assert engine.warmed == [], "refused before any document was warmed"
